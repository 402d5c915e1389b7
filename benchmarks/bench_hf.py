"""A model as Hugging Face ships it, ours against ``transformers`` and the PyTorch twin.

    python benchmarks/bench_hf.py                       # stock GPT-2 small, 1 and default threads
    python benchmarks/bench_hf.py --family llama        # a LLaMA with grouped-query attention
    python benchmarks/bench_hf.py --rounds 5 --threads 1

The model is a ``transformers`` folder made here, as the hub ships one but with random weights
(nothing is downloaded): ``GPT2Config()`` (12 layers of width 768, 1,024 positions, vocabulary
50,257, GPT-2's dropouts), or with ``--family llama`` a LLaMA of about the same size with
grouped-query attention (12 heads reading 4 kv heads), each with a byte-level BPE learned on
the embedded corpus. It is written once into ``--cache`` and reused.

Tasks, each in a worker process of its own (one implementation, one thread setting):

* ``generate``: greedy generation of 128 tokens after a 64-token prompt, with the key/value
  cache. Ours: ``export.load_hf`` then ``generate(..., greedy=True)``; transformers:
  ``AutoModelForCausalLM.generate(do_sample=False)``. Tokens per second of the 128 (the
  prompt's prefill included, as a user waits for it).
* ``products 1x128``: the matrix products of a ``step 1x128``'s linear maps alone, each
  layer's forward, input gradient and weight gradient (q, k, v, the output projection, the
  network's two) and the head's, at their own shapes (``bench.configs.products``), on random
  float32 arrays: ours through NumPy (its OpenBLAS), transformers' column through
  ``torch.matmul``; no twin. The floor that any step on that BLAS stands on.
* ``step 1x128``, ``step 4x256``: one forward and backward of the cross-entropy at batch x
  context, in training mode (GPT-2's dropouts on). Ours: ``model.loss_and_backward`` in
  ``model.replacing_grads()``, as a ``Trainer`` step runs it; transformers:
  ``model(ids, labels=...).loss.backward()``; twin: the PyTorch twin of our model
  (``torch_twins.to_torch``), ``F.cross_entropy`` then ``backward``; each torch step after
  ``zero_grad()``, whose default sets the gradients to None. Median seconds per step.

"threads" ``1``: ``numba.set_num_threads(1)`` and BLAS limited to one thread (threadpoolctl) for
ours, ``torch.set_num_threads(1)`` for torch; ``default``: what each library does when nothing
is set. The main process asks the workers in turn, round after round, so a burst of other load
hits each alike; the table gives medians, the ratio ours / transformers, and each worker's
peak resident memory (``ru_maxrss``: the weights, what the task allocated, the interpreter).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

TASKS = {"generate": None, "products 1x128": (1, 128), "step 1x128": (1, 128),
         "step 4x256": (4, 256)}
IMPLS = ("ours", "transformers", "twin")
PROMPT, NEW = 64, 128
FAMILIES = ("gpt2", "llama")


def make_folder(family: str, folder: Path) -> Path:
    """A stock-shaped ``transformers`` folder of ``family`` with random weights and a
    byte-level BPE learned on the embedded corpus (written once)."""
    if (folder / "model.safetensors").is_file():
        return folder
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from numpy_transformer.corpus import load_corpus

    torch.manual_seed(0)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = byte_level, decoders.ByteLevel()
    tok.train_from_iterator([load_corpus()], trainers.BpeTrainer(
        vocab_size=8000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"], show_progress=False))
    if family == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
            num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=1024,
            vocab_size=32000, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0))
    model.save_pretrained(folder)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(folder)
    return folder


# ------------------------------------------------------------------------------- workers
def _limit_threads(impl: str, threads: str) -> None:
    if threads == "default":
        return
    if impl == "ours":
        import numba
        from threadpoolctl import threadpool_limits

        numba.set_num_threads(int(threads))
        threadpool_limits(int(threads))
    else:
        import torch

        torch.set_num_threads(int(threads))


def _tokens(vocab: int, batch: int, length: int):
    import numpy as np

    return np.random.default_rng(0).integers(0, vocab, (batch, length + 1))


def _ours(folder: Path, task: str) -> list[float]:
    from numpy_transformer.export import load_hf
    from numpy_transformer.generate import generate

    model = load_hf(folder).model
    if task == "generate":
        prompt = _tokens(model.config.vocab, 1, PROMPT)[0, :PROMPT]
        generate(model, prompt[:8], 4, greedy=True)  # load or compile what it calls
        return [_timed(lambda: generate(model, prompt, NEW, greedy=True)) for _ in range(2)]
    batch, length = TASKS[task]
    ids = _tokens(model.config.vocab, batch, length)
    model.train()

    def step() -> None:  # the gradients replaced, as after torch's zero_grad(): no zeros
        with model.replacing_grads():  # written first (Module.replacing_grads)
            model.loss_and_backward(ids[:, :-1], targets=ids[:, 1:])

    step()
    return [_timed(step) for _ in range(3)]


def _torch(folder: Path, task: str, impl: str) -> list[float]:
    import torch
    import transformers

    if impl == "twin":
        from numpy_transformer.export import load_hf
        from numpy_transformer.torch_twins import to_torch

        model = to_torch(load_hf(folder).model)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    vocab = model.config.vocab_size if impl == "transformers" else model.config.vocab
    if task == "generate":
        if impl == "twin":
            return []  # the twin has no key/value cache: not a generation baseline
        model.eval()
        prompt = torch.from_numpy(_tokens(vocab, 1, PROMPT)[:, :PROMPT])
        kw = dict(do_sample=False, pad_token_id=0, max_new_tokens=NEW, min_new_tokens=NEW)
        with torch.no_grad():
            model.generate(prompt[:, :8], **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})
            return [_timed(lambda: model.generate(prompt, **kw)) for _ in range(2)]
    batch, length = TASKS[task]
    ids = torch.from_numpy(_tokens(vocab, batch, length))
    model.train()

    def step() -> None:
        model.zero_grad()
        if impl == "transformers":
            loss = model(ids[:, :-1], labels=ids[:, :-1]).loss  # shifts the labels itself
        else:
            logits = model(ids[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()

    step()
    return [_timed(step) for _ in range(3)]


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _products(folder: Path, task: str, impl: str) -> list[float]:
    """Seconds of the products of a step's linear maps (``bench.sgemm.linear_operands``: the
    three of each map, ``y = x W``, ``dx = dy W^T``, ``dW = x^T dy``, each layer's on arrays
    of its own, as a step reads each layer's weights afresh)."""
    from numpy_transformer.bench.sgemm import linear_operands

    hf = json.loads((folder / "config.json").read_text())
    width = hf.get("n_embd", hf.get("hidden_size"))
    batch, length = TASKS[task]
    config = dict(model=dict(
        width=width, heads=1, layers=hf.get("n_layer", hf.get("num_hidden_layers")),
        ffn_width=hf.get("n_inner") or hf.get("intermediate_size") or 4 * width,
        vocab=hf["vocab_size"]), batch=batch, context=length)
    pairs = linear_operands(config, "numpy" if impl == "ours" else "torch")

    def run() -> None:
        for a, b in pairs:
            a @ b

    run()
    return [_timed(run) for _ in range(3)]


def worker(folder: Path, impl: str, task: str, threads: str) -> None:
    """Run one task once and print ``{"seconds": [...], "peak_mb": ...}`` as JSON.

    Freed memory stays in the process for the next step, as the command line keeps it
    (``numpy_transformer/allocator.py``), for every framework alike: the setting is glibc's.
    """
    from numpy_transformer.allocator import reuse_freed_memory

    reuse_freed_memory()
    _limit_threads(impl, threads)
    if task.startswith("products"):
        seconds = _products(folder, task, impl)
    else:
        seconds = _ours(folder, task) if impl == "ours" else _torch(folder, task, impl)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB -> MiB (Linux)
    print(json.dumps({"seconds": seconds, "peak_mb": peak}))


# ------------------------------------------------------------------------------- the table
def ask(folder: Path, impl: str, task: str, threads: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    done = subprocess.run([sys.executable, __file__, "--worker", impl, task, threads,
                           "--folder", str(folder)], capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"{impl} {task} ({threads} threads) failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", choices=FAMILIES, default="gpt2")
    p.add_argument("--cache", type=Path, default=Path("/tmp/numpy_transformer_bench"),
                   help="where the model folder is written once [%(default)s]")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", nargs="+", default=["1", "default"])
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--worker", nargs=3, metavar=("IMPL", "TASK", "THREADS"),
                   help=argparse.SUPPRESS)
    p.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.folder, *args.worker)
        return
    folder = make_folder(args.family, args.cache / f"{args.family}-stock")
    from numpy_transformer.bench.machine import machine_lines

    print(*machine_lines(), sep="\n")
    print(f"{args.family} at {folder}; load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"{'task':<12}{'threads':>8}{'impl':>14}{'median':>10}{'per s':>10}{'ours/tf':>9}"
          f"{'peak MiB':>10}")
    for task in args.tasks:
        for threads in args.threads:
            results: dict[str, list] = {impl: [] for impl in IMPLS}
            peaks: dict[str, float] = {}
            for _ in range(args.rounds):
                for impl in IMPLS:
                    if impl == "twin" and not task.startswith("step"):
                        continue
                    r = ask(folder, impl, task, threads)
                    results[impl] += r["seconds"]
                    peaks[impl] = max(peaks.get(impl, 0.0), r["peak_mb"])
            tf = statistics.median(results["transformers"])
            for impl, secs in results.items():
                if not secs:
                    continue
                med = statistics.median(secs)
                rate = f"{NEW / med:.1f} tok" if task == "generate" else f"{1 / med:.2f}"
                ratio = tf / med if task == "generate" else med / tf
                print(f"{task:<12}{threads:>8}{impl:>14}{med:>9.3f}s{rate:>10}{ratio:>9.2f}"
                      f"{peaks[impl]:>10.0f}", flush=True)
    print(f"ours/tf: tokens per second ours / transformers for generate (>= 1: ours faster), "
          f"seconds ours / transformers for a step (<= 1: ours faster); load "
          f"{os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

"""One training step, ours against PyTorch eager: forward, cross-entropy, backward, clip, Adam.

Usage (from the repository root)::

    python benchmarks/bench_train_step.py                   # the chapter's char model
    python benchmarks/bench_train_step.py --config small    # 4-layer width-128 GELU decoder
    python benchmarks/bench_train_step.py --quick           # a few steps (the CLI's ``bench``)

Configurations (float32, Adam lr 1e-3, global-norm clipping at 1.0, constant learning rate):

* ``chapter``: the chapter's 132,488-parameter character model, ``TransformerConfig(vocab=104,
  width=84, heads=4, layers=2, ffn_width=168, max_len=100, activation="relu",
  embed_scale=True)``, sinusoidal positions, batch 64 x context 100.
* ``small``: 4 layers, width 128, 4 heads, FFN 512 with exact GELU, learned positions,
  vocab 104, batch 12 x context 64.

Variants, each in its own worker process (so thread pools and resident memory are not shared):

* ``ours numba``: ``Trainer.step`` with ``backend="numba"`` (fused kernels everywhere);
* ``ours numpy``: the same with ``backend="numpy"`` (the readable references), 1 thread only;
* ``torch sdpa``: the PyTorch twin of the same model (``numpy_transformer.torch_twins``), loaded
  with the same initial weights through ``interop.to_torch_state_dict``, trained by
  ``F.cross_entropy`` + ``backward`` + ``clip_grad_norm_`` + ``torch.optim.Adam``, with the
  twin's attention core swapped for ``F.scaled_dot_product_attention(is_causal=True)``, PyTorch's
  fused CPU kernel: what a PyTorch user would write, and the baseline of the ratios;
* ``torch twin``: the twin unchanged; its attention is written out (``softmax(q k^T) v`` with
  ``masked_fill``), as a reader's first PyTorch version would be.

"threads" means, for ours, ``numba.set_num_threads(n)`` and ``OPENBLAS_NUM_THREADS=n`` (set in
the worker's environment before NumPy loads; the ``numba, BLAS 1`` rows keep BLAS at one
thread); for torch, ``torch.set_num_threads(n)``. Every worker trains on the same batches
(random token ids from one seed) from the same initial weights; the table shows each
variant's first loss, which must agree across frameworks.

The main process asks the workers in turn for a few steps at a time (``--rounds`` rounds), so
a burst of load from other jobs hits every variant alike. A step is timed with
``time.perf_counter`` around the whole step; the table gives the median over all measured
steps after ``--warmup`` warm-up steps (which also load the compiled Numba kernels), and the
ratio ours / torch at the same thread count. Peak RSS is ``ru_maxrss`` of each worker.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONFIGS = {
    "chapter": dict(model=dict(vocab=104, width=84, heads=4, layers=2, ffn_width=168,
                               max_len=100, activation="relu", embed_scale=True),
                    batch=64, context=100),
    "small": dict(model=dict(vocab=104, width=128, heads=4, layers=4, ffn_width=512,
                             max_len=64, activation="gelu", positions="learned"),
                  batch=12, context=64),
}


# ---------------------------------------------------------------------------------------------
# Worker side: one variant; reads a number of steps per line on stdin, answers one JSON line
# ---------------------------------------------------------------------------------------------

def _batches(config: dict, count: int = 8):
    import numpy as np

    rng = np.random.default_rng(1234)
    shape = (config["batch"], config["context"])
    vocab = config["model"]["vocab"]
    return [(rng.integers(0, vocab, shape), rng.integers(0, vocab, shape)) for _ in range(count)]


def _ours_step(config: dict, backend: str, threads: int):
    import numba
    import numpy as np

    from numpy_transformer.allocator import reuse_freed_memory
    from numpy_transformer.nn import DecoderLM, TransformerConfig
    from numpy_transformer.optim import Adam
    from numpy_transformer.schedules import constant_lr
    from numpy_transformer.train import Batch, Trainer

    numba.set_num_threads(threads)
    reuse_freed_memory()  # as the command line does (numpy_transformer/allocator.py)
    model = DecoderLM(TransformerConfig(**config["model"], dtype="float32", backend=backend))
    trainer = Trainer(model, Adam(lr=1e-3, backend=backend), constant_lr(1e-3), clip=1.0)
    data = [Batch((np.asarray(x),), np.asarray(y)) for x, y in _batches(config)]

    def step(i: int) -> float:
        return trainer.step(data[i % len(data)]).loss

    return step


def _fused_sdpa(q, k, v, mask=None, bias=None, scale=None):
    """The twin's ``sdpa`` on PyTorch's fused kernel (causal self-attention, no bias here)."""
    import torch.nn.functional as F

    assert bias is None and scale is None
    t_q, t_k = q.shape[-2], k.shape[-2]
    if mask is not None and t_q == t_k and mask.shape[-2:] == (t_q, t_k) and bool(
            (mask == mask.new_ones(t_q, t_k).tril()).all()):  # the causal mask
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _torch_step(config: dict, threads: int, fused: bool):
    import numpy as np
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT))
    from numpy_transformer.nn import DecoderLM, TransformerConfig
    from numpy_transformer.torch_twins import modules as twin_modules
    from numpy_transformer.torch_twins import to_torch

    if fused:
        twin_modules.sdpa = _fused_sdpa  # MultiHeadAttention.forward looks it up at call time
    torch.set_num_threads(threads)
    ours = DecoderLM(TransformerConfig(**config["model"], dtype="float32"))
    model = to_torch(ours)  # same architecture, our initial weights (interop.to_torch_state_dict)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    vocab = config["model"]["vocab"]
    data = [(torch.from_numpy(np.asarray(x)), torch.from_numpy(np.asarray(y)))
            for x, y in _batches(config)]

    def step(i: int) -> float:
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    return step


def worker(variant: str, config_name: str, threads: int) -> None:
    config = CONFIGS[config_name]
    if variant.startswith("torch"):
        serve(_torch_step(config, threads, fused=variant == "torch-sdpa"))
    else:
        serve(_ours_step(config, variant, threads))


def serve(step) -> None:
    """Answer the main process: for each number n read on stdin, time n calls of ``step(i)``
    (which returns the step's loss) and print one JSON line; a negative n ends it."""
    import resource

    i, first_loss = 0, None
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        n = int(line)
        if n < 0:
            break
        times, losses = [], []
        for _ in range(n):
            start = time.perf_counter()
            losses.append(step(i))
            times.append(time.perf_counter() - start)
            i += 1
        first_loss = losses[0] if first_loss is None and losses else first_loss
        print(json.dumps({"times": times, "loss": losses[-1] if losses else None,
                          "first_loss": first_loss}), flush=True)
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(json.dumps({"maxrss_mib": rss_kib / 1024}), flush=True)


# ---------------------------------------------------------------------------------------------
# Main side
# ---------------------------------------------------------------------------------------------

class Worker:
    """A variant's process: ``run(n)`` times n steps there. The process is ``script`` (this
    file, or another benchmark that calls :func:`serve` in its ``--worker`` mode)."""

    def __init__(self, label: str, variant: str, config: str, threads: int, blas: int,
                 script: str = __file__) -> None:
        env = dict(os.environ)
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(blas)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        self.label, self.variant, self.threads, self.blas = label, variant, threads, blas
        self.proc = subprocess.Popen(
            [sys.executable, script, "--worker", variant, "--config", config,
             "--threads", str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        self.times: list[float] = []
        self.first_loss = self.last_loss = None

    def _ask(self, line: str) -> dict:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def wait_ready(self) -> None:
        json.loads(self.proc.stdout.readline())

    def run(self, n: int, keep: bool = True) -> None:
        answer = self._ask(str(n))
        if keep:
            self.times += answer["times"]
        self.first_loss, self.last_loss = answer["first_loss"], answer["loss"]

    def close(self) -> float:
        rss = self._ask("-1")["maxrss_mib"]
        self.proc.wait()
        return rss


def machine_info() -> str:
    import numba
    import numpy as np

    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = "not installed"
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    return (f"{platform.processor() or platform.machine()}, nproc {os.cpu_count()}, "
            f"Python {platform.python_version()}, NumPy {np.__version__}, Numba "
            f"{numba.__version__}, torch {torch_version}; load average at start "
            f"{', '.join(f'{x:.1f}' for x in load)}")


def run_in_turn(workers: list, warmup: int, steps: int, rounds: int) -> list[float]:
    """Warm every worker up, then ask them in turn for ``steps`` measured steps in ``rounds``
    rounds, so that load from elsewhere hits every variant alike; returns their peak RSS."""
    for w in workers:
        w.wait_ready()
    for w in workers:
        w.run(warmup, keep=False)
    per_round = [steps // rounds + (r < steps % rounds) for r in range(rounds)]
    for n in per_round:
        for w in workers:
            w.run(n)
    return [w.close() for w in workers]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="chapter")
    parser.add_argument("--steps", type=int, default=30, help="measured steps per variant")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5,
                        help="the steps are asked for in this many turns per variant")
    parser.add_argument("--threads", default="1,2", help="thread counts to measure")
    parser.add_argument("--no-numpy", action="store_true", help="skip the numpy backend")
    parser.add_argument("--quick", action="store_true", help="2 warm-up + 6 steps, 1 thread")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    if args.worker:
        worker(args.worker, args.config, threads[0])
        return
    if args.quick:
        args.steps, args.warmup, args.rounds, threads = 6, 2, 2, [1]

    variants = []  # (label, variant, threads, BLAS threads)
    for n in threads:
        variants.append((f"ours numba, {n} thr", "numba", n, n))
        if n > 1:
            variants.append((f"ours numba, {n} thr, BLAS 1", "numba", n, 1))
        variants.append((f"torch eager F.sdpa, {n} thr", "torch-sdpa", n, n))
        variants.append((f"torch eager twin, {n} thr", "torch", n, n))
    if not args.no_numpy:
        variants.append(("ours numpy, 1 thr", "numpy", 1, 1))

    print(machine_info(), flush=True)
    config = CONFIGS[args.config]
    print(f"config {args.config}: {config['model']}, batch {config['batch']} x context "
          f"{config['context']}; {args.warmup} warm-up + {args.steps} measured steps per "
          f"variant in {args.rounds} rounds", flush=True)
    workers = [Worker(label, v, args.config, n, blas) for label, v, n, blas in variants]
    rss = run_in_turn(workers, args.warmup, args.steps, args.rounds)

    import numpy as np

    medians = {w.label: float(np.median(w.times)) for w in workers}
    fused = {w.threads: medians[w.label] for w in workers if w.variant == "torch-sdpa"}
    twin = {w.threads: medians[w.label] for w in workers if w.variant == "torch"}
    print()
    print("| variant | threads (numba/torch, BLAS) | median step (ms) | min (ms) "
          "| / torch F.sdpa | / torch twin | tokens/s | peak RSS (MiB) | first loss |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    tokens = config["batch"] * config["context"]
    for w, r in zip(workers, rss, strict=True):
        med = medians[w.label]
        ratios = [f"{med / ref[w.threads]:.2f}" if w.threads in ref else "-"
                  for ref in (fused, twin)]
        print(f"| {w.label} | {w.threads}, {w.blas} | {1e3 * med:.1f} | "
              f"{1e3 * min(w.times):.1f} | {ratios[0]} | {ratios[1]} | {tokens / med:,.0f} | "
              f"{r:.0f} | {w.first_loss:.5f} |")
    print(f"\nload average at end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

"""One training step, ours against PyTorch eager: forward, cross-entropy, backward, clip, Adam.

Usage (anywhere the package is installed; ``benchmarks/bench_train_step.py`` is the same)::

    python -m numpy_transformer.bench.train_step                  # the chapter's char model
    python -m numpy_transformer.bench.train_step --config wide    # 6 layers, width 384
    python -m numpy_transformer.bench.train_step --quick          # a few steps, 1 thread

Configurations (:mod:`.configs`; float32, Adam lr 1e-3, global-norm clipping at 1.0, constant
learning rate; every decoder causal, vocabulary 104 but for ``gpt2``):

* ``chapter``: the chapter's 132,488-parameter character model, ``TransformerConfig(width=84,
  heads=4, layers=2, ffn_width=168, max_len=100, activation="relu", embed_scale=True)``,
  sinusoidal positions, batch 64 x context 100.
* ``small``: 4 layers, width 128, 4 heads, FFN 512 with exact GELU, learned positions,
  batch 12 x context 64.
* ``wide``: the chapter's model grown to 6 layers of width 384 (6 heads of 64, ReLU FFN 1536),
  10.7 M parameters, batch 16 x context 256.
* ``long``: 4 layers of width 256 (4 heads of 64, ReLU FFN 1024) at context 1024, batch 4.
* ``gpt2``: GPT-2 small's shape, 12 layers of width 768 (12 heads of 64, tanh-GELU FFN 3072),
  learned positions, vocabulary 50,304 with the head tied to the token table, 124 M
  parameters, batch 1 x context 1024.
* ``lstm``: the char-LM chapter's third model, ``LSTMLM(LSTMConfig(vocab=104, embed=85,
  hidden=128, max_len=100))``, 132,336 parameters, batch 64 x context 100; its PyTorch twin
  is ``nn.Embedding`` + ``nn.LSTM(batch_first=True)`` + ``nn.Linear`` (there is no attention,
  so no ``F.sdpa`` variant: the ratio is to the twin).

Variants, each in its own worker process (so thread pools and resident memory are not shared):

* ``ours numba``: ``Trainer.step`` with ``backend="numba"`` (fused kernels everywhere);
* ``ours numpy``: the same with ``backend="numpy"`` (the readable references), 1 thread only;
* ``torch sdpa``: the PyTorch twin of the same model (``numpy_transformer.torch_twins``), loaded
  with the same initial weights, trained by ``F.cross_entropy`` + ``backward`` +
  ``clip_grad_norm_`` + ``torch.optim.Adam``, with the twin's attention core swapped for
  ``F.scaled_dot_product_attention(is_causal=True)``, PyTorch's fused CPU kernel: what a
  PyTorch user would write, and the baseline of the ratios;
* ``torch twin``: the twin unchanged; its attention is written out (``softmax(q k^T) v`` with
  ``masked_fill``), as a reader's first PyTorch version would be;
* with ``--products``, ``products`` and ``torch products``: no model, only the matrix products
  of the step's linear maps, each on arrays of its own (:func:`.sgemm.linear_operands`),
  through NumPy's BLAS and through ``torch.matmul``. Their ratio to ``torch sdpa`` is the
  floor that NumPy's BLAS puts under ours: no step of ours can take less.

"threads" means, for ours, ``numba.set_num_threads(n)`` and ``OPENBLAS_NUM_THREADS=n`` (set in
the worker's environment before NumPy loads; the ``numba, BLAS 1`` rows keep BLAS at one
thread); for torch, ``torch.set_num_threads(n)``. Every worker trains on the same batches
(random token ids from one seed) from the same initial weights; the table shows each
variant's first loss, which must agree across frameworks.

The main process asks the workers in turn for a few steps at a time (``--rounds`` rounds), so
a burst of load from other jobs hits every variant alike. A step is timed with
``time.perf_counter`` around the whole step; the table gives the median over all measured
steps after ``--warmup`` warm-up steps (which also load the kernels, or compile them where
the cache lacks them), the ratio ours / torch at the same thread count, and the effective
GFLOP/s (:func:`step_flops` over the median step) as a fraction of the rate of the step's own
matrix products on this machine's BLAS, measured in the same run before, between and after
the rounds, while the workers wait (:mod:`.sgemm`; their median; the square 1024^3 rate
beside it). The head of the output names the CPU, its SIMD level and the BLAS kernels
(:mod:`.machine`), with a warning when those are older than the CPU. Peak RSS is
``ru_maxrss`` of each worker.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .configs import CONFIGS, model_kind, step_flops

# the folder holding the numpy_transformer package: put first on the workers' path, so that
# they import this very copy (a source checkout or an installed one)
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])

# ---------------------------------------------------------------------------------------------
# Worker side: one variant; reads a number of steps per line on stdin, answers one JSON line
# ---------------------------------------------------------------------------------------------

def _batches(config: dict, count: int = 8):
    import numpy as np

    rng = np.random.default_rng(1234)
    shape = (config["batch"], config["context"])
    vocab = config["model"]["vocab"]
    return [(rng.integers(0, vocab, shape), rng.integers(0, vocab, shape)) for _ in range(count)]


def _model(config: dict, **overrides):
    """Our model of a configuration, float32 unless ``overrides`` say otherwise."""
    from ..nn import LSTMLM, DecoderLM, LSTMConfig, TransformerConfig

    kw = {**config["model"], "dtype": "float32", **overrides}
    if model_kind(config) == "lstm":
        return LSTMLM(LSTMConfig(**kw))
    return DecoderLM(TransformerConfig(**kw))


def steady_state(threads: int) -> None:
    """Set up a process that times our steps: the numba backend's threads (``backend.py``'s
    hook), ``threads`` of them, and freed memory kept for the next step as the command line
    keeps it (``numpy_transformer/allocator.py``)."""
    import numba

    from ..allocator import reuse_freed_memory
    from ..backend import get_backend

    get_backend("numba")  # its threads set up first (backend.start_numba), then their count
    numba.set_num_threads(threads)
    reuse_freed_memory()


def _ours_step(config: dict, backend: str, threads: int):
    import numpy as np

    from ..optim import Adam
    from ..schedules import constant_lr
    from ..train import Batch, Trainer

    steady_state(threads)
    model = _model(config, backend=backend)
    trainer = Trainer(model, Adam(lr=1e-3, backend=backend), constant_lr(1e-3), clip=1.0)
    data = [Batch((np.asarray(x),), np.asarray(y)) for x, y in _batches(config)]

    def step(i: int) -> float:
        return trainer.step(data[i % len(data)]).loss

    return step


def _fused_sdpa(q, k, v, mask=None, bias=None, scale=None, dropout=None):
    """The twin's ``sdpa`` on PyTorch's fused kernel (causal self-attention, no bias here;
    ``dropout``, the twin's ``nn.Dropout`` of the weights, as its ``dropout_p``)."""
    import torch.nn.functional as F

    assert bias is None and scale is None
    p = dropout.p if dropout is not None and dropout.training else 0.0
    t_q, t_k = q.shape[-2], k.shape[-2]
    if mask is not None and t_q == t_k and mask.shape[-2:] == (t_q, t_k) and bool(
            (mask == mask.new_ones(t_q, t_k).tril()).all()):  # the causal mask
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)


def _torch_step(config: dict, threads: int, fused: bool):
    import numpy as np
    import torch
    import torch.nn.functional as F

    from ..torch_twins import modules as twin_modules
    from ..torch_twins import to_torch

    if fused:
        twin_modules.sdpa = _fused_sdpa  # MultiHeadAttention.forward looks it up at call time
    torch.set_num_threads(threads)
    model = to_torch(_model(config))  # same architecture, our initial weights
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


def _products_step(config: dict, framework: str, threads: int):
    """A "step" that makes the products of a step's linear maps and nothing else (NumPy's BLAS
    threads: the worker's ``OPENBLAS_NUM_THREADS``)."""
    from .sgemm import linear_operands

    if framework == "torch":
        import torch

        torch.set_num_threads(threads)
    pairs = linear_operands(config, framework)

    def step(i: int) -> float:
        for a, b in pairs:
            a @ b
        return float("nan")  # no loss

    return step


def worker(variant: str, config_name: str, threads: int) -> None:
    """Serve one variant on stdin/stdout: a line ``n`` times n steps, ``-1`` ends."""
    import resource

    config = CONFIGS[config_name]
    if variant.endswith("products"):
        step = _products_step(config, variant.split("-")[0], threads)
    elif variant.startswith("torch"):
        step = _torch_step(config, threads, fused=variant == "torch-sdpa")
    else:
        step = _ours_step(config, variant, threads)
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

@dataclass
class Worker:
    """A variant's process: ``run(n)`` times n steps there.

    ``env`` is added to the worker's environment (``NUMBA_CACHE_DIR`` for a cold start);
    ``first_step`` is the time of its very first step, compilation and lazy set-up included.
    """

    label: str
    variant: str
    config: str
    threads: int
    blas: int
    env: dict = field(default_factory=dict)
    times: list = field(default_factory=list)
    first_step: float | None = None
    first_loss: float | None = None
    rss_mib: float | None = None

    def __post_init__(self) -> None:
        env = dict(os.environ)
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(self.blas)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_PARENT, env.get("PYTHONPATH"))
                                            if p)
        env.update(self.env)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", __name__, "--worker", self.variant, "--config", self.config,
             "--threads", str(self.threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def _ask(self, line: str) -> dict:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"the {self.label} worker exited (code {self.proc.wait()})")
        return json.loads(answer)

    def wait_ready(self) -> None:
        """Block until the worker has built its model."""
        if not self.proc.stdout.readline():
            raise RuntimeError(f"the {self.label} worker exited (code {self.proc.wait()})")

    def run(self, n: int, keep: bool = True) -> None:
        """Time ``n`` steps in the worker; keep their times unless warming up."""
        answer = self._ask(str(n))
        times = answer["times"]
        if self.first_step is None and times:
            self.first_step = times[0]
        self.first_loss = answer["first_loss"]
        if keep:
            self.times += times

    def close(self) -> None:
        """End the worker; records its peak RSS."""
        self.rss_mib = self._ask("-1")["maxrss_mib"]
        self.proc.wait()


def variants_for(threads: list[int], numpy: bool = True, torch: bool = True,
                 attention: bool = True, products: bool = False) -> list[tuple]:
    """``(label, variant, threads, BLAS threads)`` of every worker of a run (``attention``:
    the model has attention, so PyTorch's fused ``F.sdpa`` is a variant; ``products``: the
    linear maps' products alone, NumPy's and, with ``torch``, PyTorch's)."""
    variants = []
    for n in threads:
        if products:
            variants.append((f"linear maps' products, NumPy, {n} thr", "numpy-products", n, n))
            if torch:
                variants.append((f"linear maps' products, torch, {n} thr", "torch-products",
                                 n, n))
        variants.append((f"ours numba, {n} thr", "numba", n, n))
        if n > 1:
            variants.append((f"ours numba, {n} thr, BLAS 1", "numba", n, 1))
        if torch and attention:
            variants.append((f"torch eager F.sdpa, {n} thr", "torch-sdpa", n, n))
        if torch:
            variants.append((f"torch eager twin, {n} thr", "torch", n, n))
    if numpy:
        variants.append(("ours numpy, 1 thr", "numpy", 1, 1))
    return variants


def measure(config: str, variants: list[tuple], steps: int, warmup: int, rounds: int,
            between: Callable[[], None] | None = None) -> list[Worker]:
    """Start one worker per variant and time them in turn; returns the closed workers.

    ``between`` is called before the first round and after each, while the workers wait: the
    main process measures the machine's matrix-product rate there, so that a burst of load
    from elsewhere hits the ceiling as it hits the steps.
    """
    workers = [Worker(label, v, config, n, blas) for label, v, n, blas in variants]
    try:
        for w in workers:
            w.wait_ready()
        for w in workers:
            w.run(warmup, keep=False)
        for n in [steps // rounds + (r < steps % rounds) for r in range(rounds)]:
            if between:
                between()
            for w in workers:  # in turn, so load from elsewhere hits every variant alike
                w.run(n)
        if between:
            between()
        for w in workers:
            w.close()
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.proc.kill()
    return workers


def median(values: list[float]) -> float:
    """The median of a non-empty list."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def torch_installed() -> bool:
    """Whether ``import torch`` would work, without importing it."""
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def print_table(config: str, workers: list[Worker], sgemm: dict[int, list[float]],
                shapes: dict[int, list[float]]) -> None:
    """The markdown table of a run: one row per worker, ratios to torch at its thread count,
    and the effective GFLOP/s as a fraction of the rate of the step's products (``shapes``,
    by thread count, measured between the rounds; ``sgemm`` the square rate)."""
    medians = {w.label: median(w.times) for w in workers}
    fused = {w.threads: medians[w.label] for w in workers if w.variant == "torch-sdpa"}
    twin = {w.threads: medians[w.label] for w in workers if w.variant == "torch"}
    cfg = CONFIGS[config]
    tokens, flops = cfg["batch"] * cfg["context"], step_flops(cfg)
    print("\n| variant | threads (numba/torch, BLAS) | median step (ms) | min (ms) "
          "| / torch F.sdpa | / torch twin | tokens/s | GFLOP/s | / products' rate "
          "| peak RSS (MiB) | first loss |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for w in workers:
        med = medians[w.label]
        ratios = [f"{med / ref[w.threads]:.2f}" if w.threads in ref else "-"
                  for ref in (fused, twin)]
        gflops = flops / med / 1e9
        rate = ("- | - | -" if w.variant.endswith("products") else  # not a step: no model
                f"{tokens / med:,.0f} | {gflops:.1f} | {gflops / median(shapes[w.threads]):.2f}")
        print(f"| {w.label} | {w.threads}, {w.blas} | {1e3 * med:.1f} | "
              f"{1e3 * min(w.times):.1f} | {ratios[0]} | {ratios[1]} | {rate} | "
              f"{w.rss_mib:.0f} | {w.first_loss:.5f} |")

    def rates(measured: dict[int, list[float]]) -> str:
        return "; ".join(f"{n} thr {' / '.join(f'{g:.0f}' for g in r)}"
                         for n, r in sorted(measured.items()))

    print(f"\nmodel FLOPs per step {flops / 1e9:.2f} G (bench.configs.step_flops). GFLOP/s of "
          f"NumPy's BLAS before, between and after the rounds: the step's products at their "
          f"own shapes (bench.sgemm.products_gflops; the fraction's denominator is their "
          f"median) {rates(shapes)}; float32 1024^3 {rates(sgemm)}")


def main(argv: list[str] | None = None) -> None:
    """The command line of the long benchmark (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", choices=list(CONFIGS), default="chapter")
    parser.add_argument("--steps", type=int, default=30, help="measured steps per variant")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5,
                        help="the steps are asked for in this many turns per variant")
    parser.add_argument("--threads", default="1,2", help="thread counts to measure")
    parser.add_argument("--no-numpy", action="store_true", help="skip the numpy backend")
    parser.add_argument("--no-twin", action="store_true",
                        help="skip PyTorch with hand-written attention")
    parser.add_argument("--products", action="store_true",
                        help="also time the linear maps' products alone, NumPy's and torch's")
    parser.add_argument("--quick", action="store_true", help="2 warm-up + 6 steps, 1 thread")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    if args.worker:
        worker(args.worker, args.config, threads[0])
        return
    if args.quick:
        args.steps, args.warmup, args.rounds, threads = 6, 2, 2, [1]
    from .machine import machine_lines
    from .sgemm import products_gflops, sgemm_gflops

    variants = variants_for(threads, numpy=not args.no_numpy, torch=torch_installed(),
                            attention=model_kind(CONFIGS[args.config]) == "transformer",
                            products=args.products)
    if args.no_twin:
        variants = [v for v in variants if v[1] != "torch"]
    print("\n".join(machine_lines()), flush=True)
    cfg = CONFIGS[args.config]
    print(f"config {args.config}: {cfg['model']}, batch {cfg['batch']} x context "
          f"{cfg['context']}; {args.warmup} warm-up + {args.steps} measured steps per "
          f"variant in {args.rounds} rounds", flush=True)
    sgemm, shapes = defaultdict(list), defaultdict(list)

    def ceilings() -> None:
        for n in threads:
            sgemm[n].append(sgemm_gflops(n))
            shapes[n].append(products_gflops(cfg, n))

    workers = measure(args.config, variants, args.steps, args.warmup, args.rounds, ceilings)
    print_table(args.config, workers, sgemm, shapes)
    print(f"\nload average at end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

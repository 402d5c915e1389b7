"""Where one training step's time goes, by component, for the numpy and numba backends.

Usage (from the repository root)::

    python benchmarks/profile_train_step.py                  # chapter model, 1 thread
    python benchmarks/profile_train_step.py --config small --threads 2   # Numba threads
    python benchmarks/profile_train_step.py --cprofile       # also the top of cProfile

Every forward/backward of the step's pieces is wrapped in a timer (``time.perf_counter``):
the linear layers (all of them: attention projections, FFN, head; with the numba backend a
ReLU FFN is one kernel, counted here whole), the attention core, the head split/merge copies,
the norms, the activation, the embedding and positions, the loss, clipping and Adam. "rest" is
the step's time minus all of these: residual additions, zeroing the gradients, Python. The
wrappers add a few microseconds per call. Both backends are timed in this one process,
alternating step by step, so a change in load hits both alike.
"""

from __future__ import annotations

import os
import sys

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before NumPy loads its BLAS: the kernels' own threads

import argparse  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

import numba  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train_step import CONFIGS, _batches  # noqa: E402

from numpy_transformer import optim, schedules, train  # noqa: E402
from numpy_transformer.allocator import reuse_freed_memory  # noqa: E402
from numpy_transformer.nn import DecoderLM, TransformerConfig, layers, models, positional  # noqa: E402
from numpy_transformer.nn import attention as nn_attention  # noqa: E402

TOTALS: dict[str, float] = defaultdict(float)


def timed(name: str, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TOTALS[name] += time.perf_counter() - start
    return wrapper


def instrument_classes() -> None:
    """Wrap the layers' methods and the attention's module-level functions in timers (once)."""
    nn_attention.split_heads = timed("split/merge heads", nn_attention.split_heads)
    nn_attention.merge_heads = timed("split/merge heads", nn_attention.merge_heads)
    for cls, name in ((layers.LayerNorm, "norm"),
                      (layers.RMSNorm, "norm"), (layers.Embedding, "embedding + positions"),
                      (positional.SinusoidalPositions, "embedding + positions"),
                      (positional.LearnedPositions, "embedding + positions")):
        cls.forward = timed(name, cls.forward)
        cls.backward = timed(name, cls.backward)


def instrument(model) -> None:
    """Wrap the pairs each instance chose at construction (linear, attention core, activation)."""
    stack = [model]
    while stack:
        m = stack.pop()
        stack.extend(m.children.values())
        if hasattr(m, "affine_forward"):  # Linear, TiedOutput, MultiHeadAttention
            m.affine_forward = timed("linear", m.affine_forward)
            m.affine_backward = timed("linear", m.affine_backward)
        if isinstance(m, nn_attention.MultiHeadAttention):
            m.heads_forward = timed("linear", m.heads_forward)  # the stacked q, k, v products
            m.sdpa_forward = timed("attention core", m.sdpa_forward)
            m.sdpa_backward = timed("attention core", m.sdpa_backward)
        if isinstance(m, models.Embeddings) and m.fused_forward is not None:
            m.fused_forward = timed("embedding + positions", m.fused_forward)  # (1)-(3) at once
            m.fused_backward = timed("embedding + positions", m.fused_backward)
        if isinstance(m, layers.FeedForward) and m.fused_forward is not None:
            m.fused_forward = timed("linear", m.fused_forward)  # both products and the ReLU
            m.fused_backward = timed("linear", m.fused_backward)
        elif isinstance(m, layers.FeedForward) and hasattr(m, "act_forward"):
            m.act_forward = timed("activation", m.act_forward)
            m.act_backward = timed("activation", m.act_backward)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="chapter")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cprofile", action="store_true")
    args = parser.parse_args()
    numba.set_num_threads(args.threads)
    reuse_freed_memory()  # as the command line does (numpy_transformer/allocator.py)
    config = CONFIGS[args.config]
    instrument_classes()
    original_loss_backend = train.loss_backend

    def loss_backend(name):
        f, b = original_loss_backend(name)
        return timed("cross-entropy", f), timed("cross-entropy", b)

    train.loss_backend = loss_backend
    train.clip_grad_norm = timed("clip", train.clip_grad_norm)
    optim.Adam.step = timed("adam", optim.Adam.step)
    trainers, totals = {}, {}
    for backend in ("numpy", "numba"):
        model = DecoderLM(TransformerConfig(**config["model"], dtype="float32", backend=backend))
        instrument(model)
        trainers[backend] = train.Trainer(model, optim.Adam(lr=1e-3), schedules.constant_lr(1e-3))
        totals[backend] = defaultdict(float)
    data = [train.Batch((x,), y) for x, y in _batches(config)]
    for i in range(3):  # warm-up (loads the compiled kernels)
        for t in trainers.values():
            t.step(data[i % len(data)])
    for i in range(args.steps):
        for backend, t in trainers.items():
            TOTALS.clear()
            start = time.perf_counter()
            t.step(data[i % len(data)])
            TOTALS["step"] = time.perf_counter() - start
            for k, v in TOTALS.items():
                totals[backend][k] += v / args.steps
    names = ["linear", "attention core", "split/merge heads", "norm", "activation",
             "embedding + positions", "cross-entropy", "clip", "adam"]
    print(f"config {args.config}, {args.threads} Numba thread(s), BLAS 1, mean ms per step "
          f"over {args.steps} steps, load average {os.getloadavg()[0]:.1f}")
    print("\n| component | numpy backend (ms) | numba backend (ms) |\n|---|---:|---:|")
    for name in names + ["rest"]:
        vals = []
        for backend in trainers:
            tot = totals[backend]
            v = tot["step"] - sum(tot[n] for n in names) if name == "rest" else tot[name]
            vals.append(1e3 * v)
        print(f"| {name} | {vals[0]:.1f} | {vals[1]:.1f} |")
    print(f"| **step** | **{1e3 * totals['numpy']['step']:.1f}** | "
          f"**{1e3 * totals['numba']['step']:.1f}** |")
    if args.cprofile:
        import cProfile
        import pstats

        profile = cProfile.Profile()
        profile.enable()
        for i in range(args.steps):
            trainers["numba"].step(data[i % len(data)])
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()

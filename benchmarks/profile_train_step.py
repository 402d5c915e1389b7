"""Where one training step's time goes, by component, for the numpy and numba backends.

Usage (from the repository root)::

    python benchmarks/profile_train_step.py                  # chapter model, 1 thread
    python benchmarks/profile_train_step.py --config small --threads 2   # Numba threads
    python benchmarks/profile_train_step.py --cprofile       # also the top of cProfile
    python benchmarks/profile_train_step.py --config gpt2 --threads 2 --backends numba --steps 3

Every operation of the two backends (``numpy_transformer.backend``) is wrapped in a timer
(``time.perf_counter``) and counted under its component: the linear layers (attention
projections, head), the attention core, the head split/merge copies, the norms, the
feed-forward network (one operation, ``feed_forward_forward``, counted whole: its linear
maps and activation), the embedding and positions, the loss, clipping and Adam. The
vocabulary head (its module's forward and backward, in training the head and the loss as one
operation, ``linear_cross_entropy_forward``) is its own row, taken out of "linear".
"rest" is the step's time minus all of these: the residual additions (``x + sub`` in the
blocks), zeroing the gradients, Python. The wrappers add a few microseconds per call.
The backends are timed in this one process, alternating step by step, so a change in load
hits both alike.

Beside each component that makes matrix products, the table gives the time those products
would take at the speed NumPy's BLAS multiplies their shapes on ``--threads`` threads
(``numpy_transformer.bench.sgemm.product_seconds``, measured in the same run): the gap
between the two is what keeps the step from the products' rate.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from numpy_transformer import backend as backend_module  # noqa: E402
from numpy_transformer import optim, schedules, train  # noqa: E402
from numpy_transformer.bench.configs import CONFIGS  # noqa: E402
from numpy_transformer.bench.sgemm import product_seconds  # noqa: E402
from numpy_transformer.bench.train_step import _batches, steady_state  # noqa: E402
from numpy_transformer.nn import DecoderLM, TransformerConfig  # noqa: E402
from numpy_transformer.nn import attention as nn_attention  # noqa: E402

TOTALS: dict[str, float] = defaultdict(float)
COMPONENTS = {  # the first prefix an operation's name starts with names its component
    "linear": "linear", "sdpa": "attention core", "feed_forward": "feed-forward network",
    "layer_norm": "norm", "rms_norm": "norm", "embedding": "embedding + positions",
    "cross_entropy": "cross-entropy",
}
# the component of each of bench.configs.products, by the start of its name
PRODUCTS = {"q, k, v, out": "linear", "FFN": "feed-forward network",
            "vocabulary head": "vocabulary head", "q k^T": "attention core",
            "p v": "attention core"}
NAMES = ["linear", "vocabulary head", "attention core", "split/merge heads", "norm",
         "feed-forward network", "embedding + positions", "cross-entropy", "clip", "adam"]


def timed(name: str, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TOTALS[name] += time.perf_counter() - start
    return wrapper


def instrument() -> None:
    """Build both backends with every operation timed, and the head split/merge copies."""
    nn_attention.split_heads = timed("split/merge heads", nn_attention.split_heads)
    nn_attention.merge_heads = timed("split/merge heads", nn_attention.merge_heads)
    build = backend_module._build
    timed_backends = {}
    for name in ("numpy", "numba"):
        ops = dict(vars(build(name)))
        for op, fn in ops.items():
            component = next((c for prefix, c in COMPONENTS.items() if op.startswith(prefix)),
                             None)
            if component is not None and callable(fn):
                ops[op] = timed(component, fn)
        timed_backends[name] = backend_module.Backend(**ops)
    # get_backend's every call
    backend_module._build = lambda name: timed_backends[name]


def products_ms(config: dict, threads: int) -> dict[str, float]:
    """Milliseconds per step of each component's matrix products at NumPy's BLAS speed."""
    ms: dict[str, float] = defaultdict(float)
    for product, seconds in product_seconds(config, threads):
        ms[next(c for prefix, c in PRODUCTS.items() if product.what.startswith(prefix))] += \
            1e3 * seconds
    return ms


def print_table(args, totals: dict[str, dict[str, float]], ceiling: dict[str, float]) -> None:
    """One row per component: each backend's mean ms, and its products at the BLAS's speed."""
    backends = list(totals)
    print(f"config {args.config}, {args.threads} Numba thread(s), BLAS 1 in the step and "
          f"{args.threads} in the products' timing, mean ms per step over {args.steps} steps, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"\n| component | {' | '.join(f'{b} backend (ms)' for b in backends)} "
          f"| its products at the BLAS's rate (ms) |\n|---|{'---:|' * (len(backends) + 1)}")
    for name in NAMES + ["rest"]:
        vals = []
        for backend in backends:
            tot = totals[backend]
            v = tot["step"] - sum(tot[n] for n in NAMES) if name == "rest" else tot[name]
            vals.append(f"{1e3 * v:.1f}")
        print(f"| {name} | {' | '.join(vals)} | "
              f"{f'{ceiling[name]:.1f}' if name in ceiling else ''} |")
    steps = " | ".join(f"**{1e3 * totals[b]['step']:.1f}**" for b in backends)
    print(f"| **step** | {steps} | **{sum(ceiling.values()):.1f}** |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", choices=sorted(c for c in CONFIGS if c != "lstm"),
                        default="chapter")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--backends", default="numpy,numba", help="the backends to time")
    parser.add_argument("--cprofile", action="store_true")
    args = parser.parse_args()
    backends = args.backends.split(",")
    if not set(backends) <= {"numpy", "numba"}:
        parser.error(f"--backends {args.backends}: choose from numpy, numba")
    steady_state(args.threads)  # the kernels' parallel tier, as the benchmarks time it
    config = CONFIGS[args.config]
    instrument()
    train.clip_grad_norm = timed("clip", train.clip_grad_norm)
    optim.Adam.step = timed("adam", optim.Adam.step)
    trainers, totals = {}, {}
    for backend in backends:
        model = DecoderLM(TransformerConfig(**config["model"], dtype="float32", backend=backend))
        for method in ("forward", "backward", "loss_forward", "loss_backward"):
            setattr(model.head, method, timed("vocabulary head", getattr(model.head, method)))
        trainers[backend] = train.Trainer(model, optim.Adam(lr=1e-3, backend=backend),
                                          schedules.constant_lr(1e-3), clip=1.0)
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
            TOTALS["linear"] -= TOTALS["vocabulary head"]  # the head's linear op is its row
            for k, v in TOTALS.items():
                totals[backend][k] += v / args.steps
    print_table(args, totals, products_ms(config, args.threads))
    if args.cprofile:
        import cProfile
        import pstats

        profile = cProfile.Profile()
        profile.enable()
        for i in range(args.steps):
            trainers[backends[-1]].step(data[i % len(data)])
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()

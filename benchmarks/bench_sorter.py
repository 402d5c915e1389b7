"""The chapter's sorter trained end to end, ours against the same run in PyTorch.

Usage (from the repository root)::

    python benchmarks/bench_sorter.py            # 600 steps, as experiments/sorter.py
    python benchmarks/bench_sorter.py --quick    # 60 steps (the CLI's ``bench``)

The run of ``experiments/sorter.py`` (learned positions): ``EncoderClassifier`` with width 64,
4 heads, 2 pre-LN blocks, exact-GELU FFN of 256, learned positions, final LayerNorm and a
linear head to 10 classes per position, float32; AdamW at lr 3e-3 with weight decay 0.01 on
every parameter (``torch.optim.AdamW``'s default), no clipping; 600 steps of 128 fresh random
sequences of 10 digits (``tasks.sort_batch``, seed 0); then token and whole-sequence accuracy
on 2,000 test sequences (seed 123).

Variants, each a separate process run one after the other (wall time = the 600 steps plus
the test forward, after a 3-step warm-up on a throw-away model that loads the compiled
kernels and torch's lazy initialisation):

* ``ours numba``: ``Trainer`` with ``backend="numba"``;
* ``ours numpy``: the same with the readable references;
* ``torch F.sdpa``: the PyTorch twin (``numpy_transformer.torch_twins``) with our initial weights
  (``interop.to_torch_state_dict``), the attention core on ``F.scaled_dot_product_attention``;
* ``torch twin``: the twin unchanged (attention written out).

All see the same batches in the same order. "threads" is ``numba.set_num_threads`` plus
``OPENBLAS_NUM_THREADS`` for ours and ``torch.set_num_threads`` for torch. The final
accuracies should agree closely (float32 rounding differs, so the runs drift apart slowly).
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
STEPS, BATCH, LR, N_TEST, LENGTH = 600, 128, 3e-3, 2000, 10
TRAIN_SEED, TEST_SEED = 0, 123


def config(backend: str = "numpy"):
    from numpy_transformer.nn import TransformerConfig

    return TransformerConfig(vocab=10, width=64, heads=4, layers=2, ffn_width=256,
                             max_len=LENGTH, activation="gelu", positions="learned",
                             num_classes=10, dtype="float32", backend=backend, seed=0)


def run_ours(backend: str, steps: int) -> dict:
    import numpy as np

    from numpy_transformer.nn import EncoderClassifier
    from numpy_transformer.optim import AdamW
    from numpy_transformer.schedules import constant_lr
    from numpy_transformer.tasks import sort_batch
    from numpy_transformer.train import Batch, Trainer

    def make():
        model = EncoderClassifier(config(backend))
        opt = AdamW(lr=LR, weight_decay=0.01, decay=lambda name, p: True,  # torch's default
                backend=backend)
        return model, Trainer(model, opt, constant_lr(LR), clip=None)

    _, warm = make()
    for _ in range(3):
        x, y = sort_batch(BATCH, np.random.default_rng(99), LENGTH)
        warm.step(Batch((x,), y))
    model, trainer = make()
    rng = np.random.default_rng(TRAIN_SEED)
    start = time.perf_counter()
    for _ in range(steps):
        x, y = sort_batch(BATCH, rng, LENGTH)
        trainer.step(Batch((x,), y))
    x, y = sort_batch(N_TEST, np.random.default_rng(TEST_SEED), LENGTH)
    pred = model.forward(x).argmax(-1)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "final_loss": trainer.log[-1].loss,
            "token": float((pred == y).mean()), "sequence": float((pred == y).all(1).mean())}


def run_torch(fused: bool, steps: int) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_train_step import _fused_sdpa

    from numpy_transformer.nn import EncoderClassifier
    from numpy_transformer.tasks import sort_batch
    from numpy_transformer.torch_twins import modules as twin_modules
    from numpy_transformer.torch_twins import to_torch

    if fused:
        twin_modules.sdpa = _fused_sdpa  # MultiHeadAttention.forward looks it up at call time

    def make():
        model = to_torch(EncoderClassifier(config()))
        return model, torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)

    def step(model, opt, x, y):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(torch.from_numpy(x)).reshape(-1, 10),
                               torch.from_numpy(y).reshape(-1))
        loss.backward()
        opt.step()
        return loss.item()

    warm, warm_opt = make()
    for _ in range(3):
        step(warm, warm_opt, *sort_batch(BATCH, np.random.default_rng(99), LENGTH))
    model, opt = make()
    rng = np.random.default_rng(TRAIN_SEED)
    start = time.perf_counter()
    for _ in range(steps):
        loss = step(model, opt, *sort_batch(BATCH, rng, LENGTH))
    x, y = sort_batch(N_TEST, np.random.default_rng(TEST_SEED), LENGTH)
    with torch.no_grad():
        pred = model(torch.from_numpy(x)).argmax(-1).numpy()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "final_loss": loss,
            "token": float((pred == y).mean()), "sequence": float((pred == y).all(1).mean())}


def worker(variant: str, threads: int, steps: int) -> None:
    import resource

    if variant.startswith("torch"):
        import torch

        torch.set_num_threads(threads)
        result = run_torch(variant == "torch-sdpa", steps)
    else:
        from numpy_transformer.bench.train_step import steady_state

        steady_state(threads)
        result = run_ours(variant, steps)
    result["maxrss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help=f"{STEPS // 10} steps")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.steps = STEPS // 10
    if args.worker:
        worker(args.worker, args.threads, args.steps)
        return
    import numba
    import numpy as np
    import torch

    print(f"{platform.machine()}, nproc {os.cpu_count()}, Python {platform.python_version()}, "
          f"NumPy {np.__version__}, Numba {numba.__version__}, torch {torch.__version__}; "
          f"{args.steps} steps, {args.threads} thread(s); load average "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(args.threads)
    rows = {}
    for label, variant in (("ours numba", "numba"), ("torch F.sdpa", "torch-sdpa"),
                           ("ours numpy", "numpy"), ("torch twin", "torch")):
        out = subprocess.run([sys.executable, __file__, "--worker", variant, "--threads",
                              str(args.threads), "--steps", str(args.steps)],
                             env=env, cwd=ROOT, check=True, capture_output=True, text=True)
        rows[label] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"  {label}: {rows[label]['seconds']:.1f} s", flush=True)
    base = rows["torch F.sdpa"]["seconds"]
    print("\n| variant | wall time (s) | / torch F.sdpa | final loss | token accuracy "
          "| sequence accuracy | peak RSS (MiB) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, r in rows.items():
        print(f"| {label} | {r['seconds']:.1f} | {r['seconds'] / base:.2f} | "
              f"{r['final_loss']:.4f} | {r['token']:.4f} | {r['sequence']:.4f} | "
              f"{r['maxrss_mib']:.0f} |")
    print(f"\nload average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

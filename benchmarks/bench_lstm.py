"""One training step of the char-LM chapter's LSTM, ours against ``torch.nn.LSTM``.

Usage (from the repository root)::

    python benchmarks/bench_lstm.py                    # 2 threads, 40 steps each, 8 rounds
    python benchmarks/bench_lstm.py --threads 1,2 --steps 60
    python benchmarks/bench_lstm.py --quick            # a few steps

The model is ``LSTMLM(LSTMConfig(vocab=104, embed=85, hidden=128, max_len=100))``: 132,336
parameters, the size of the three-way comparison (``experiments/charlm.py``), float32, at
the chapter's batch 64 x context 100. A step is forward, cross-entropy, backward, global-norm
clipping at 1.0 and Adam (lr 2e-3).

* ``ours numba``: ``Trainer.step`` with ``backend="numba"``: the LSTM kernel
  (``kernels/lstm.py``) and the other kernels; ``numba.set_num_threads(n)``, BLAS at one
  thread (the kernels run their products on Numba's threads).
* ``torch``: the twin (``reference_checks/twins.py``: ``nn.Embedding``, ``nn.LSTM`` with
  ``batch_first=True``, ``nn.Linear``) with the same initial weights, trained by
  ``F.cross_entropy`` + ``backward`` + ``clip_grad_norm_`` + ``torch.optim.Adam``;
  ``torch.set_num_threads(n)``.

Each variant runs in its own worker process (``bench_train_step.Worker``); the main process
asks them in turn for a few steps at a time, ours then torch, ``--rounds`` times, so load from
other jobs on the machine hits both alike. The table gives the median and the minimum step
after ``--warmup`` warm-up steps, and the ratio of the medians, ours / torch, at the same
thread count. Both workers train on the same batches from the same weights: their first
losses must agree.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import bench_train_step as bench

ROOT = Path(__file__).resolve().parents[1]
MODEL = dict(vocab=104, embed=85, hidden=128, max_len=100)
BATCH, CONTEXT, LR = 64, 100, 2e-3


def _batches(count: int = 8):
    import numpy as np

    rng = np.random.default_rng(1234)
    shape = (BATCH, CONTEXT)
    return [(rng.integers(0, MODEL["vocab"], shape), rng.integers(0, MODEL["vocab"], shape))
            for _ in range(count)]


def _ours_step(threads: int):
    import numba

    from numpy_transformer.allocator import reuse_freed_memory
    from numpy_transformer.nn import LSTMLM, LSTMConfig
    from numpy_transformer.optim import Adam
    from numpy_transformer.schedules import constant_lr
    from numpy_transformer.train import Batch, Trainer

    numba.set_num_threads(threads)
    reuse_freed_memory()  # as the command line does
    model = LSTMLM(LSTMConfig(**MODEL, dtype="float32", backend="numba"))
    trainer = Trainer(model, Adam(lr=LR, backend="numba"), constant_lr(LR), clip=1.0)
    data = [Batch((x,), y) for x, y in _batches()]
    return lambda i: trainer.step(data[i % len(data)]).loss


def _torch_step(threads: int):
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT))
    from reference_checks.twins import twin_of

    from numpy_transformer.nn import LSTMLM, LSTMConfig

    torch.set_num_threads(threads)
    model = twin_of(LSTMLM(LSTMConfig(**MODEL, dtype="float32")))  # our initial weights
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    data = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in _batches()]

    def step(i: int) -> float:
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).reshape(-1, MODEL["vocab"]), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="measured steps per variant")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=8,
                        help="the steps are asked for in this many turns per variant")
    parser.add_argument("--threads", default="2", help="thread counts to measure, e.g. 1,2")
    parser.add_argument("--quick", action="store_true", help="2 warm-up + 6 steps, 2 rounds")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)  # the Worker passes one
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    if args.worker:
        bench.serve(_torch_step(threads[0]) if args.worker == "torch"
                    else _ours_step(threads[0]))
        return
    if args.quick:
        args.warmup, args.steps, args.rounds = 2, 6, 2

    print(bench.machine_info(), flush=True)
    print(f"LSTMLM {MODEL}, float32, batch {BATCH} x context {CONTEXT}; {args.warmup} "
          f"warm-up + {args.steps} measured steps per variant in {args.rounds} rounds",
          flush=True)
    workers = []
    for n in threads:
        workers.append(bench.Worker(f"ours numba, {n} thr", "ours", "lstm", n, 1, __file__))
        workers.append(bench.Worker(f"torch nn.LSTM, {n} thr", "torch", "lstm", n, n,
                                    __file__))
    rss = bench.run_in_turn(workers, args.warmup, args.steps, args.rounds)  # ours, torch, ...

    import numpy as np

    medians = {w.label: float(np.median(w.times)) for w in workers}
    torch_median = {w.threads: medians[w.label] for w in workers if w.variant == "torch"}
    print("\n| variant | threads | median step (ms) | min (ms) | / torch | tokens/s "
          "| peak RSS (MiB) | first loss |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for w, r in zip(workers, rss, strict=True):
        med = medians[w.label]
        print(f"| {w.label} | {w.threads} | {1e3 * med:.1f} | {1e3 * min(w.times):.1f} | "
              f"{med / torch_median[w.threads]:.2f} | {BATCH * CONTEXT / med:,.0f} | {r:.0f} "
              f"| {w.first_loss:.5f} |")
    print(f"\nload average at end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

"""What one training step holds in memory, by the line that allocated it.

Usage (from the repository root)::

    python benchmarks/profile_memory.py --config gpt2      # GPT-2 small's shape, batch 1
    python benchmarks/profile_memory.py --config wide --top 12

NumPy reports every array buffer to ``tracemalloc``. After one step (the kernels compile, Adam
makes its moments), the script runs the model's forward alone and lists what is then held
above the parameters, gradients and moments, grouped by the last line of this package that
allocated it: the layers' caches and the logits. Then it measures one whole
``Trainer.loss_and_grads`` (forward, cross-entropy, backward) that starts, as every step of a
run does, with the caches of the step before still held: its peak above the same baseline is
the step's working memory, which peak RSS adds to the parameters, their gradients, Adam's two
moments and the interpreter with its libraries.
"""

from __future__ import annotations

import argparse
import sys
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from numpy_transformer.bench.configs import CONFIGS  # noqa: E402
from numpy_transformer.bench.train_step import _batches, _model  # noqa: E402
from numpy_transformer.optim import Adam  # noqa: E402
from numpy_transformer.schedules import constant_lr  # noqa: E402
from numpy_transformer.train import Batch, Trainer  # noqa: E402

MIB = 2**20
PACKAGE = "numpy_transformer"


def allocated_by(traceback: tracemalloc.Traceback) -> str:
    """``file:line`` of the innermost frame in this package (else the innermost frame)."""
    for frame in reversed(list(traceback)):  # tracemalloc lists the oldest frame first
        if PACKAGE in frame.filename:
            return f"{frame.filename.split(PACKAGE + '/')[-1]}:{frame.lineno}"
    return f"{traceback[-1].filename}:{traceback[-1].lineno}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=[n for n, c in CONFIGS.items()
                                             if c.get("kind") != "lstm"], default="gpt2")
    parser.add_argument("--backend", choices=["numba", "numpy"], default="numba")
    parser.add_argument("--top", type=int, default=10, help="lines to list")
    args = parser.parse_args(argv)
    config = CONFIGS[args.config]
    model = _model(config, backend=args.backend)
    trainer = Trainer(model, Adam(lr=1e-3, backend=args.backend), constant_lr(1e-3), clip=1.0)
    x, y = _batches(config, 1)[0]
    batch = Batch((x,), y)
    trainer.step(batch)  # compiles, and makes Adam's moments

    tracemalloc.start(16)
    base = tracemalloc.get_traced_memory()[0]
    logits = model.forward(x)
    held = tracemalloc.get_traced_memory()[0] - base
    lines: dict[str, int] = {}
    for stat in tracemalloc.take_snapshot().statistics("traceback"):
        where = allocated_by(stat.traceback)
        lines[where] = lines.get(where, 0) + stat.size
    del logits
    print(f"config {args.config}, backend {args.backend}: after the forward, {held / MIB:,.0f} "
          f"MiB above the parameters, gradients and moments")
    print("\n| allocated at | MiB |\n|---|---:|")
    for where, size in sorted(lines.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"| `{where}` | {size / MIB:,.1f} |")
    tracemalloc.reset_peak()  # the caches stay held, as between two steps of a run
    trainer.loss_and_grads(batch)
    peak = tracemalloc.get_traced_memory()[1] - base
    print(f"\nTrainer.loss_and_grads: peak {peak / MIB:,.0f} MiB above the parameters, "
          f"gradients and moments")


if __name__ == "__main__":
    main()

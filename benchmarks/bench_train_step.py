"""One training step, ours against PyTorch eager, side by side: the long form.

The benchmark lives in the package, ``numpy_transformer/bench/train_step.py`` (its docstring
describes the configurations, the variants and how they are timed), so that
``numpy-transformer bench`` runs it from any install. This script is the same command::

    python benchmarks/bench_train_step.py                   # the chapter's char model
    python benchmarks/bench_train_step.py --config small    # 4-layer width-128 GELU decoder
    python benchmarks/bench_train_step.py --config wide --threads 2 --no-numpy
    python benchmarks/bench_train_step.py --config long --threads 2 --no-numpy
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's package

from numpy_transformer.bench.train_step import main  # noqa: E402

if __name__ == "__main__":
    main()

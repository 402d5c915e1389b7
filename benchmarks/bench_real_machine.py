"""Speed on a real machine, side by side with PyTorch: cores shared with other work, and the
first run after install. The benchmark lives in the package,
``numpy_transformer/bench/real_machine.py`` (its docstring says what each part measures), so
that ``numpy-transformer bench --busy N`` runs its threads table from any install. This script
is the whole of it::

    python benchmarks/bench_real_machine.py                        # everything
    python benchmarks/bench_real_machine.py --configs chapter --no-first-runs
    python benchmarks/bench_real_machine.py --no-threads --recipe "--steps 1000"
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's package

from numpy_transformer.bench.real_machine import main  # noqa: E402

if __name__ == "__main__":
    main()

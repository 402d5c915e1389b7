"""What a new user waits for: import, ``--help``, the first training step cold and warm, and
``numpy-transformer gradcheck``, with the compile time of every kernel.

Usage (from the repository root)::

    python benchmarks/bench_cold_start.py                # everything, 3 repeats of each
    python benchmarks/bench_cold_start.py --kernels      # also the compile time per kernel
    python benchmarks/bench_cold_start.py --trees BEFORE AFTER --repeats 5
        # issue 24's two cold-start numbers for two checkouts, measured in alternation

With ``--trees``, each repeat measures each tree in turn (a folder holding a
``numpy_transformer`` package, put first on ``PYTHONPATH``): ``numpy-transformer train
--steps 1`` on an empty cache and again on the cache it filled (the time the cold run spends
above the warm one), and the library's first step, ``Trainer.step`` of the default run in a
process of its own on an empty cache.

"Cold" means an empty Numba cache: every measurement that says so runs in a fresh process whose
``NUMBA_CACHE_DIR`` is a new, empty temporary folder (deleted afterwards), so nothing compiled
before can be loaded; the user's own cache next to the sources is left alone. "Warm" runs the
same process again on the cache the cold run filled: it must load everything and compile
nothing. The first step is measured by ``numpy_transformer.bench.cold_start`` (the default
``numpy-transformer train``: the chapter's model, float32, batch 64 x 100, timed from
building the model to the end of ``Trainer.step``). Each row is the median over the repeats,
each repeat a whole fresh subprocess.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's package

from numpy_transformer.bench import cold_start  # noqa: E402


def _seconds(args: list[str], env: dict | None = None, cwd: Path = ROOT) -> float:
    start = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    seconds = time.perf_counter() - start
    if proc.returncode not in (0, 2):  # 2: the usage error measured on purpose
        raise RuntimeError(f"{' '.join(args)} failed:\n{proc.stderr}")
    return seconds


def _gradcheck(cold: bool) -> float:
    """``numpy-transformer gradcheck`` on an empty cache (cold) or on the one it filled."""
    cache = Path(tempfile.mkdtemp(prefix="numba-cold-"))
    try:
        env = {"NUMBA_CACHE_DIR": str(cache)}
        command = [sys.executable, "-m", "numpy_transformer", "gradcheck"]
        if not cold:
            _seconds(command, env)
        return _seconds(command, env)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


# The library's first step, timed alone: the same code for any tree
LIBRARY_FIRST_STEP = r"""
import time
from numpy_transformer.runs.options import resolve_options
from numpy_transformer.runs.state import Run
run = Run(*resolve_options("lm", {"steps": 2}))
start = time.perf_counter()
run.trainer.step(run.batch(0))
print(time.perf_counter() - start)
"""


def _tree_seconds(tree: str) -> dict[str, float]:
    """Issue 24's cold-start numbers of the package in ``tree``, each in fresh processes on
    an empty Numba cache of their own."""
    caches = [Path(tempfile.mkdtemp(prefix="numba-cold-")) for _ in range(2)]
    env = {"PYTHONPATH": tree, "NUMBA_CACHE_DIR": str(caches[0])}
    train = [sys.executable, "-m", "numpy_transformer", "train", "--steps", "1", "--quiet",
             "--out"]
    try:
        # run from the scratch folder: the working directory comes first on the path
        cold = _seconds([*train, str(caches[1] / "cold")], env, caches[1])
        warm = _seconds([*train, str(caches[1] / "warm")], env, caches[1])
        proc = subprocess.run([sys.executable, "-c", LIBRARY_FIRST_STEP], capture_output=True,
                              text=True, cwd=caches[1], check=True,
                              env={**os.environ, "PYTHONPATH": tree,
                                   "NUMBA_CACHE_DIR": str(caches[1] / "cache")})
        return {"train cold": cold, "train warm": warm, "train cold - warm": cold - warm,
                "library first step cold": float(proc.stdout.splitlines()[-1])}
    finally:
        for cache in caches:
            shutil.rmtree(cache, ignore_errors=True)


def compare_trees(trees: list[str], repeats: int) -> None:
    """Each repeat measures every tree in turn; a row per repeat, then the medians."""
    keys = ("train cold", "train warm", "train cold - warm", "library first step cold")
    print(f"| repeat | tree | {' | '.join(keys)} |\n|---|---|{'---:|' * len(keys)}")
    results: dict[str, list[dict]] = {tree: [] for tree in trees}
    for i in range(repeats):
        for tree in trees:
            r = _tree_seconds(tree)
            results[tree].append(r)
            print(f"| {i + 1} | {tree} | {' | '.join(f'{r[k]:.2f}' for k in keys)} |",
                  flush=True)
    for tree in trees:
        medians = (statistics.median(r[k] for r in results[tree]) for k in keys)
        print(f"| median | {tree} | {' | '.join(f'{m:.2f}' for m in medians)} |")
    print(f"\nload average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kernels", action="store_true",
                        help="also the compile time of every kernel (one more cold run)")
    parser.add_argument("--trees", nargs="+", metavar="FOLDER",
                        help="only issue 24's cold-start numbers, for these checkouts in turn")
    args = parser.parse_args()
    if args.trees:
        compare_trees(args.trees, args.repeats)
        return
    py, med = sys.executable, statistics.median
    rows = [
        (what, med(_seconds([py, *argv]) for _ in range(args.repeats)))
        for what, argv in (
            ("import numpy_transformer", ["-c", "import numpy_transformer"]),
            ("import numpy_transformer.functional", ["-c", "import numpy_transformer.functional"]),
            ("numpy-transformer --help", ["-m", "numpy_transformer", "--help"]),
            ("numpy-transformer train --width 0 (usage error)",
             ["-m", "numpy_transformer", "train", "--width", "0"]))]
    starts = [cold_start.first_steps() for _ in range(args.repeats)]
    for key, what in (("cold", "first training step, cold cache"),
                      ("warm", "first training step, warm cache"),
                      ("second", "second training step, warm cache"),
                      ("floor", "first call of one small cached kernel, fresh process (Numba's "
                                "own start)"),
                      ("build", "building the run (model, data, optimiser), cold")):
        rows.append((what, med(s[key] for s in starts)))
    for cold in (True, False):
        rows.append((f"numpy-transformer gradcheck, {'cold' if cold else 'warm'} cache",
                     med(_gradcheck(cold) for _ in range(args.repeats))))
    print(f"load average {os.getloadavg()[0]:.1f} (at the end); wall seconds, median of "
          f"{args.repeats} fresh processes each\n")
    print("| what | seconds |\n|---|---:|")
    for what, seconds in rows:
        print(f"| {what} | {seconds:.2f} |")
    if args.kernels:
        kernels = cold_start.compile_times()
        print(f"\ncompile time per function and signature, first step cold, without the "
              f"functions compiled inside each (total {sum(kernels.values()):.1f} s):\n\n"
              f"| function (signature) | seconds |\n|---|---:|")
        for name, seconds in sorted(kernels.items(), key=lambda kv: -kv[1]):
            if seconds >= 0.05:
                print(f"| {name[:160]} | {seconds:.2f} |")


if __name__ == "__main__":
    main()

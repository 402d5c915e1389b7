"""What a new user waits for: import, ``--help``, the first training step cold and warm, and
``numpy-transformer gradcheck``, with the compile time of every kernel.

Usage (from the repository root)::

    python benchmarks/bench_cold_start.py                # everything, 3 repeats of the fast ones
    python benchmarks/bench_cold_start.py --kernels      # also the compile time per kernel

"Cold" means an empty Numba cache: every measurement that says so runs in a fresh process whose
``NUMBA_CACHE_DIR`` is a new, empty temporary folder (deleted afterwards), so nothing compiled
before can be loaded; the user's own cache next to the sources is left alone. "Warm" runs the
same process again on the cache the cold run filled: it must load everything and compile
nothing. Each measurement is the wall time of a whole subprocess step, median over the
repeats; the first step is timed from building the model to the end of ``Trainer.step`` (the
default ``numpy-transformer train``: the chapter's model, float32, batch 64 x 100).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FIRST_STEP = r"""
import json, sys, time
start = time.perf_counter()
import numpy as np
from numpy_transformer.runs.options import resolve_options
from numpy_transformer.runs.state import Run
config_fields, options = resolve_options("lm", {"steps": 1})
run = Run(config_fields, options)
built = time.perf_counter()
run.trainer.step(run.batch(0))
first = time.perf_counter()
run.trainer.step(run.batch(1))
second = time.perf_counter()
print(json.dumps({"build": built - start, "first_step": first - built,
                  "second_step": second - first}))
"""

KERNEL_TIMES = r"""
import json, time
from collections import defaultdict
from numba.core import event
times = defaultdict(float)
starts = {}

class Timer(event.Listener):
    def on_start(self, ev):
        starts[id(ev.data["dispatcher"]), str(ev.data["args"])] = time.perf_counter()
    def on_end(self, ev):
        key = (id(ev.data["dispatcher"]), str(ev.data["args"]))
        d = ev.data["dispatcher"]
        name = f"{d.py_func.__module__.rsplit('.', 1)[-1]}.{d.py_func.__name__}"
        times[name] += time.perf_counter() - starts.pop(key)

event.register("numba:compile", Timer())
from numpy_transformer.runs.options import resolve_options
from numpy_transformer.runs.state import Run
config_fields, options = resolve_options("lm", {"steps": 1})
run = Run(config_fields, options)
run.trainer.step(run.batch(0))
print(json.dumps(times))
"""


def _run(args: list[str], env: dict | None = None) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})})
    seconds = time.perf_counter() - start
    if proc.returncode not in (0, 2):  # 2: the usage error measured on purpose
        raise RuntimeError(f"{' '.join(args)} failed:\n{proc.stderr}")
    return seconds, proc.stdout


def _median(args: list[str], repeats: int, env: dict | None = None) -> float:
    return statistics.median(_run(args, env)[0] for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kernels", action="store_true",
                        help="also the compile time of every kernel (one more cold run)")
    args = parser.parse_args()
    py = sys.executable
    rows = [
        ("import numpy_transformer", _median([py, "-c", "import numpy_transformer"],
                                             args.repeats)),
        ("import numpy_transformer.functional",
         _median([py, "-c", "import numpy_transformer.functional"], args.repeats)),
        ("numpy-transformer --help", _median([py, "-m", "numpy_transformer", "--help"],
                                             args.repeats)),
        ("numpy-transformer train --width 0 (usage error)",
         _median([py, "-m", "numpy_transformer", "train", "--width", "0"], args.repeats)),
    ]
    cache = Path(tempfile.mkdtemp(prefix="numba-cold-"))
    try:
        env = {"NUMBA_CACHE_DIR": str(cache)}
        for label in ("cold", "warm"):
            _, out = _run([py, "-c", FIRST_STEP], env)
            r = json.loads(out)
            rows.append((f"first training step, {label} cache (model built: "
                         f"{r['build']:.2f} s)", r["first_step"]))
            if label == "warm":
                rows.append(("second training step, warm cache", r["second_step"]))
        shutil.rmtree(cache)
        cache.mkdir()
        rows.append(("numpy-transformer gradcheck, cold cache",
                     _run([py, "-m", "numpy_transformer", "gradcheck"], env)[0]))
        rows.append(("numpy-transformer gradcheck, warm cache",
                     _run([py, "-m", "numpy_transformer", "gradcheck"], env)[0]))
        kernels = None
        if args.kernels:
            shutil.rmtree(cache)
            cache.mkdir()
            kernels = json.loads(_run([py, "-c", KERNEL_TIMES], env)[1])
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print(f"load average {os.getloadavg()[0]:.1f}; wall seconds, median of {args.repeats} for "
          f"the first four, one run each for the others\n")
    print("| what | seconds |\n|---|---:|")
    for what, seconds in rows:
        print(f"| {what} | {seconds:.2f} |")
    if kernels:
        print(f"\ncompile time per kernel, first step cold (total {sum(kernels.values()):.1f} s):"
              f"\n\n| kernel | seconds |\n|---|---:|")
        for name, seconds in sorted(kernels.items(), key=lambda kv: -kv[1]):
            print(f"| {name} | {seconds:.2f} |")


if __name__ == "__main__":
    main()

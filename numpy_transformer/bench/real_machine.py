"""Speed on a real machine: cores shared with other work, and the first run after install.

The other benchmarks time warm, long processes on idle cores. A user's machine runs other
programs, has just installed the package, and often runs short scripts. Side by side with
PyTorch in one run, this measures:

* **threads** (:func:`thread_table`): one training step, ours and PyTorch's, on the default
  threads (every core this process may use) and on one thread, with ``busy`` competing
  CPU-bound processes (``python -c "while True: pass"``, :func:`competing`) started by the
  benchmark itself; the ratio default / one thread is what the competing process costs a
  framework for using every core;
* **the first run after install** (:func:`first_runs`): a copy of the package laid out as
  ``pip install .`` lays it, its kernels compiled as the install compiles them
  (``numpy_transformer/compile_kernels.py``, timed), then the same recipe twice in fresh
  processes: the first run, and the warm one; a whole short process of 35 training steps, ours
  against PyTorch's; and the first training step on an empty compile cache, what an editable
  install or another CPU waits for.

``numpy-transformer bench --busy N`` prints the threads table of one shape with N competing
processes; ``benchmarks/bench_real_machine.py`` is the whole benchmark. Both say in one line
when the machine was busy before they started (:func:`busy_line`): their numbers are then not
comparable with a quiet machine's.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from ..threads import available_cores
from .train_step import PACKAGE_PARENT, measure, median, torch_installed

BUSY_LOOP = [sys.executable, "-c", "while True: pass"]
# A machine is busy when other work took at least this many cores in the second before
BUSY_CORES = 0.5


@contextlib.contextmanager
def competing(n: int) -> Iterator[list[subprocess.Popen]]:
    """``n`` CPU-bound processes running for the block (ended, and waited for, after it)."""
    loops = [subprocess.Popen(BUSY_LOOP) for _ in range(n)]
    try:
        yield loops
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def cores_in_use(seconds: float = 1.0) -> float:
    """How many cores the whole machine kept busy over the next ``seconds`` (``/proc/stat``;
    0.0 where it cannot be read)."""
    def times() -> list[int]:
        with open("/proc/stat") as stat:
            return [int(v) for v in stat.readline().split()[1:]]

    try:
        before = times()
        time.sleep(seconds)
        after = times()
    except OSError:
        return 0.0
    spent = [b - a for a, b in zip(before, after, strict=False)]
    idle = spent[3] + (spent[4] if len(spent) > 4 else 0)  # idle, iowait
    return (os.cpu_count() or 1) * (1 - idle / max(sum(spent), 1))


def busy_line(used: float) -> str | None:
    """One line of warning when ``used`` cores (:func:`cores_in_use`) were busy, else None."""
    if used < BUSY_CORES:
        return None
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"warning: the machine is busy (other work used {used:.1f} of {os.cpu_count()} "
            f"cores in the second before this benchmark, load average {load}): its numbers "
            f"are not comparable with a quiet machine's")


def thread_table(config: str, busy: int, steps: int, warmup: int, rounds: int) -> list[dict]:
    """One row per framework: its median step on the default threads and on one thread, with
    ``busy`` competing processes, the variants asked in turn (GPT-2's shape: one framework's
    two at a time, for memory)."""
    cores = available_cores()
    frameworks = [("ours", "numba")] + ([("PyTorch", "torch-sdpa")] if torch_installed() else [])
    groups = [frameworks] if config != "gpt2" else [[f] for f in frameworks]
    rows = []
    with competing(busy):
        for group in groups:
            variants = [(f"{name}, {n} thr", variant, n, n) for name, variant in group
                        for n in (cores, 1)]  # in turn: load from elsewhere hits all alike
            workers = measure(config, variants, steps, warmup, rounds)
            for (name, _), pair in zip(group, zip(workers[::2], workers[1::2], strict=True),
                                       strict=True):
                rows.append({"config": config, "busy": busy, "framework": name,
                             "threads": cores, "default": median(pair[0].times),
                             "one": median(pair[1].times)})
    return rows


def print_thread_rows(rows: list[dict]) -> None:
    """The threads table: a row per shape, competing processes and framework."""
    print("\n| shape | competing processes | framework | default threads (ms) | 1 thread (ms) "
          "| default / 1 thread | ours / PyTorch, default threads |")
    print("|---|---:|---|---:|---:|---:|---:|")
    torch = {(r["config"], r["busy"]): r["default"] for r in rows if r["framework"] != "ours"}
    for r in rows:
        key = (r["config"], r["busy"])
        ratio = (f"{r['default'] / torch[key]:.2f}" if r["framework"] == "ours" and key in torch
                 else "")
        print(f"| {r['config']} | {r['busy']} | {r['framework']} ({r['threads']} thr) | "
              f"{1e3 * r['default']:.1f} | {1e3 * r['one']:.1f} | "
              f"{r['default'] / r['one']:.2f} | {ratio} |", flush=True)


PROCESS_STEPS = 35
# A whole short process of the chapter's model, as a user's script makes it: build the model,
# make ``steps`` training steps (ours: a plain Trainer), exit
PROCESS = """
import sys
import numpy as np
from numpy_transformer.bench.configs import CONFIGS
from numpy_transformer.bench.train_step import _batches, _model, _torch_step
variant, steps = sys.argv[1], int(sys.argv[2])
config = CONFIGS["chapter"]
if variant == "torch":
    from numpy_transformer.threads import available_cores
    step = _torch_step(config, available_cores(), fused=True)
else:
    from numpy_transformer.optim import Adam
    from numpy_transformer.schedules import constant_lr
    from numpy_transformer.train import Batch, Trainer
    model = _model(config, backend="numba")
    trainer = Trainer(model, Adam(lr=1e-3, backend="numba"), constant_lr(1e-3), clip=1.0)
    data = [Batch((np.asarray(x),), np.asarray(y)) for x, y in _batches(config)]
    step = lambda i: trainer.step(data[i % len(data)])
for i in range(steps):
    step(i)
"""


# The library's first step: the command line's default run, built and stepped once
FIRST_STEP = """
import time
from numpy_transformer.runs.options import resolve_options
from numpy_transformer.runs.state import Run
run = Run(*resolve_options("lm", {"steps": 2}))
start = time.perf_counter()
run.trainer.step(run.batch(0))
print(time.perf_counter() - start)
"""


def seconds(argv: list[str], env: dict, cwd: Path) -> float:
    """Wall seconds of a fresh process ``argv``; RuntimeError with its error if it fails."""
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(argv[:4])} failed:\n{proc.stderr[-2000:]}")
    return time.perf_counter() - start


def installed_copy(folder: Path) -> Path:
    """A copy of this package in ``folder``, without its compiled caches: what ``pip install``
    lays out before the kernels are compiled. Returns the folder to put on the path."""
    site = folder / "site"
    shutil.copytree(Path(PACKAGE_PARENT) / "numpy_transformer", site / "numpy_transformer",
                    copy_function=shutil.copy, ignore=shutil.ignore_patterns("__pycache__"))
    return site


def first_runs(recipe: list[str], process_steps: int = PROCESS_STEPS) -> dict[str, float]:
    """Seconds of: the install's compile in a fresh copy of the package; there, the library's
    first ``Trainer.step`` (in a process of its own), ``numpy-transformer train --steps 1``
    first and warm, ``numpy-transformer train`` with ``recipe``'s options first and warm, a
    process of ``process_steps`` steps, ours and PyTorch's; and the first training step on an
    empty compile cache."""
    from . import cold_start

    with tempfile.TemporaryDirectory(prefix="nt-real-machine-") as scratch:
        folder = Path(scratch)
        site = installed_copy(folder)
        env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
        env["PYTHONPATH"] = str(site)
        py = sys.executable
        result = {"install compile": seconds([py, "-m", "numpy_transformer.compile_kernels"],
                                             env, folder)}
        done = subprocess.run([py, "-c", FIRST_STEP], capture_output=True, text=True, env=env,
                              cwd=folder, check=True)
        result["first Trainer.step"] = float(done.stdout.splitlines()[-1])
        train = [py, "-m", "numpy_transformer", "train", "--quiet", "--force"]
        for what, options in (("train --steps 1", ["--steps", "1"]), ("recipe", recipe)):
            for run in ("first run", "warm"):
                result[f"{what}, {run}"] = seconds(
                    [*train, *options, "--out", str(folder / f"run{len(result)}")], env, folder)
        result["process, ours"] = seconds([py, "-c", PROCESS, "ours", str(process_steps)],
                                          env, folder)
        if torch_installed():
            result["process, PyTorch"] = seconds([py, "-c", PROCESS, "torch",
                                                  str(process_steps)], env, folder)
    result["first step, empty cache"] = cold_start.first_steps(warm=False)["cold"]
    return result


def main(argv: list[str] | None = None) -> None:
    """The command line of ``benchmarks/bench_real_machine.py`` (see the module docstring)."""
    import argparse

    from .machine import machine_lines

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="chapter,wide,gpt2",
                        help="shapes of the threads table [chapter,wide,gpt2]")
    parser.add_argument("--busy", default="0,1", help="competing processes [0,1]")
    parser.add_argument("--recipe", default="",
                        help="options of the recipe's numpy-transformer train [the default run]")
    parser.add_argument("--no-threads", action="store_true", help="skip the threads table")
    parser.add_argument("--no-first-runs", action="store_true", help="skip the first runs")
    args = parser.parse_args(argv)
    warning = busy_line(cores_in_use())
    print("\n".join(machine_lines() + ([warning] if warning else [])), flush=True)
    if not args.no_threads:
        rows = []
        for config in args.configs.split(","):
            counts = (dict(steps=3, warmup=1, rounds=3) if config == "gpt2" else
                      dict(steps=8, warmup=2, rounds=4) if config == "wide" else
                      dict(steps=20, warmup=3, rounds=4))
            for busy in (int(b) for b in args.busy.split(",")):
                rows += thread_table(config, busy, **counts)
        print_thread_rows(rows)
    if not args.no_first_runs:
        result = first_runs(args.recipe.split())
        print("\n| what | seconds |\n|---|---:|")
        for what, value in result.items():
            print(f"| {what} | {value:.2f} |")
        first, warm = result["recipe, first run"], result["recipe, warm"]
        above = result["train --steps 1, first run"] - result["train --steps 1, warm"]
        print(f"\ntrain --steps 1: first run above warm {above:+.2f} s; recipe: first run / "
              f"warm {first / warm:.2f}" + (
            f"; {PROCESS_STEPS}-step process, ours / PyTorch "
            f"{result['process, ours'] / result['process, PyTorch']:.2f}"
            if "process, PyTorch" in result else ""))
    print(f"\nload average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

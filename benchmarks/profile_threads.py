"""Where a step's time goes when another process shares the cores: wall time against CPU time.

Usage (from the repository root)::

    python benchmarks/profile_threads.py                      # the chapter's model
    python benchmarks/profile_threads.py --config gpt2 --steps 2 --warmup 1 --repeats 2

Each variant trains in a process of its own, the variants in turn (A B C A B C ...), with 0
and with 1 competing CPU-bound process (``python -c "while True: pass"``, started here):

* ``2 thr, spin``: two Numba threads, whose OpenMP runtime spins for a while when it waits
  for the next parallel region, then sleeps: GNU libgomp's default, which the numba backend
  had before (its spin count, ``GOMP_SPINCOUNT=300000``, set explicitly: the backend leaves
  a wait the environment sets alone);
* ``2 thr, passive``: two threads that wait asleep, as the numba backend sets them up
  (``numpy_transformer/threads.py``);
* ``1 thr``: one thread.

Per step (the median over the measured steps, then over the repeats): the wall time, the
process's CPU time (user + system, ``getrusage``), their ratio, voluntary and involuntary
context switches, and the CPU time of each of the process's threads (``/proc/self/task``): a
thread that spins while it waits shows as CPU time that does no work, and the BLAS libraries'
own threads as threads with CPU time besides Numba's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's package

# name: (threads, environment of the OpenMP runtime's wait)
VARIANTS = {"2 thr, spin": (2, {"GOMP_SPINCOUNT": "300000"}),
            "2 thr, passive": (2, {"OMP_WAIT_POLICY": "PASSIVE"}), "1 thr": (1, {})}


def thread_cpu_ms() -> dict[str, float]:
    """CPU milliseconds of each thread of this process so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[tid] = 1e3 * (int(fields[11]) + int(fields[12])) / ticks
    return out


def worker(config_name: str, threads: int, steps: int, warmup: int) -> None:
    """Train ``warmup`` + ``steps`` steps; print the medians of the measured steps as JSON."""
    import numba
    import numpy as np

    from numpy_transformer.bench.configs import CONFIGS
    from numpy_transformer.bench.train_step import _batches, _model
    from numpy_transformer.optim import Adam
    from numpy_transformer.schedules import constant_lr
    from numpy_transformer.train import Batch, Trainer

    config = CONFIGS[config_name]
    model = _model(config, backend="numba")  # builds the backend: its threads' settings
    numba.set_num_threads(threads)
    trainer = Trainer(model, Adam(lr=1e-3, backend="numba"), constant_lr(1e-3), clip=1.0)
    data = [Batch((np.asarray(x),), np.asarray(y)) for x, y in _batches(config, 4)]
    for i in range(warmup):
        trainer.step(data[i % len(data)])
    rows, before_threads = [], thread_cpu_ms()
    for i in range(steps):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        trainer.step(data[i % len(data)])
        t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        rows.append({"wall": t1 - t0,
                     "cpu": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime,
                     "voluntary": r1.ru_nvcsw - r0.ru_nvcsw,
                     "involuntary": r1.ru_nivcsw - r0.ru_nivcsw})
    after_threads = thread_cpu_ms()
    per_thread = sorted(((after_threads[t] - before_threads.get(t, 0.0)) / steps
                         for t in after_threads), reverse=True)
    result = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    result["threads_ms"] = [round(ms, 1) for ms in per_thread]
    print(json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="chapter")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", type=int, metavar="THREADS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.config, args.worker, args.steps, args.warmup)
        return
    from numpy_transformer.bench.real_machine import busy_line, competing, cores_in_use
    from numpy_transformer.threads import WAIT_VARIABLES

    warning = busy_line(cores_in_use())
    if warning:
        print(warning)
    print(f"config {args.config}; per step: median of {args.steps} steps after {args.warmup}, "
          f"then of {args.repeats} processes per variant, in turn\n")
    print("| competing | variant | wall (ms) | CPU (ms) | CPU / wall | voluntary cs | "
          "involuntary cs | CPU of each thread (ms) | load |")
    print("|---:|---|---:|---:|---:|---:|---:|---|---:|")
    for busy in (0, 1):
        results = {name: [] for name in VARIANTS}
        with competing(busy):
            for _ in range(args.repeats):
                for name, (threads, wait) in VARIANTS.items():
                    env = {k: v for k, v in os.environ.items() if k not in WAIT_VARIABLES}
                    proc = subprocess.run(
                        [sys.executable, __file__, "--config", args.config, "--steps",
                         str(args.steps), "--warmup", str(args.warmup), "--worker",
                         str(threads)],
                        capture_output=True, text=True, env={**env, **wait}, check=True)
                    results[name].append(json.loads(proc.stdout.splitlines()[-1]))
                    results[name][-1]["load"] = os.getloadavg()[0]
        for name, rows in results.items():
            med = {k: statistics.median(r[k] for r in rows)
                   for k in ("wall", "cpu", "voluntary", "involuntary", "load")}
            print(f"| {busy} | {name} | {1e3 * med['wall']:.1f} | {1e3 * med['cpu']:.1f} | "
                  f"{med['cpu'] / med['wall']:.2f} | {med['voluntary']:.0f} | "
                  f"{med['involuntary']:.0f} | {rows[len(rows) // 2]['threads_ms']} | "
                  f"{med['load']:.1f} |", flush=True)


if __name__ == "__main__":
    main()

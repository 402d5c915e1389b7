"""Attention forward + backward: the fused Numba kernel, the NumPy reference and PyTorch.

Usage (from the repository root)::

    python benchmarks/bench_attention.py            # the full grid, takes a while
    python benchmarks/bench_attention.py --quick    # a small subset, a minute or two
    python benchmarks/bench_attention.py --chapter  # the chapter's char model: B x H = 64 x 4,
                                                    # T = 100, D = 21, causal

What is measured, for q, k, v of shape (B, H, T, D) = (4, 4, T, D) (``--chapter``: (64, 4, T, D)),
float32:

* time: one ``sdpa_forward`` + ``sdpa_backward`` with a random upstream gradient (for PyTorch:
  ``F.scaled_dot_product_attention`` + ``out.backward(g)``), median over repetitions after a
  warm-up call (the warm-up also compiles or loads the Numba kernels). The table also gives
  the ratio of the fastest repetitions and of the CPU time used (``time.process_time``: all
  threads, including time they spend spinning while waiting), both steadier than the medians
  on a machine shared with other work;
* peak memory: the most resident memory one forward + backward needs beyond its inputs,
  ``VmHWM - VmRSS`` read from ``/proc/self/status`` around the call (Linux). The peak counter
  is reset before the call by writing 5 to ``/proc/self/clear_refs``, and glibc is told to map
  every buffer above 128 KiB on allocation and unmap it on free (``MALLOC_MMAP_THRESHOLD_``),
  so the resident size follows the live buffers of NumPy, Numba and PyTorch alike. This runs
  in separate processes from the timing, which would be slowed by that setting.

Each implementation runs in its own worker process, so the thread pools of Numba, OpenBLAS and
PyTorch's OpenMP never wait on one another, and the main process asks the workers in turn,
size by size, so that a burst of load from elsewhere hits all of them alike. Causal attention
passes ``causal_mask(T)`` to the kernel and the reference (the kernel recognises it and skips
the upper triangle) and ``is_causal=True`` to PyTorch.
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
B, H = 4, 4
IMPLS = ("kernel", "numpy", "torch")


# ---------------------------------------------------------------------------------------------
# Worker side: one implementation, sizes read from stdin, one JSON result per line on stdout
# ---------------------------------------------------------------------------------------------

def make_step(impl: str, t: int, d: int, causal: bool, b: int = B):
    """A function doing one forward + backward of ``impl`` on fresh random inputs."""
    import numpy as np

    from numpy_transformer.functional.masks import causal_mask

    rng = np.random.default_rng(0)
    q, k, v, g = (rng.standard_normal((b, H, t, d)).astype(np.float32) for _ in range(4))
    mask = causal_mask(t) if causal else None
    if impl in ("kernel", "numpy"):
        if impl == "kernel":
            from numpy_transformer.kernels.attention import sdpa_backward, sdpa_forward
        else:
            from numpy_transformer.functional.attention import sdpa_backward, sdpa_forward

        def step():
            out, cache = sdpa_forward(q, k, v, mask)
            return sdpa_backward(g, cache)

        return step
    import torch
    import torch.nn.functional as F

    tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
    tg = torch.from_numpy(g)

    def step():
        out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
        out.backward(tg)
        grads = (tq.grad, tk.grad, tv.grad)
        tq.grad = tk.grad = tv.grad = None  # as for the others: the caller drops the gradients
        return grads

    return step


def status_kib() -> dict[str, int]:
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                name, value = line.split(":")
                fields[name] = int(value.split()[0])
    return fields


def time_step(step, budget: float, min_reps: int, max_reps: int) -> dict:
    t0 = time.perf_counter()
    step()  # warm-up: compiles or loads the kernels, touches the memory
    warm = time.perf_counter() - t0
    reps = max(min_reps, min(max_reps, int(budget / max(warm, 1e-6))))
    wall, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    wall.sort()
    cpu.sort()
    return {"median_ms": 1e3 * wall[reps // 2], "min_ms": 1e3 * wall[0],
            "cpu_median_ms": 1e3 * cpu[reps // 2], "reps": reps}


def peak_step(step) -> dict:
    step()  # warm-up
    before = status_kib()["VmRSS"]
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak (VmHWM) to the current resident size
    step()
    return {"peak_mib": (status_kib()["VmHWM"] - before) / 1024}


def worker(impl: str, memory: bool, budget: float, threads: int) -> None:
    if impl == "torch":
        import torch

        torch.set_num_threads(threads)
    if impl == "kernel":  # the numba backend's threads (backend.start_numba)
        from numpy_transformer.backend import get_backend

        get_backend("numba")
    print(json.dumps({"ready": True, **worker_info(impl)}), flush=True)
    for line in sys.stdin:
        cfg = json.loads(line)
        step = make_step(impl, cfg["t"], cfg["d"], cfg["causal"], cfg.get("b", B))
        if memory:
            result = peak_step(step)
        else:
            result = time_step(step, budget, cfg.get("min_reps", 3), cfg.get("max_reps", 25))
        del step
        print(json.dumps(result), flush=True)


def worker_info(impl: str) -> dict:
    if impl == "kernel":
        import numba

        import numpy_transformer.kernels.attention  # noqa: F401

        return {"numba_threads": numba.get_num_threads(), "numba": numba.__version__}
    if impl == "torch":
        import torch

        return {"torch_threads": torch.get_num_threads(), "torch": torch.__version__}
    return {}


# ---------------------------------------------------------------------------------------------
# Main side: start the workers, walk the grid, print the table
# ---------------------------------------------------------------------------------------------

class Worker:
    def __init__(self, impl: str, memory: bool, budget: float, threads: int):
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        for name in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                     "MKL_NUM_THREADS"):
            env[name] = str(threads)
        if memory:
            env["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
        cmd = [sys.executable, __file__, "--worker", impl, "--budget", str(budget),
               "--threads", str(threads)]
        if memory:
            cmd.append("--memory")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env, cwd=ROOT)
        self.info = json.loads(self.proc.stdout.readline())

    def ask(self, cfg: dict) -> dict:
        self.proc.stdin.write(json.dumps(cfg) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker died on {cfg}")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def machine_info() -> dict:
    import numpy as np

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "nproc": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__, "loadavg": os.getloadavg()}


def torch_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="T in {64, 256, 1024}, D = 32 only")
    p.add_argument("--chapter", action="store_true",
                   help="the chapter's char model only: B = 64, H = 4, T = 100, D = 21")
    p.add_argument("--no-numpy", action="store_true", help="skip the NumPy reference")
    p.add_argument("--no-torch", action="store_true", help="skip PyTorch")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory runs")
    p.add_argument("--numpy-max-t", type=int, default=2048,
                   help="largest T for the NumPy reference (it keeps B*H*T^2 floats)")
    p.add_argument("--budget", type=float, default=2.0,
                   help="seconds of repetitions per implementation and size (3 to 25 reps)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="threads for Numba, PyTorch and OpenBLAS (default: every CPU)")
    p.add_argument("--worker", choices=IMPLS, help=argparse.SUPPRESS)
    p.add_argument("--memory", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker, args.memory, args.budget, args.threads)
        return

    ts = (64, 256, 1024) if args.quick else (64, 128, 256, 512, 1024, 2048)
    ds = (32,) if args.quick else (16, 32, 64)
    impls = ["kernel"]
    if not args.no_torch and torch_available():
        impls.append("torch")
    if not args.no_numpy:
        impls.append("numpy")
    info = machine_info()
    print(f"# {info['cpu']}, {info['nproc']} CPUs, Python {info['python']}, "
          f"NumPy {info['numpy']}, {args.threads} threads each; "
          f"load average at start {info['loadavg']}", flush=True)
    grid = [(t, d, causal) for t in ts for d in ds for causal in (False, True)]
    batch = B
    if args.chapter:
        grid, batch = [(100, 21, True)], 64
    results = {}
    for memory in ([False] if args.no_memory else [False, True]):
        workers = {impl: Worker(impl, memory, args.budget, args.threads) for impl in impls}
        if not memory:
            for w in workers.values():
                extra = {k: v for k, v in w.info.items() if k != "ready"}
                if extra:
                    print(f"# {extra}", flush=True)
        for t, d, causal in grid:
            for impl, w in workers.items():
                if impl == "numpy" and t > args.numpy_max_t:
                    continue
                cfg = {"t": t, "d": d, "causal": causal, "b": batch}
                results.setdefault((t, d, causal, impl), {}).update(w.ask(cfg))
            if not memory:
                row = {impl: results.get((t, d, causal, impl), {}) for impl in impls}
                print(f"# T={t} D={d} causal={causal}: " + ", ".join(
                    f"{impl} {r['median_ms']:.2f} ms" for impl, r in row.items() if r),
                    flush=True)
        for w in workers.values():
            w.close()

    def get(t, d, causal, impl, key):
        return results.get((t, d, causal, impl), {}).get(key)

    has_torch, has_numpy = "torch" in impls, "numpy" in impls
    head = ["T", "D", "causal", "kernel ms"]
    head += ["torch ms", "kernel/torch", "ratio of minima", "ratio of CPU times"] \
        if has_torch else []
    head += ["numpy ms", "numpy/kernel"] if has_numpy else []
    if not args.no_memory:
        head += ["kernel MiB"] + (["torch MiB"] if has_torch else []) + (
            ["numpy MiB"] if has_numpy else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t, d, causal in grid:
        kt = get(t, d, causal, "kernel", "median_ms")
        row = [str(t), str(d), "yes" if causal else "no", fmt(kt, 2)]
        if has_torch:
            tt = get(t, d, causal, "torch", "median_ms")
            kmin, tmin = get(t, d, causal, "kernel", "min_ms"), get(t, d, causal, "torch", "min_ms")
            kcpu = get(t, d, causal, "kernel", "cpu_median_ms")
            tcpu = get(t, d, causal, "torch", "cpu_median_ms")
            row += [fmt(tt, 2), fmt(kt / tt if tt else None, 2),
                    fmt(kmin / tmin if tmin else None, 2), fmt(kcpu / tcpu if tcpu else None, 2)]
        if has_numpy:
            nt = get(t, d, causal, "numpy", "median_ms")
            row += [fmt(nt, 2), fmt(nt / kt if nt else None, 1)]
        if not args.no_memory:
            row += [fmt(get(t, d, causal, "kernel", "peak_mib"))]
            row += [fmt(get(t, d, causal, "torch", "peak_mib"))] if has_torch else []
            row += [fmt(get(t, d, causal, "numpy", "peak_mib"))] if has_numpy else []
        lines.append("| " + " | ".join(row) + " |")
    print("\n".join(lines))
    print(f"# load average at end {os.getloadavg()}")


if __name__ == "__main__":
    main()

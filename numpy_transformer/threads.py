"""Thread settings for a small, shared CPU: Numba's threads, the BLAS libraries, the cores.

With the numba backend every part of a training step runs on Numba's one pool of threads:
the fused kernels split their work themselves (``prange``), and the linear layers cut their
rows into chunks that the threads multiply side by side (``kernels/linear.py``), each chunk a
single-threaded BLAS call. Three settings keep those threads from hurting on a machine that
runs other work too (``benchmarks/README.md`` has the measurements behind each):

* :func:`use_cores`, the numba backend's thread settings (``backend.py`` calls it before any
  kernel runs): Numba's threads wait for work asleep, not spinning, and there are as many as
  the cores this process may use. A step is a few dozen parallel regions, each ending with a
  wait for the slowest thread. A thread that spins through that wait holds a core that
  another process needs, or that the very thread it waits for needs: beside one other busy
  process, a step on two spinning threads was slower than on one thread.
* :func:`blas_on_calling_thread` is what the kernels use around their calls: NumPy's BLAS,
  which the kernels call, and SciPy's (their fallback, and Numba's ``np.dot``), run each call
  on the thread that makes it: no BLAS threads inside Numba's.
* :func:`set_blas_threads` sets the thread count of every OpenBLAS loaded in the process, at
  run time, without the environment variable that only works before NumPy is imported. The
  command line runs BLAS on one thread.
* :func:`alone_below` runs a kernel on the calling thread alone when its call has fewer than
  ``FEW_ROWS`` rows: a generation step's one row is less work than waking the pool's
  sleeping threads, and on a busy machine a woken thread first waits for a core. The kernels
  give the same bits on any number of threads, so this changes no number.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import os
from collections.abc import MutableMapping
from pathlib import Path

# OpenBLAS builds name the setter differently: plain, scipy-openblas, 64-bit-integer variants
_SETTERS = ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_",
            "scipy_openblas_set_num_threads", "openblas_set_num_threads64_")
# What an OpenMP runtime reads when it loads about how its threads wait for the next parallel
# region: the standard variable, GNU libgomp's spin count, LLVM's and Intel's block time
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
CGROUP_ROOT = Path("/sys/fs/cgroup")
FEW_ROWS = 256  # rows of a kernel call below which no thread but the calling one works


def _loaded_openblas() -> list[str]:
    """Paths of the OpenBLAS libraries mapped into this process (Linux; elsewhere none)."""
    try:
        with open("/proc/self/maps") as maps:
            return sorted({line.split()[-1] for line in maps if "openblas" in line.lower()
                           and line.split()[-1].startswith("/")})
    except OSError:
        return []


def _quota_cores(quota: str, period: str) -> int | None:
    """``ceil(quota / period)`` of a control group's CPU limit, or None where it sets none."""
    try:
        q, p = int(quota), int(period)
    except ValueError:  # "max": no limit
        return None
    return max(1, math.ceil(q / p)) if q > 0 and p > 0 else None


def cgroup_cores(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")
                 ) -> int | None:
    """The cores that the CPU quota of this process's control group allows (a container's
    ``--cpus``), or None where no quota is set or none can be read.

    Reads cgroup v2's ``cpu.max`` and v1's ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us``, in
    the group that ``proc_cgroup`` names and in every group above it: the smallest counts.
    """
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        _, controllers, group = line.split(":", 2)
        if controllers == "":  # v2: one hierarchy, one file
            base, names = root, ("cpu.max",)
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's hierarchy
            base, names = root / controllers, ("cpu.cfs_quota_us", "cpu.cfs_period_us")
        else:
            continue
        folder = base / group.lstrip("/")
        for parent in (folder, *folder.parents):
            try:
                values = " ".join((parent / name).read_text() for name in names).split()
            except OSError:
                values = []
            if len(values) == 2:
                limits.append(_quota_cores(*values))
            if parent == base:
                break
    limits = [n for n in limits if n is not None]
    return min(limits) if limits else None


def available_cores() -> int:
    """The CPU cores this process may use: those it may run on (its affinity), at most as
    many as its control group's CPU quota allows (:func:`cgroup_cores`)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    quota = cgroup_cores()
    return cores if quota is None else min(cores, quota)


def use_cores(environ: MutableMapping[str, str] | None = None) -> int:
    """Set Numba's threads up for a machine that runs other work too; returns their count.

    * Waiting threads sleep: ``OMP_WAIT_POLICY=PASSIVE`` for the OpenMP runtime of Numba's
      threading layer, unless the environment sets one of ``WAIT_VARIABLES`` itself. The
      runtime reads it when it loads, which is when Numba first starts its threads: this
      must run before (the numba backend calls it when it is built); later, only the count
      changes.
    * As many threads as :func:`available_cores`, unless ``NUMBA_NUM_THREADS`` is set.

    Parameters
    ----------
    environ : mapping, optional
        The environment to read and set; default ``os.environ``.
    """
    import numba

    environ = os.environ if environ is None else environ
    if not any(name in environ for name in WAIT_VARIABLES):
        environ["OMP_WAIT_POLICY"] = "PASSIVE"
    if "NUMBA_NUM_THREADS" not in environ:  # never more than the caller has set already
        numba.set_num_threads(min(numba.get_num_threads(), available_cores()))
    return numba.get_num_threads()


def set_blas_threads(n: int) -> int:
    """Run every loaded OpenBLAS on ``n`` threads; returns how many libraries were set.

    Parameters
    ----------
    n : int
        Threads per BLAS call, at least 1.

    Raises
    ------
    ValueError
        If ``n`` is not a positive integer.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"BLAS threads must be a positive integer, got {n!r}")
    count = 0
    for path in _loaded_openblas():
        lib = ctypes.CDLL(path)
        for name in _SETTERS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter.argtypes = [ctypes.c_int]
                setter(n)
                count += 1
                break
    return count


def numpy_extension_path() -> str:
    """Path of NumPy's core extension module, which links NumPy's BLAS."""
    import numpy as np

    core = getattr(np, "_core", None) or np.core  # NumPy 2 / NumPy 1
    return core._multiarray_umath.__file__


def _thread_functions(path: str, names: tuple[tuple[str, str], ...]):
    """``(get, set)`` of the first (getter, setter) symbol pair found through the shared
    library or extension module at ``path`` (``dlsym`` semantics: its dependencies too)."""
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    for get_name, set_name in names:
        get, set_ = getattr(lib, get_name, None), getattr(lib, set_name, None)
        if get is not None and set_ is not None:
            get.restype, set_.argtypes = ctypes.c_int, [ctypes.c_int]
            return get, set_
    return None


def _openblas_thread_functions() -> tuple:
    """``(get, set)`` pairs for the thread counts of the BLAS libraries the kernels call.

    * NumPy's, which ``kernels/blas.py`` calls for the kernels' products.
    * SciPy's, the one of ``scipy.linalg.cython_blas``: their fallback where NumPy's is not
      an ILP64 OpenBLAS, and what Numba's ``np.dot`` calls.

    The wheels of both ship OpenBLAS, which runs each call on its own pool of threads. Called
    from both of our parallel loop's threads at once, those calls queue for the one pool: on 2
    cores the kernel was then slower on 2 threads than on 1 (and, with PyTorch loaded,
    OpenBLAS printed "Detect OpenMP Loop" warnings). So during a kernel call OpenBLAS runs
    each call on the calling thread. Other BLAS builds have no such symbols: nothing changes.
    """
    pairs = []
    try:
        import scipy.linalg.cython_blas as cython_blas

        pairs.append(_thread_functions(cython_blas.__file__, (
            ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
            ("openblas_get_num_threads", "openblas_set_num_threads"))))
    except ImportError:
        pass
    pairs.append(_thread_functions(numpy_extension_path(), (
        ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
        ("openblas_get_num_threads64_", "openblas_set_num_threads64_"))))
    return tuple(p for p in pairs if p is not None)


@contextlib.contextmanager
def blas_on_calling_thread():
    """Within the block, every BLAS call of the Numba kernels runs on the thread that makes it."""
    pairs = _BLAS_THREADS()
    before = [get() for get, _ in pairs]
    for _, set_ in pairs:
        set_(1)
    try:
        yield
    finally:
        for (_, set_), n in zip(pairs, before, strict=True):
            set_(n)


_BLAS_THREADS = functools.cache(_openblas_thread_functions)


@contextlib.contextmanager
def alone_below(rows: int):
    """Within the block Numba's parallel regions run on the calling thread alone if ``rows``
    (those of the kernel call the block holds) are fewer than ``FEW_ROWS``; else as before."""
    if rows >= FEW_ROWS:
        yield
        return
    import numba

    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(before)

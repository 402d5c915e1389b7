"""Thread settings that matter on a small CPU: the BLAS libraries against Numba's threads.

With the numba backend every part of a training step runs on Numba's one pool of threads:
the fused kernels split their work themselves (``prange``), and the linear layers cut their
rows into chunks that the threads multiply side by side (``kernels/linear.py``), each chunk a
single-threaded BLAS call. A second pool must then stay idle: left at its default, OpenBLAS
starts one thread per core, and its threads keep spinning between calls, taking the cores the
Numba threads want. Measured on 2 cores, before the linear layers moved onto Numba's threads,
a training step of the chapter's model took 242 ms with both pools on 2 threads against
122 ms with BLAS on one thread (``benchmarks/README.md``).

* :func:`set_blas_threads` sets the thread count of every OpenBLAS loaded in the process, at
  run time, without the environment variable that only works before NumPy is imported. The
  command line runs BLAS on one thread; library users on the numba backend should too.
* :func:`blas_on_calling_thread` is what the kernels use around their calls: NumPy's BLAS,
  which the kernels call, and SciPy's (their fallback, and Numba's ``np.dot``), run each call
  on the thread that makes it.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os

# OpenBLAS builds name the setter differently: plain, scipy-openblas, 64-bit-integer variants
_SETTERS = ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_",
            "scipy_openblas_set_num_threads", "openblas_set_num_threads64_")


def _loaded_openblas() -> list[str]:
    """Paths of the OpenBLAS libraries mapped into this process (Linux; elsewhere none)."""
    try:
        with open("/proc/self/maps") as maps:
            return sorted({line.split()[-1] for line in maps if "openblas" in line.lower()
                           and line.split()[-1].startswith("/")})
    except OSError:
        return []


def available_cores() -> int:
    """The CPU cores this process may run on (Numba's default thread count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


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

"""Thread settings that matter on a small CPU: numpy's BLAS against numba's parallel kernels.

With the numba backend, the fused kernels split their work over the cores themselves
(``prange``), while the matrix products go to the BLAS that NumPy ships (OpenBLAS). Left at
its default, OpenBLAS also starts one thread per core, and its threads keep spinning between
calls, taking the cores the numba kernels want: measured on 2 cores, a training step of the
chapter's model took 242 ms that way against 122 ms with BLAS on one thread
(``benchmarks/README.md``). :func:`set_blas_threads` changes the thread count of every
OpenBLAS loaded in the process, at run time, without the environment variable that only
works before NumPy is imported.
"""

from __future__ import annotations

import ctypes

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

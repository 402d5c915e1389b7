"""What the benchmarks run on: the processor, its SIMD level, and the BLAS that does the products.

A step's speed depends as much on the BLAS kernels as on the library: on an AVX-512 CPU,
OpenBLAS forced to its Haswell (AVX2) kernels multiplies float32 matrices at about half the
rate of its native SkylakeX ones (``benchmarks/README.md``). Nothing else would tell a user
so, so the benchmarks print:

* :func:`cpu_line`: the processor's model and its SIMD level, from NumPy's runtime
  information (``__cpu_features__``, what ``np.show_runtime()`` shows);
* :func:`blas_line`: every BLAS loaded, from ``threadpoolctl``: library, version, the kernel
  architecture it chose and its threads, and which one the numba kernels call;
* :func:`kernel_warning`: one line when a BLAS runs kernels older than the CPU supports,
  naming ``OPENBLAS_CORETYPE`` when it is set (it overrides OpenBLAS's detection when the
  library loads).

``python -m numpy_transformer.bench.machine`` prints these lines.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

# x86 SIMD levels, oldest first
SIMD_LEVELS = ("SSE2", "SSE3", "SSE4.2", "AVX", "AVX2", "AVX-512")
# The level a CPU has, from NumPy's feature names: each level needs all of its features
# (AVX512_SKX is Skylake-X's group, F CD BW DQ VL, what OpenBLAS's SkylakeX kernels use)
_LEVEL_FEATURES = {"SSE3": ("SSE3",), "SSE4.2": ("SSE42",), "AVX": ("AVX",),
                   "AVX2": ("AVX2", "FMA3"), "AVX-512": ("AVX512_SKX",)}
# The level each of OpenBLAS's x86 kernel families (its DYNAMIC_ARCH core names) is written for
OPENBLAS_KERNEL_LEVELS = {
    "prescott": "SSE3", "core2": "SSE3", "penryn": "SSE3", "dunnington": "SSE3",
    "atom": "SSE3", "opteron": "SSE2", "barcelona": "SSE3", "bobcat": "SSE3",
    "nehalem": "SSE4.2", "sandybridge": "AVX", "bulldozer": "AVX", "piledriver": "AVX",
    "steamroller": "AVX", "excavator": "AVX2", "haswell": "AVX2", "zen": "AVX2",
    "skylakex": "AVX-512", "cooperlake": "AVX-512", "sapphirerapids": "AVX-512",
}
CORETYPE_VARIABLE = "OPENBLAS_CORETYPE"


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo`` on Linux, else ``platform``'s)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_features() -> dict[str, bool]:
    """NumPy's runtime detection of the CPU's features (``np.show_runtime()`` shows them)."""
    import numpy as np

    core = getattr(np, "_core", None) or np.core  # NumPy 2 / NumPy 1
    return dict(core._multiarray_umath.__cpu_features__)


def simd_level(features: Mapping[str, bool]) -> str | None:
    """The newest of :data:`SIMD_LEVELS` whose features are all in ``features`` (NumPy's
    names), or None for a CPU that is not x86 (no SSE2)."""
    if not features.get("SSE2"):
        return None
    return next((level for level in reversed(SIMD_LEVELS[1:])
                 if all(features.get(f) for f in _LEVEL_FEATURES[level])), "SSE2")


def blas_libraries() -> list[dict]:
    """``threadpoolctl``'s record of each BLAS loaded once NumPy's and SciPy's (the one of
    Numba's ``np.dot``) are: ``internal_api``, ``version``, ``architecture``,
    ``num_threads``, ``filepath``."""
    import numpy  # noqa: F401 -- loads NumPy's BLAS
    import scipy.linalg.cython_blas  # noqa: F401 -- and SciPy's
    from threadpoolctl import threadpool_info

    return [lib for lib in threadpool_info() if lib["user_api"] == "blas"]


def _owner(filepath: str) -> str:
    """Whose copy a library is, from the folder a wheel puts it in (``numpy.libs``)."""
    folder = Path(filepath).parent.name
    return folder.removesuffix(".libs") if folder.endswith(".libs") else Path(filepath).name


def blas_line(libraries: Sequence[dict], kernels_call: str) -> str:
    """One line naming each BLAS of ``libraries`` (:func:`blas_libraries`) and
    ``kernels_call``, the owner of the one the numba kernels call (``"numpy"``, ``"scipy"``)."""
    if not libraries:
        return "BLAS: none found by threadpoolctl"
    parts = [f"{_owner(lib['filepath'])}'s {lib['internal_api']} {lib['version']}, "
             f"{lib.get('architecture') or 'unknown'} kernels, {lib['num_threads']} thread(s)"
             for lib in libraries]
    return (f"BLAS: {'; '.join(parts)}; the numba kernels call {kernels_call}'s, one BLAS "
            "thread per kernel thread")


def kernel_warning(libraries: Sequence[dict], features: Mapping[str, bool],
                   environ: Mapping[str, str]) -> str | None:
    """A one-line warning when an OpenBLAS of ``libraries`` runs kernels older than the CPU.

    Parameters
    ----------
    libraries : sequence of dict
        :func:`blas_libraries`' records.
    features : mapping
        :func:`cpu_features`.
    environ : mapping
        The environment the libraries were loaded in (``os.environ``).

    Returns
    -------
    str or None
        The warning, or None when every OpenBLAS uses the CPU's newest SIMD level (or its
        kernels are not known here: another BLAS, another architecture).
    """
    cpu = simd_level(features)
    if cpu is None:
        return None
    old = sorted({lib["architecture"] for lib in libraries if lib["internal_api"] == "openblas"
                  and SIMD_LEVELS.index(OPENBLAS_KERNEL_LEVELS.get(
                      str(lib.get("architecture")).lower(), cpu)) < SIMD_LEVELS.index(cpu)})
    if not old:
        return None
    kernels = ", ".join(f"{a} ({OPENBLAS_KERNEL_LEVELS[a.lower()]})" for a in old)
    forced = environ.get(CORETYPE_VARIABLE)
    cause = (f"{CORETYPE_VARIABLE}={forced} is set and chooses them; unset it" if forced else
             "its build or CPU detection chose them; try another OpenBLAS")
    return (f"warning: OpenBLAS runs its {kernels} kernels on a CPU with {cpu}: matrix "
            f"products run below this machine's rate ({cause})")


def _kernels_call() -> str:
    """Whose BLAS the numba kernels call (``kernels/blas.py``): NumPy's, else SciPy's."""
    import numpy as np

    from ..kernels.blas import gemm_address

    return "numpy" if gemm_address(np.float32) > 0 else "scipy"


def installed(name: str) -> str:
    """The installed version of distribution ``name``, or ``"not installed"``."""
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def cpu_line() -> str:
    """Processor, SIMD level, core count, versions and the load average."""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    return (f"{cpu_model()}, SIMD {simd_level(cpu_features()) or 'not x86'} (NumPy's runtime "
            f"detection), nproc {os.cpu_count()}, Python {platform.python_version()}, NumPy "
            f"{installed('numpy')}, Numba {installed('numba')}, torch {installed('torch')}; "
            f"load average {load}")


def machine_lines() -> list[str]:
    """:func:`cpu_line`, :func:`blas_line` and, when there is one, :func:`kernel_warning`."""
    libraries = blas_libraries()
    warning = kernel_warning(libraries, cpu_features(), os.environ)
    return [cpu_line(), blas_line(libraries, _kernels_call())] + ([warning] if warning else [])


if __name__ == "__main__":
    print("\n".join(machine_lines()))

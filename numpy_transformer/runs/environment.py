"""The environment variables the command line reads, checked once before a command runs.

A bad value is input like a bad option: one line and exit 2 from every command, before any
work starts, instead of a traceback from wherever the variable is first read.
"""

from __future__ import annotations

import os

from ..config import KERNELS_VARIABLE
from .options import STEPS_VARIABLE, steps_from_environment
from .outputs import UsageError

# Every variable a command reads, and what it sets. The thread counts are read by Numba and
# OpenBLAS when they load; a value they do not understand they ignore, silently.
VARIABLES = {
    KERNELS_VARIABLE: "the kernels the numba backend takes (numpy_transformer/backend.py)",
    STEPS_VARIABLE: "the default of train --steps (a quick walk through the commands)",
    "NUMBA_NUM_THREADS": "the threads of the numba kernels, a positive integer (at most the "
                         "machine's CPUs)",
    "OMP_NUM_THREADS": "the threads of OpenMP, positive integers separated by commas",
}


def _thread_count(name: str, value: str) -> None:
    """Refuse a thread count that is not positive integers separated by commas, and a Numba
    pool larger than the machine: Numba starts every thread of its pool at the first parallel
    kernel, and tens of thousands of them crash the interpreter (a segmentation fault, seen
    with 99999), where more threads than CPUs only wait for each other anyway."""
    parts = value.split(",") if name == "OMP_NUM_THREADS" else [value]
    if not all(part.strip().isdigit() and int(part) > 0 for part in parts):
        raise UsageError(f"{name}={value!r}: expected {VARIABLES[name].split(', ', 1)[1]}")
    cpus = os.cpu_count() or 1
    if name == "NUMBA_NUM_THREADS" and int(value) > cpus:
        raise UsageError(f"{name}={value!r}: at most {cpus}, the CPUs of this machine (Numba's "
                         f"own default)")


def check_environment() -> None:
    """Check every variable of :data:`VARIABLES` that the environment sets.

    Raises
    ------
    UsageError
        Naming the variable, its value and what it takes.
    """
    for name in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS"):
        if name in os.environ:
            _thread_count(name, os.environ[name])
    steps_from_environment()
    if KERNELS_VARIABLE in os.environ:
        from ..backend import kernel_selection  # NumPy and the kernel modules: only if set

        try:
            kernel_selection()
        except ValueError as e:
            raise UsageError(str(e)) from None

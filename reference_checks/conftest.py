"""Shared by the PyTorch checks: one BLAS thread, and a summary of the worst errors.

Every matrix in these checks is tiny. With several threads per library (NumPy's OpenBLAS and
torch's own pool), each small product waits on thread hand-offs, and on a busy machine a
50-step run that takes half a second on one thread took half a minute. Results do not depend
on the thread count beyond rounding, and the tolerances allow for rounding.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest


def _numpy_openblas():
    """``(get, set)`` of the thread count of NumPy's bundled OpenBLAS, or ``None``."""
    try:
        lib = ctypes.CDLL(np._core._multiarray_umath.__file__)
    except (AttributeError, OSError):
        return None
    for get_name, set_name in (("scipy_openblas_get_num_threads64_",
                                "scipy_openblas_set_num_threads64_"),
                               ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
                               ("openblas_get_num_threads", "openblas_set_num_threads")):
        get, set_ = getattr(lib, get_name, None), getattr(lib, set_name, None)
        if get is not None and set_ is not None:
            get.restype, set_.argtypes = ctypes.c_int, [ctypes.c_int]
            return get, set_
    return None


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Run NumPy's BLAS and torch on one thread for the whole session; restore afterwards."""
    blas = _numpy_openblas()
    blas_before = blas[0]() if blas else None
    if blas:
        blas[1](1)
    torch = None
    try:
        import torch
    except ImportError:
        pass
    torch_before = torch.get_num_threads() if torch else None
    if torch:
        torch.set_num_threads(1)
    yield
    if blas:
        blas[1](blas_before)
    if torch:
        torch.set_num_threads(torch_before)


def pytest_terminal_summary(terminalreporter):
    from reference_checks.compare import WORST

    if not WORST:
        return
    terminalreporter.section("worst relative error against PyTorch, per family")
    for (family, dtype), (err, name) in sorted(WORST.items()):
        terminalreporter.write_line(f"  {family:<30}{dtype:<9}{err:10.2e}   {name}")

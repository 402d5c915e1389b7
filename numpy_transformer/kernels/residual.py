"""The residual addition on every core: a drop-in for ``nn/blocks.py``'s NumPy one.

Same contract as the reference ``np.add(x, sub, out=sub)``: ``sub += x``, in place, returning
``sub`` (checked against it in ``tests/test_kernels_step.py``). A transformer block adds into
its residual stream twice forward and twice backward; at the char model's shape, (64, 100, 84)
float32, NumPy's single-threaded addition took 0.17 ms in cache and this one 0.06.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..functional.fused import check_residual
from ._jit import jit_options
from ._validate import check_kernel_float

# The operations this module gives the numba backend (numpy_transformer.backend)
__all__ = ['add_into']


@njit(parallel=True, **jit_options())
def _add_into_kernel(x, sub):  # pragma: no cover - compiled
    # x, sub: (N,) flat views of the same shape
    for i in prange(x.size):
        sub[i] += x[i]


def add_into(x: np.ndarray, sub: np.ndarray) -> np.ndarray:
    """``sub += x`` in place; returns ``sub``. Both arrays share shape and dtype.

    Arrays that are not C-contiguous, or of two dtypes, go to NumPy's addition.
    """
    check_residual(x, sub)
    check_kernel_float("x", x)
    check_kernel_float("sub", sub)
    if x.flags.c_contiguous and sub.flags.c_contiguous and x.dtype == sub.dtype:
        _add_into_kernel(x.reshape(-1), sub.reshape(-1))
        return sub
    return np.add(x, sub, out=sub)

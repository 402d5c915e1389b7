"""The error function, vectorised by numba (NumPy has no ``erf`` of its own).

The readable reference is :func:`erf_reference`, Python's ``math.erf`` applied entry by entry;
``tests/test_functional.py`` checks the two agree to the last bit.
"""

from __future__ import annotations

import math

import numba
import numpy as np


@numba.vectorize(["float32(float32)", "float64(float64)"], cache=True)
def erf(x):  # pragma: no cover - compiled
    """Elementwise ``erf(x)`` in the dtype of ``x``."""
    return math.erf(x)


def erf_reference(x: np.ndarray) -> np.ndarray:
    """Elementwise ``math.erf``: slow, obviously right."""
    return np.frompyfunc(math.erf, 1, 1)(x).astype(x.dtype)

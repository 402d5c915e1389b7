"""Shared by the tests of the row-chunked kernels (``kernels/linear.py``,
``kernels/feedforward.py``, ``kernels/head_loss.py``): tolerances, the relative error, the
gradients' comparison, the two-thread marker; the way a test calls a helper of the compiled
kernels."""

from __future__ import annotations

import numba
import numpy as np
import pytest

TOL = {np.float64: 1e-12, np.float32: 1e-5}  # kernel against reference, relative
# comparing one thread with two needs two
multi_thread = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2,
                                  reason="needs two Numba threads")


def rel_err(a, b) -> float:
    """max |a - b| relative to the largest |b|, in float64; the shapes must agree."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a - b).max() / np.abs(b).max())


def assert_gradients_match(got: tuple, want: tuple, dtype) -> None:
    """A kernel's ``(dx, dw, db)`` against its reference's: the same ``None``, dtype and shape,
    and within ``TOL`` relative (``db`` is ``None`` without a bias)."""
    for name, g, w in zip(("dx", "dw", "db"), got, want, strict=True):
        if w is None:
            assert g is None, name
            continue
        assert g.dtype == dtype and g.shape == w.shape, name
        assert rel_err(g, w) <= TOL[dtype], f"{name}: {rel_err(g, w):.3g}"


def from_python(helper):
    """``helper``, a helper of the compiled kernels (``kernels/_jit.py``: built without a
    wrapper for calls from Python), callable from Python: through a compiled function."""
    return numba.njit(lambda *args: helper(*args))

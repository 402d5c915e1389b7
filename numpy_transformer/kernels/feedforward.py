"""The ReLU feed-forward network in one pass over its rows: ``out = max(x w1 + b1, 0) w2 + b2``.

Same contract and result as its reference, the composition linear -> ReLU -> linear of the
same names in ``functional/fused.py`` (``tests/test_kernel_feedforward.py`` checks the kernel
against it, float32 and float64):

* ``out, cache = relu_ffn_forward(x, w1, b1, w2, b2)``
* ``dx, dw1, db1, dw2, db2 = relu_ffn_backward(dout, cache)``

Why one kernel: the rows are cut into chunks, as in ``kernels/linear.py`` (read that file
first), and each chunk goes through both products and the ReLU while it is in the core's
cache. Apart, the down-projection read the hidden activations h, (N, F), back from memory, and
in the backward pass its gradient dh was written to memory and read back by the
up-projection's. For one chunk of rows::

    forward   h   = max(x w1 + b1, 0)                       (1), (2)  kept for the backward
              out = h w2 + b2                               (3)
    backward  dh  = (dout w2^T) [h > 0]                     (3), then (2): h > 0 exactly where
              dw2 += h^T dout,   db2 += sum_rows dout       (3)         x w1 + b1 > 0
              dx  = dh w1^T                                 (1)
              dw1 += x^T dh,     db1 += sum_rows dh         (1)

As in ``kernels/linear.py`` each chunk writes its own partial weight gradients (bias
gradients in float64), added at the end; the chunks depend only on the number of rows, so
results are the same bit for bit on any number of threads, and the same as the linear
kernels' with the ReLU applied between them. Few rows go to the reference.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from .._checks import check_last_dim, check_shaped
from ..functional import fused as reference
from ..functional.fused import FeedForwardCache
from ..threads import blas_on_calling_thread
from ._jit import jit_options
from ._validate import check_cache, check_consistent, check_kernel_float
from .blas import gemm, gemm_address
from .linear import _chunks, _use_reference

# The operations this module gives the numba backend (numpy_transformer.backend)
__all__ = ['relu_ffn_forward', 'relu_ffn_backward']

_JIT = jit_options()


@njit(parallel=True, **_JIT)
def _forward_kernel(x, w1, b1, w2, b2, n_chunks, gemm_fn, h, out):  # pragma: no cover
    # x: (N, C), w1: (C, F), b1: (F,), w2: (F, C), b2: (C,) -> h: (N, F), out: (N, C)
    n = x.shape[0]
    step = -(-n // n_chunks)
    for c in prange(n_chunks):
        lo, hi = c * step, min(n, (c + 1) * step)
        hc, oc = h[lo:hi], out[lo:hi]
        gemm(x[lo:hi], w1, hc, gemm_fn)  # (1) x w1
        for i in range(hi - lo):
            for j in range(hc.shape[1]):
                a = hc[i, j] + b1[j]  # (1) + b1
                if a <= 0:  # (2) max(a, 0): a NaN fails the test and stays NaN
                    a = 0.0
                hc[i, j] = a
        gemm(hc, w2, oc, gemm_fn)  # (3) h w2, with h's chunk in cache
        for i in range(hi - lo):
            for j in range(oc.shape[1]):
                oc[i, j] += b2[j]  # (3) + b2


@njit(parallel=True, **_JIT)
def _backward_kernel(dout, x, h, w1, w2, n_chunks, n_threads, gemm_fn, dx, dw1_part, db1_part,
                     dw2_part, db2_part):  # pragma: no cover - compiled
    # dout: (N, C), x: (N, C), h: (N, F) -> dx: (N, C), dw1_part: (chunks, C, F),
    # db1_part: (chunks, F) float64, dw2_part: (chunks, F, C), db2_part: (chunks, C) float64
    n, f = h.shape
    step = -(-n // n_chunks)
    scratch = np.empty((n_threads, step * f), h.dtype)  # one chunk's dh per thread
    for c in prange(n_chunks):
        lo, hi = c * step, min(n, (c + 1) * step)
        g, hc = dout[lo:hi], h[lo:hi]
        dh = scratch[numba.get_thread_id(), :(hi - lo) * f].reshape((hi - lo, f))
        # (3) out = h w2 + b2  =>  dh = dout w2^T,  dw2 = h^T dout,  db2 = sum_N dout
        gemm(g, w2.T, dh, gemm_fn)
        for i in range(hi - lo):
            for j in range(f):  # (2) h = max(a, 0)  =>  da = dh [a > 0] = dh [h > 0]
                dh[i, j] = dh[i, j] if hc[i, j] > 0 else 0.0 * dh[i, j]  # 0 * NaN stays NaN
        gemm(hc.T, g, dw2_part[c], gemm_fn)
        acc = db2_part[c]
        for i in range(hi - lo):
            for j in range(g.shape[1]):
                acc[j] += g[i, j]
        # (1) a = x w1 + b1  =>  dx = da w1^T,  dw1 = x^T da,  db1 = sum_N da
        gemm(dh, w1.T, dx[lo:hi], gemm_fn)
        gemm(x[lo:hi].T, dh, dw1_part[c], gemm_fn)
        acc = db1_part[c]
        for i in range(hi - lo):
            for j in range(f):
                acc[j] += dh[i, j]


def relu_ffn_forward(x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray,
                     b2: np.ndarray):
    """``out = max(x @ w1 + b1, 0) @ w2 + b2`` over the last axis.

    Parameters
    ----------
    x : ndarray of shape (..., C), float32 or float64
    w1, b1 : ndarrays of shapes (C, F) and (F,), x's dtype
    w2, b2 : ndarrays of shapes (F, C) and (C,), x's dtype

    Returns
    -------
    out : ndarray shaped like x
    cache : FeedForwardCache
        The input rows and the ReLU's output, for :func:`relu_ffn_backward`.

    Raises
    ------
    ValueError
        If x is not a float array whose last axis is C, or the weights do not fit.
    """
    for name, a in (("x", x), ("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2)):
        check_kernel_float(name, a)
    check_last_dim("x", x, w1.shape[0])
    if w1.ndim != 2 or w2.shape != w1.shape[::-1] or b1.shape != w1.shape[1:] or \
            b2.shape != w2.shape[1:] or len({a.dtype for a in (x, w1, b1, w2, b2)}) != 1:
        raise ValueError(f"the weights must be (C, F), (F,), (F, C), (C,) of x's dtype "
                         f"{x.dtype}, got {w1.shape}, {b1.shape}, {w2.shape}, {b2.shape}")
    if _use_reference(x.size // w1.shape[0]):
        return reference.relu_ffn_forward(x, w1, b1, w2, b2)
    x2 = np.ascontiguousarray(x).reshape(-1, w1.shape[0])  # (N, C)
    h = np.empty((x2.shape[0], w1.shape[1]), dtype=x.dtype)  # (N, F)
    out = np.empty_like(x2)  # (N, C)
    with blas_on_calling_thread():
        _forward_kernel(x2, w1, b1, w2, b2, _chunks(x2.shape[0]), gemm_address(x.dtype), h,
                        out)
    return out.reshape(x.shape), FeedForwardCache(x2, h, w1, w2, x.shape)


def relu_ffn_backward(dout: np.ndarray, cache: FeedForwardCache):
    """Gradients of :func:`relu_ffn_forward`: ``(dx, dw1, db1, dw2, db2)``, dx shaped like x.

    Raises
    ------
    ValueError
        If dout is not shaped like the forward's output.
    """
    check_cache(cache, FeedForwardCache, "relu_ffn_forward")
    x, h, w1, w2, shape = cache
    check_consistent(cache, all(isinstance(a, np.ndarray) and a.ndim == 2 and a.dtype == x.dtype
                                for a in (x, h, w1, w2)) and isinstance(shape, tuple)
                     and w1.shape == w2.shape[::-1] == (x.shape[1], h.shape[1])
                     and h.shape[0] == x.shape[0] == np.prod(shape[:-1], dtype=int)
                     and shape[-1:] == (x.shape[1],))
    check_kernel_float("cache.x", x)
    check_shaped("dout", dout, shape, x.dtype)
    n = x.shape[0]
    if _use_reference(n):
        return reference.relu_ffn_backward(dout, cache)
    dout2 = np.ascontiguousarray(dout, dtype=x.dtype).reshape(n, -1)  # (N, C)
    chunks = _chunks(n)
    (c, f), dtype = w1.shape, x.dtype
    dx = np.empty_like(x)  # (N, C)
    dw1_part, dw2_part = np.empty((chunks, c, f), dtype), np.empty((chunks, f, c), dtype)
    db1_part, db2_part = np.zeros((chunks, f)), np.zeros((chunks, c))
    with blas_on_calling_thread():
        _backward_kernel(dout2, x, h, w1, w2, chunks, numba.get_num_threads(),
                         gemm_address(dtype), dx, dw1_part, db1_part, dw2_part, db2_part)
    return (dx.reshape(shape), dw1_part.sum(axis=0), db1_part.sum(axis=0).astype(dtype),
            dw2_part.sum(axis=0), db2_part.sum(axis=0).astype(dtype))

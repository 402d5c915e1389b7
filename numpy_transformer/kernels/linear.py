"""The affine map ``out = x @ w + b`` on every core: a drop-in for ``functional/linear.py``.

Same contract as the readable reference (read that file first; ``tests/test_kernel_linear.py``
checks this one against it, float32 and float64):

* ``out, cache = linear_forward(x, w, b=None)``
* ``dx, dw, db = linear_backward(dout, cache)``
* ``y, cache = linear_heads_forward(x, w, b, groups, heads)``: attention's stacked q/k/v
  product, returned by head as (S, B, H, T, D)

with the very same ``LinearCache``. The heads variant writes each chunk of its output head by
head while the chunk is in cache. (The feed-forward network with a ReLU has its own kernel,
``kernels/feedforward.py``, built on the same chunks.)

Why a kernel pays: the matrix products of the linear layers are most of a training step, and
NumPy hands each one to its BLAS, which can use several cores only with its own thread pool.
The attention and norm kernels use Numba's pool; two pools spinning on two cores took turns
stalling each other (a step 2-4x slower, ``benchmarks/README.md``), so the BLAS runs on one
thread and a product of a (6400, 84) matrix ran on one core. Here the rows are cut into
chunks that Numba's threads multiply side by side, each chunk one single-threaded BLAS call
(NumPy's BLAS, through ``kernels/blas.py``: its weight-gradient product is 15-20% faster than
that of SciPy's, which Numba's ``np.dot`` calls):

    out[rows] = x[rows] w + b                       (1), one chunk per work item
    dx[rows]  = dout[rows] w^T                      (1) backward, same chunks
    dw = sum_chunks x[rows]^T dout[rows],  db = sum_chunks sum_rows dout[rows]

The weight gradient sums over all rows, so each chunk writes its own partial product and the
partials are added at the end. The chunks depend only on the number of rows, not on the
thread count, so results are bit-for-bit the same on any number of threads. ``db``
accumulates in float64. Inputs with fewer than ``_MIN_ROWS`` rows (a generation step) go to
the reference, one BLAS call: there starting the threads costs more than it saves. On a single
thread the chunks run one after the other, each in cache with its bias: a training step of the
chapter's model took 8% less time than with NumPy's products on all rows at once (5% less for
the small and the wide benchmark models; ``benchmarks/README.md``).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from .._checks import check_float, check_shaped
from ..functional import linear as reference
from ..functional.linear import LinearCache, check_heads, check_linear_inputs
from ..threads import blas_on_calling_thread
from ._jit import jit_options
from ._validate import check_cache, check_consistent, check_kernel_float
from .blas import gemm, gemm_address

# The operations this module gives the numba backend (numpy_transformer.backend)
__all__ = ['linear_forward', 'linear_backward', 'linear_heads_forward']

_MIN_ROWS = 256  # fewer rows: the reference's one BLAS call
# Chunks of about _CHUNK_ROWS rows or more, at least 2 and at most _MAX_CHUNKS (4 per thread on
# 2 cores). Taller chunks make faster products: on 768 rows of width 128, 2 chunks of 384 were
# 10-15% faster than 6 of 128 (OpenBLAS single-threaded: 134 GF/s at 128 rows, 150 at 384)
_CHUNK_ROWS = 384
_MAX_CHUNKS = 8
_JIT = jit_options()


def _use_reference(n: int) -> bool:
    """Whether n rows go to the reference's single BLAS call (too few rows for chunks)."""
    return n < _MIN_ROWS


def _chunks(n: int) -> int:
    return min(_MAX_CHUNKS, max(2, n // _CHUNK_ROWS))


@njit(parallel=True, **_JIT)
def _forward_kernel(x, w, b, has_bias, n_chunks, gemm_fn, out):  # pragma: no cover
    # (1) out = x w + b, chunk by chunk.  x: (N, C_in), w: (C_in, C_out), out: (N, C_out)
    n = x.shape[0]
    step = -(-n // n_chunks)
    for c in prange(n_chunks):
        lo, hi = c * step, min(n, (c + 1) * step)
        o = out[lo:hi]
        gemm(x[lo:hi], w, o, gemm_fn)  # (1) x w
        if has_bias:
            for i in range(hi - lo):
                for j in range(o.shape[1]):
                    o[i, j] += b[j]  # (1) + b


@njit(parallel=True, **_JIT)
def _forward_heads_kernel(x, w, b, has_bias, n_chunks, n_threads, gemm_fn, out):
    # pragma: no cover - compiled
    # (1) y = x w + b chunk by chunk into per-thread scratch, then each chunk's columns laid
    # out by head: out[s, b, h, t] = y[b T + t, (s H + h) D : (s H + h + 1) D].
    # x: (N, C_in) with N = B T, w: (C_in, S H D), out: (S, B, H, T, D)
    n, width = x.shape[0], w.shape[1]
    groups, heads, t_len, d = out.shape[0], out.shape[2], out.shape[3], out.shape[4]
    step = -(-n // n_chunks)
    scratch = np.empty((n_threads, step * width), x.dtype)  # one chunk's y per thread
    for c in prange(n_chunks):
        lo, hi = c * step, min(n, (c + 1) * step)
        y = scratch[numba.get_thread_id(), :(hi - lo) * width].reshape((hi - lo, width))
        gemm(x[lo:hi], w, y, gemm_fn)  # (1) x w
        for s in range(groups):
            for h in range(heads):
                col = (s * heads + h) * d
                for r in range(hi - lo):  # rows in order: each head's (T, D) block is filled
                    dst = out[s, (lo + r) // t_len, h, (lo + r) % t_len]  # front to back
                    for j in range(d):
                        dst[j] = y[r, col + j] + b[col + j] if has_bias else y[r, col + j]


@njit(parallel=True, **_JIT)
def _backward_kernel(dout, x, w, has_bias, n_chunks, gemm_fn, dx, dw_part, db_part):
    # pragma: no cover - compiled
    # dout: (N, C_out), x: (N, C_in), w: (C_in, C_out) -> dx: (N, C_in),
    # dw_part: (chunks, C_in, C_out), db_part: (chunks, C_out) float64
    n = x.shape[0]
    step = -(-n // n_chunks)
    for c in prange(n_chunks):
        lo, hi = c * step, min(n, (c + 1) * step)
        g = dout[lo:hi]
        # (1) out = x w + b   =>   dx = dout w^T,  dw = x^T dout,  db = sum_N dout
        gemm(g, w.T, dx[lo:hi], gemm_fn)
        gemm(x[lo:hi].T, g, dw_part[c], gemm_fn)
        if has_bias:
            acc = db_part[c]
            for i in range(hi - lo):
                for j in range(g.shape[1]):
                    acc[j] += g[i, j]


def _check_inputs(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> None:
    """The reference's checks, and dtypes the kernels are compiled for (mixed ones are
    promoted as NumPy would, by ``_operands``)."""
    check_linear_inputs(x, w, b)
    for name, a in (("x", x), ("w", w), ("b", b)):
        if a is not None:
            check_kernel_float(name, a)


def _operands(x: np.ndarray, w: np.ndarray, b: np.ndarray | None):
    """``(x2, w, bias, has_bias)`` for the forward kernels: x as C-contiguous (N, C_in), all in
    NumPy's promoted dtype of ``x @ w + b``; without a bias, ``w[0]`` is an unused stand-in."""
    has_bias = b is not None
    dtype = np.result_type(x, w, *((b,) if has_bias else ()))
    x2 = np.ascontiguousarray(x).reshape(-1, w.shape[0]).astype(dtype, copy=False)
    w = w.astype(dtype, copy=False)
    return x2, w, (b.astype(dtype, copy=False) if has_bias else w[0]), has_bias


def linear_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None):
    """Affine map over the last axis; see ``functional.linear.linear_forward``."""
    _check_inputs(x, w, b)
    if _use_reference(x.size // w.shape[0]):
        return reference.linear_forward(x, w, b)
    x2, w, bias, has_bias = _operands(x, w, b)  # x2: (N, C_in)
    out = np.empty((x2.shape[0], w.shape[1]), dtype=w.dtype)  # (N, C_out)
    with blas_on_calling_thread():
        _forward_kernel(x2, w, bias, has_bias, _chunks(x2.shape[0]), gemm_address(w.dtype),
                        out)
    return (out.reshape(x.shape[:-1] + (w.shape[1],)),
            LinearCache(x2.reshape(x.shape), w, has_bias))


def linear_backward(dout: np.ndarray, cache: LinearCache):
    """Returns ``(dx, dw, db)``; see ``functional.linear.linear_backward``."""
    check_cache(cache, LinearCache, "linear_forward")
    x, w, has_bias = cache
    check_consistent(cache, isinstance(x, np.ndarray) and isinstance(w, np.ndarray)
                     and w.ndim == 2 and x.ndim >= 1 and x.shape[-1] == w.shape[0])
    check_kernel_float("cache.x", x)
    check_kernel_float("cache.w", w)
    c_in, c_out = w.shape
    check_shaped("dout", dout, x.shape[:-1] + (c_out,), np.result_type(x, w))
    x2 = x.reshape(-1, c_in)
    n = x2.shape[0]
    if _use_reference(n) or x.dtype != w.dtype:  # few rows; or the reference's own cache
        return reference.linear_backward(dout, cache)
    dout2 = np.ascontiguousarray(dout, dtype=x.dtype).reshape(-1, c_out)  # (N, C_out)
    chunks = _chunks(n)
    dx = np.empty_like(x2)  # (N, C_in)
    dw_part = np.empty((chunks, c_in, c_out), dtype=x.dtype)
    db_part = np.zeros((chunks, c_out))
    with blas_on_calling_thread():
        _backward_kernel(dout2, x2, w, has_bias, chunks, gemm_address(x.dtype), dx, dw_part,
                         db_part)
    dx = dx.reshape(dout.shape[:-1] + (c_in,))
    db = db_part.sum(axis=0).astype(x.dtype) if has_bias else None
    return dx, dw_part.sum(axis=0), db


def linear_heads_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, groups: int,
                         heads: int):
    """Attention's stacked projections; see ``functional.linear.linear_heads_forward``.

    Returns the heads as a C-contiguous (S, B, H, T, D) array, written chunk by chunk while
    the chunk's product is in cache. The attention kernel then reads each head's keys and
    values as they lie: the copy it made of them from the strided (B, T, S*H*D) product cost
    0.3 ms per array and layer at the char model's shape. The cache and the backward are
    ``linear_forward``'s and ``linear_backward``'s.
    """
    check_float("x", x, ndim=3)
    _check_inputs(x, w, b)
    check_heads(w, groups, heads)
    if _use_reference(x.size // w.shape[0]):
        return reference.linear_heads_forward(x, w, b, groups, heads)
    bsz, t, _ = x.shape
    x2, w, bias, has_bias = _operands(x, w, b)  # x2: (N, C_in)
    out = np.empty((groups, bsz, heads, t, w.shape[1] // (groups * heads)), dtype=w.dtype)
    with blas_on_calling_thread():
        _forward_heads_kernel(x2, w, bias, has_bias, _chunks(x2.shape[0]),
                              numba.get_num_threads(), gemm_address(w.dtype), out)
    return out, LinearCache(x2.reshape(x.shape), w, has_bias)

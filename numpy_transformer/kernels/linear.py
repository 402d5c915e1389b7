"""The affine map ``out = x @ w + b`` on every core: a drop-in for ``functional/linear.py``.

Same contract as the readable reference (read that file first; ``tests/test_kernel_linear.py``
checks this one against it, float32 and float64):

* ``out, cache = linear_forward(x, w, b=None)``
* ``dx, dw, db = linear_backward(dout, cache)``
* ``ys, cache = linear_heads_forward(x, ws, bs, heads)``: attention's projections of one
  source, each returned by head as (B, H, T, D)
* ``dx, dws, dbs = linear_heads_backward(dys, cache)``

``linear_forward`` keeps the very same ``LinearCache``. The heads variant puts the weights of
one source side by side, ``x [w_1 | .. | w_S]``, so that it makes one product per source, and
writes each chunk of its output head by head while the chunk is in cache; its backward
gathers the S gradients of a chunk side by side again and makes one product each for dx and
dw. Its cache (``HeadsKernelCache``) keeps the S weights, which the backward puts side by
side again. (The feed-forward network with a ReLU has its own kernel,
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
partials are added at the end. (A layer as wide as a vocabulary head makes ``dw`` by blocks of
columns instead, each one product over all rows: its partials would be copies of a large
weight.) The chunks depend only on the number of rows, not on the
thread count, so results are bit-for-bit the same on any number of threads. ``db``
accumulates in float64. Inputs with fewer than ``_MIN_ROWS`` rows (a generation step) go to
the reference's products, one BLAS call: there starting the threads costs more than it saves
(their cache keeps the weight as the chunked kernels' do, ``ownership.kept``). On a single
thread the chunks run one after the other, each in cache with its bias: a training step of the
chapter's model took 8% less time than with NumPy's products on all rows at once (5% less for
the small and the wide benchmark models; ``benchmarks/README.md``).
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np
from numba import njit, prange

from .._checks import check_float, check_shaped
from ..functional import linear as reference
from ..functional.linear import (
    LinearCache,
    LinearHeadsCache,
    check_heads,
    check_heads_grads,
    check_linear_inputs,
    merge_heads,
)
from ..ownership import kept
from ..threads import FEW_ROWS, blas_on_calling_thread
from ._jit import helper, jit_options
from ._validate import check_cache, check_consistent, check_kernel_float
from .blas import gemm, gemm_address

# The operations this module gives the numba backend (numpy_transformer.backend)
__all__ = ['linear_forward', 'linear_backward', 'linear_heads_forward',
           'linear_heads_backward']

_MIN_ROWS = FEW_ROWS  # fewer rows: the reference's one BLAS call (threads.py)
# Chunks of about _CHUNK_ROWS rows or more, at least 2 and at most _MAX_CHUNKS (4 per thread on
# 2 cores). Taller chunks make faster products: on 768 rows of width 128, 2 chunks of 384 were
# 10-15% faster than 6 of 128 (OpenBLAS single-threaded: 134 GF/s at 128 rows, 150 at 384)
_CHUNK_ROWS = 384
_MAX_CHUNKS = 8
# A layer at least _WIDE_COLUMNS wide (a vocabulary head) makes dW by blocks of _BLOCK_COLUMNS
# columns instead, each block one product over all rows: the row chunks' partials would hold
# `chunks` copies of a weight that large (GPT-2's head, (768, 50304): two of them and their sum)
_WIDE_COLUMNS = 4096
_BLOCK_COLUMNS = 1024
_JIT = jit_options()


class HeadsKernelCache(NamedTuple):
    x: np.ndarray  # (B, T, C_in) C-contiguous, the forward's own copy
    ws: tuple  # S weights (C_in, C) in the products' dtype, the cache's (ownership.kept)
    has_bias: bool
    groups: int  # S
    heads: int  # H


def _use_reference(n: int) -> bool:
    """Whether n rows go to the reference's single BLAS call (too few rows for chunks)."""
    return n < _MIN_ROWS


def _chunks(n: int) -> int:
    return min(_MAX_CHUNKS, max(2, n // _CHUNK_ROWS))


@helper(_JIT)
def _own_chunk(x, lo, hi, copy_x, x_own):
    # x_own[lo:hi] = x[lo:hi] with copy_x (the cache's copy, made while the chunk is read
    # anyway); returns the chunk of x_own.  x, x_own: (N, C_in)
    xc = x_own[lo:hi]
    if copy_x:
        for i in range(hi - lo):
            for j in range(xc.shape[1]):
                xc[i, j] = x[lo + i, j]
    return xc


@njit(parallel=True, **_JIT)
def _forward_kernel(x, w, b, has_bias, n_chunks, gemm_fn, copy_x, x_own, out):
    # pragma: no cover - compiled
    # (1) out = x w + b, chunk by chunk.  x, x_own: (N, C_in), w: (C_in, C_out),
    # out: (N, C_out); x_own = x (the cache's copy) with copy_x, else x_own is x
    n = x.shape[0]
    step = -(-n // n_chunks)
    for c in prange(n_chunks):
        lo, hi = c * step, min(n, (c + 1) * step)
        o = out[lo:hi]
        gemm(_own_chunk(x, lo, hi, copy_x, x_own), w, o, gemm_fn)  # (1) x w
        if has_bias:
            for i in range(hi - lo):
                for j in range(o.shape[1]):
                    o[i, j] += b[j]  # (1) + b


@njit(parallel=True, **_JIT)
def _forward_heads_kernel(x, w, b, has_bias, n_chunks, n_threads, gemm_fn, copy_x, x_own,
                          out):  # pragma: no cover - compiled
    # (1) y = x w + b chunk by chunk into per-thread scratch, then each chunk's columns laid
    # out by head: out[s, b, h, t] = y[b T + t, (s H + h) D : (s H + h + 1) D].
    # x, x_own: (N, C_in) with N = B T (x_own = x with copy_x, as _forward_kernel),
    # w: (C_in, S H D), out: (S, B, H, T, D)
    n, width = x.shape[0], w.shape[1]
    groups, heads, t_len, d = out.shape[0], out.shape[2], out.shape[3], out.shape[4]
    step = -(-n // n_chunks)
    scratch = np.empty((n_threads, step * width), x.dtype)  # one chunk's y per thread
    for c in prange(n_chunks):
        lo, hi = c * step, min(n, (c + 1) * step)
        y = scratch[numba.get_thread_id(), :(hi - lo) * width].reshape((hi - lo, width))
        gemm(_own_chunk(x, lo, hi, copy_x, x_own), w, y, gemm_fn)  # (1) x w
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


@njit(parallel=True, **_JIT)
def _backward_wide_kernel(dout, x, w, has_bias, n_chunks, gemm_fn, dx, dw, db):
    # pragma: no cover - compiled
    # dout: (N, C_out), x: (N, C_in), w: (C_in, C_out) -> dx: (N, C_in), dw: (C_in, C_out),
    # db: (C_out,) float64 zeros
    n, c_out = dout.shape
    step = -(-n // n_chunks)
    # (1) out = x w + b   =>   dx = dout w^T, row chunk by row chunk
    for c in prange(n_chunks):
        lo, hi = c * step, min(n, (c + 1) * step)
        gemm(dout[lo:hi], w.T, dx[lo:hi], gemm_fn)
    # (1) out = x w + b   =>   dw = x^T dout,  db = sum_N dout, column block by column block
    for k in prange(-(-c_out // _BLOCK_COLUMNS)):
        lo, hi = k * _BLOCK_COLUMNS, min(c_out, (k + 1) * _BLOCK_COLUMNS)
        g = dout[:, lo:hi]
        gemm(x.T, g, dw[:, lo:hi], gemm_fn)
        if has_bias:
            for i in range(n):
                for j in range(hi - lo):
                    db[lo + j] += g[i, j]


@njit(parallel=True, **_JIT)
def _backward_heads_kernel(dys, x, w, has_bias, n_chunks, n_threads, gemm_fn, dx, dw_part,
                           db_part):  # pragma: no cover - compiled
    # (2) each chunk's rows of the S gradients side by side in per-thread scratch,
    # g = [dy_1 | .. | dy_S] (rows, S C), then the backward of (1) y = x [w_1 | .. | w_S] + b.
    # dys: S arrays (N, C), x: (N, C_in), w: (C_in, S C) -> dx: (N, C_in),
    # dw_part: (chunks, C_in, S C), db_part: (chunks, S C) float64
    n, width = x.shape[0], w.shape[1]
    c = width // len(dys)
    step = -(-n // n_chunks)
    scratch = np.empty((n_threads, step * width), x.dtype)  # one chunk's g per thread
    for k in prange(n_chunks):
        lo, hi = k * step, min(n, (k + 1) * step)
        g = scratch[numba.get_thread_id(), :(hi - lo) * width].reshape((hi - lo, width))
        for s in range(len(dys)):
            dy = dys[s]
            for r in range(hi - lo):
                for j in range(c):
                    g[r, s * c + j] = dy[lo + r, j]
        # (1) y = x w + b   =>   dx = g w^T,  dw = x^T g,  db = sum_N g
        gemm(g, w.T, dx[lo:hi], gemm_fn)
        gemm(x[lo:hi].T, g, dw_part[k], gemm_fn)
        if has_bias:
            acc = db_part[k]
            for i in range(hi - lo):
                for j in range(width):
                    acc[j] += g[i, j]


def _check_inputs(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> None:
    """The reference's checks, and dtypes the kernels are compiled for (mixed ones are
    promoted as NumPy would, by ``_operands``)."""
    check_linear_inputs(x, w, b)
    for name, a in (("x", x), ("w", w), ("b", b)):
        if a is not None:
            check_kernel_float(name, a)


def _operands(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, new_w: bool = False,
              keep: bool = True):
    """``(x2, x_own, w, bias, has_bias)`` for the forward kernels: x as C-contiguous (N, C_in),
    all in NumPy's promoted dtype of ``x @ w + b``; without a bias, ``w[0]`` is an unused
    stand-in. With ``keep`` the cache keeps x_own and w: the caller's w is ``kept``, a
    ``new_w`` (made by the caller) only cast; x_own is x2 when that is a new array, else an
    empty one that the kernel fills (``copy_x = x_own is not x2``). Without, nothing is
    copied that need not be."""
    has_bias = b is not None
    dtype = np.result_type(x, w, *((b,) if has_bias else ()))
    x2 = np.ascontiguousarray(x).reshape(-1, w.shape[0]).astype(dtype, copy=False)
    # the cache keeps x_own: not the caller's x
    x_own = np.empty_like(x2) if keep and np.may_share_memory(x2, x) else x2
    w = w.astype(dtype, copy=False) if new_w or not keep else kept(w, dtype)  # ownership.py
    return x2, x_own, w, (b.astype(dtype, copy=False) if has_bias else w[0]), has_bias


def linear_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, *,
                   keep: bool = True):
    """Affine map over the last axis; see ``functional.linear.linear_forward``."""
    _check_inputs(x, w, b)
    if _use_reference(x.size // w.shape[0]):  # the reference's product; its cache as ours
        out, _ = reference.linear_forward(x, w, b, keep=False)
        return out, LinearCache(x.copy(), kept(w), b is not None) if keep else None
    # x2, x_own: (N, C_in), w: the cache's
    x2, x_own, w, bias, has_bias = _operands(x, w, b, keep=keep)
    out = np.empty((x2.shape[0], w.shape[1]), dtype=w.dtype)  # (N, C_out)
    with blas_on_calling_thread():
        _forward_kernel(x2, w, bias, has_bias, _chunks(x2.shape[0]), gemm_address(w.dtype),
                        x_own is not x2, x_own, out)
    out = out.reshape(x.shape[:-1] + (w.shape[1],))
    return out, LinearCache(x_own.reshape(x.shape), w, has_bias) if keep else None


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
    if c_out >= _WIDE_COLUMNS:  # dW by column blocks: no per-chunk partials of a large weight
        dw = np.empty(w.shape, dtype=x.dtype)  # (C_in, C_out), C-contiguous
        db = np.zeros(c_out)
        with blas_on_calling_thread():
            _backward_wide_kernel(dout2, x2, w, has_bias, chunks, gemm_address(x.dtype), dx,
                                  dw, db)
    else:
        dw_part = np.empty((chunks, c_in, c_out), dtype=x.dtype)
        db_part = np.zeros((chunks, c_out))
        with blas_on_calling_thread():
            _backward_kernel(dout2, x2, w, has_bias, chunks, gemm_address(x.dtype), dx,
                             dw_part, db_part)
        dw, db = dw_part.sum(axis=0), db_part.sum(axis=0)
    dx = dx.reshape(dout.shape[:-1] + (c_in,))
    return dx, dw, (db.astype(x.dtype) if has_bias else None)


def linear_heads_forward(x: np.ndarray, ws: tuple, bs: tuple | None, heads: int, *,
                         keep: bool = True):
    """Attention's projections by head; see ``functional.linear.linear_heads_forward``.

    Makes one product of x and the weights side by side, ``x [w_1 | .. | w_S]``, and writes
    it chunk by chunk, while the chunk's product is in cache, as S C-contiguous (B, H, T, D)
    arrays. The copy the attention kernel keeps of them is then one contiguous block each,
    with no gather of them from the strided (B, T, S*H*D) product, a pass more per array and
    layer.
    """
    check_float("x", x, ndim=3)
    check_heads(ws, bs, heads)
    for i, w in enumerate(ws):
        _check_inputs(x, w, None if bs is None else bs[i])
    if _use_reference(x.size // x.shape[-1]):  # the reference's products; its cache as ours
        ys, _ = reference.linear_heads_forward(x, ws, bs, heads, keep=False)
        return ys, LinearHeadsCache(x.copy(), tuple(kept(w) for w in ws), bs is not None,
                                    heads) if keep else None
    bsz, t, _ = x.shape
    w = np.concatenate(ws, axis=1)  # (C_in, S C): the weights side by side, one product
    b = None if bs is None else np.concatenate(bs)  # (S C,)
    # x2, x_own: (N, C_in)
    x2, x_own, w, bias, has_bias = _operands(x, w, b, new_w=True, keep=keep)
    groups, c = len(ws), ws[0].shape[1]
    out = np.empty((groups, bsz, heads, t, c // heads), dtype=w.dtype)  # (S, B, H, T, D)
    with blas_on_calling_thread():
        _forward_heads_kernel(x2, w, bias, has_bias, _chunks(x2.shape[0]),
                              numba.get_num_threads(), gemm_address(w.dtype),
                              x_own is not x2, x_own, out)
    if not keep:
        return tuple(out), None
    # the cache keeps the S weights, which the backward puts side by side again
    own_ws = tuple(kept(wi, w.dtype) for wi in ws)
    return tuple(out), HeadsKernelCache(x_own.reshape(x.shape), own_ws, has_bias, groups,
                                        heads)


def linear_heads_backward(dys: tuple, cache):
    """Returns ``(dx, dws, dbs)``; see ``functional.linear.linear_heads_backward``.

    The S gradients go side by side into one product each for dx and dw (the backward of
    the forward's one product), chunk by chunk as in ``linear_backward``.
    """
    if isinstance(cache, LinearHeadsCache):  # few rows: made beside the reference's products
        return reference.linear_heads_backward(dys, cache)
    check_cache(cache, HeadsKernelCache, "linear_heads_forward")
    x, ws, has_bias, groups, heads = cache
    check_consistent(cache, isinstance(x, np.ndarray) and x.ndim == 3 and x.flags.c_contiguous
                     and isinstance(ws, tuple) and len(ws) == groups and all(
                         isinstance(wi, np.ndarray) and wi.ndim == 2 and wi.dtype == x.dtype
                         and wi.shape == ws[0].shape and wi.shape[0] == x.shape[2]
                         for wi in ws))
    check_kernel_float("cache.x", x)
    check_heads_grads(dys, x, ws, heads)
    w = np.concatenate(ws, axis=1)  # (C_in, S C): the forward's weights side by side
    c = ws[0].shape[1]  # each projection's width, H D
    x2 = x.reshape(-1, x.shape[2])  # (N, C_in), N = B T
    n, c_in = x2.shape
    flat = tuple(np.ascontiguousarray(merge_heads(dy), dtype=x2.dtype).reshape(n, c)
                 for dy in dys)  # (2) merge heads, free for the attention kernel's (N, C)
    chunks = _chunks(n)
    dx = np.empty_like(x2)  # (N, C_in)
    dw_part = np.empty((chunks, c_in, w.shape[1]), dtype=x2.dtype)
    db_part = np.zeros((chunks, w.shape[1]))
    with blas_on_calling_thread():
        _backward_heads_kernel(flat, x2, w, has_bias, chunks, numba.get_num_threads(),
                               gemm_address(x2.dtype), dx, dw_part, db_part)
    dw = dw_part.sum(axis=0)  # (C_in, S C)
    dws = tuple(dw[:, i * c:(i + 1) * c] for i in range(groups))
    db = db_part.sum(axis=0).astype(x2.dtype) if has_bias else None
    dbs = tuple(db[i * c:(i + 1) * c] for i in range(groups)) if has_bias else None
    return dx.reshape(x.shape), dws, dbs

"""The output layer and its loss, a block of rows at a time: a drop-in for
``functional/head_loss.py``.

Same contract as the readable reference (``tests/test_kernel_head_loss.py`` checks this one
against it, float32 and float64):

* ``loss, cache = linear_cross_entropy_forward(x, w, b, targets, ignore_index=-100, mask=None)``
* ``dx, dw, db = linear_cross_entropy_backward(dloss, cache)``

The reference makes the whole logits (N, V), their probabilities and then their gradient,
each (1024, 50304) at GPT-2's vocabulary and 1,024 positions, and its linear layer keeps
a copy of the (768, 50304) weight for the backward. Here a vocabulary of at least
``_WIDE_COLUMNS`` words goes through the rows in blocks of ``_BLOCK_ROWS``, and the forward
makes the gradients as well, while a block's logits are at hand:

    g = x[rows] w + b                                 (1), by blocks of columns
    loss_n = -w_n log softmax(g_n)[t_n]               (2), row by row, and in place:
    g_n = w_n (softmax(g_n) - onehot(t_n))            the gradient of (2) at dloss = 1
    dx[rows] = sum_groups g[:, group] w[:, group]^T   (1) backward, by groups of columns
    dw += x[rows]^T g,  db += sum_rows g              (1) backward, by blocks of columns

The block's (``_BLOCK_ROWS``, V) array is the only one as wide as the vocabulary, and the
weight is read during the call only, so nothing keeps a copy of it. The cache holds the
three gradients at dloss = 1; the backward scales them by ``dloss`` in place and hands them
over, so a second backward of one forward raises ``ValueError`` (run the
forward again). The blocks and groups depend on the sizes only, never on the thread count,
and the blocks of rows add into ``dw`` and ``db`` in order: the same bits on any number of
threads. A narrower vocabulary makes small logits: the linear and cross-entropy kernels run
one after the other there (``kernels/linear.py``, ``kernels/softmax.py``), with the
reference's cache.

Training calls this operation through the models' ``loss_and_backward``
(``nn/models.py``); their ``forward`` still returns the logits (evaluation, generation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from .._checks import check_scalar
from ..functional.head_loss import LinearCrossEntropyCache
from ..functional.linear import check_linear_inputs
from ..functional.softmax import counted_targets
from ..threads import blas_on_calling_thread
from . import linear, softmax
from ._jit import helper, jit_options
from ._validate import check_cache, check_kernel_float
from .blas import gemm, gemm_address
from .special import exp_shifted

# The operations this module gives the numba backend (numpy_transformer.backend)
__all__ = ['linear_cross_entropy_forward', 'linear_cross_entropy_backward']

_WIDE_COLUMNS = 4096  # narrower: the linear and cross-entropy kernels, one after the other
_BLOCK_ROWS = 256  # rows per block: a block's logits are (256, V), never (N, V)
_BLOCK_COLUMNS = 1024  # the columns of one product of the logits and of dw
# dx = g w^T is the sum of the products of _DX_GROUPS groups of the vocabulary's columns, each
# into its own (R, C) part, added in order: each product then reads its share of g and of w
# once (one product per piece of rows read all of w again: OpenBLAS packs the whole of its
# right operand for every call)
_DX_GROUPS = 4
# reassoc: SIMD row sums; error_model="numpy": no division check in the loops (as softmax.py)
_JIT = jit_options(fastmath={"reassoc"}, error_model="numpy")


@dataclass
class HeadLossKernelCache:
    """The gradients at dloss = 1, which the backward takes (``None`` once taken)."""

    dx: np.ndarray | None  # (..., C), shaped like x
    dw: np.ndarray | None  # (C, V), in the layout of the forward's w
    db: np.ndarray | None  # (V,), or None without a bias


@helper(_JIT)
def _loss_row(row, t, wn):  # pragma: no cover - compiled
    # row: (V,) one position's logits, replaced by their gradient w_n (softmax - onehot(t));
    # returns the position's loss (2) -w_n log softmax(row)[t], in float64
    v = row.size
    m = row[0]  # the row max, the stabilising shift
    for j in range(1, v):
        m = row[j] if row[j] > m else m
    x_t = row[t]
    exp_shifted(row, v, m)  # e = exp(g - m)
    z = 0.0  # in float64
    for j in range(v):
        z += row[j]
    scale = row.dtype.type(wn / z)
    for j in range(v):
        row[j] *= scale  # w_n softmax(g)
    row[t] -= row.dtype.type(wn)  # - w_n onehot(t)
    return -wn * (x_t - m - math.log(z))  # (2) -w_n (g_t - m - log z)


@njit(parallel=True, **_JIT)
def _head_loss_kernel(x, w, transposed, b, has_bias, targets, weight, gemm_fn, g_all, dx_parts,
                      row_loss, dx, dw, db):  # pragma: no cover - compiled
    # x: (N, C); w: (C, V), or its transpose (V, C) if `transposed` (C-contiguous either
    # way); b: (V,); targets: (N,) int64; weight, row_loss: (N,) float64;
    # g_all: (R, V) a block's logits, then their gradient; dx_parts: (_DX_GROUPS, R, C);
    # dx: (N, C); dw: like w; db: (V,) float64 zeros
    n, c = x.shape
    v = w.shape[0] if transposed else w.shape[1]
    block = g_all.shape[0]
    columns = -(-v // _BLOCK_COLUMNS)
    group = -(-v // _DX_GROUPS)
    for lo in range(0, n, block):
        r = min(n, lo + block) - lo
        xs, g, parts = x[lo:lo + r], g_all[:r], dx_parts[:, :r]
        for k in prange(columns):  # (1) g = x w + b, a block of columns at a time
            c0, c1 = k * _BLOCK_COLUMNS, min(v, (k + 1) * _BLOCK_COLUMNS)
            out = g[:, c0:c1]
            if transposed:
                gemm(xs, w[c0:c1].T, out, gemm_fn)
            else:
                gemm(xs, w[:, c0:c1], out, gemm_fn)
            if has_bias:
                for i in range(r):
                    for j in range(c1 - c0):
                        out[i, j] += b[c0 + j]
        for i in prange(r):  # (2) the loss of row i, and its gradient in place of its logits
            row_loss[lo + i] = _loss_row(g[i], targets[lo + i], weight[lo + i])
        for q in prange(_DX_GROUPS):  # (1) backward: dx = g w^T, one group of columns each
            c0, c1 = q * group, min(v, (q + 1) * group)
            if transposed:
                gemm(g[:, c0:c1], w[c0:c1], parts[q], gemm_fn)
            else:
                gemm(g[:, c0:c1], w[:, c0:c1].T, parts[q], gemm_fn)
        for i in prange(r):  # (1) backward: the groups' products added, in order
            for j in range(c):
                acc = parts[0, i, j]
                for q in range(1, _DX_GROUPS):
                    acc += parts[q, i, j]
                dx[lo + i, j] = acc
        for k in prange(columns):  # (1) backward: dw += x^T g, db += sum_rows g
            c0, c1 = k * _BLOCK_COLUMNS, min(v, (k + 1) * _BLOCK_COLUMNS)
            if transposed:
                gemm(g[:, c0:c1].T, xs, dw[c0:c1], gemm_fn, lo > 0)
            else:
                gemm(xs.T, g[:, c0:c1], dw[:, c0:c1], gemm_fn, lo > 0)
            if has_bias:
                for i in range(r):
                    for j in range(c1 - c0):
                        db[c0 + j] += g[i, c0 + j]


def linear_cross_entropy_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                                 targets: np.ndarray, ignore_index: int = -100,
                                 mask: np.ndarray | None = None, *, keep: bool = True):
    """Mean cross-entropy of ``x w + b``; see ``functional.head_loss``.

    Same arguments, same ``ValueError`` cases, same returns ``(loss, cache)``; the cache is a
    :class:`HeadLossKernelCache` for a vocabulary of at least ``_WIDE_COLUMNS`` words. Without
    ``keep`` (a held-out loss) it is None, and the loss is that of the two kernels, whose
    gradients are not made.
    """
    check_linear_inputs(x, w, b)
    for name, a in (("x", x), ("w", w), ("b", b)):
        if a is not None:
            check_kernel_float(name, a)
    v = w.shape[1]
    if v < _WIDE_COLUMNS or not keep:  # the loss's kernel checks and weighs the targets
        logits, lin = linear.linear_forward(x, w, b, keep=keep)
        loss, ce = softmax.cross_entropy_forward(logits, targets, ignore_index, mask, keep=keep)
        return loss, LinearCrossEntropyCache(lin, ce) if keep else None
    dtype = np.result_type(x, w, *(() if b is None else (b,)))
    # the targets' checks and weights take the logits' shape and dtype: a stand-in of no size
    logits_like = np.broadcast_to(np.zeros((), dtype), x.shape[:-1] + (v,))
    flat_t, weight = counted_targets(logits_like, targets, ignore_index, mask)
    x2 = np.ascontiguousarray(x, dtype=dtype).reshape(-1, w.shape[0])  # (N, C), read only
    transposed = not w.flags.c_contiguous
    wk = np.ascontiguousarray(w.T if transposed else w, dtype=dtype)  # read only, not kept
    n = x2.shape[0]
    g = np.empty((min(n, _BLOCK_ROWS), v), dtype)  # a block's logits, then their gradient
    dx_parts = np.empty((_DX_GROUPS, g.shape[0], x2.shape[1]), dtype)
    row_loss = np.empty(n)
    dx = np.empty_like(x2)
    dw = np.empty_like(wk)  # (C, V), or (V, C) if transposed
    db = np.zeros(v)
    bias = b.astype(dtype, copy=False) if b is not None else np.zeros(1, dtype)
    with blas_on_calling_thread():
        _head_loss_kernel(x2, wk, transposed, bias, b is not None, flat_t,
                          weight.astype(np.float64), gemm_address(dtype), g, dx_parts,
                          row_loss, dx, dw, db)
    loss = dtype.type(row_loss.sum())  # rounded to the logits' dtype, as the reference
    return float(loss), HeadLossKernelCache(dx.reshape(x.shape[:-1] + (x2.shape[1],)),
                                            dw.T if transposed else dw,
                                            db.astype(dtype) if b is not None else None)


def linear_cross_entropy_backward(dloss: float, cache):
    """Returns ``(dx, dw, db)``; see ``functional.head_loss``.

    Takes the gradients out of a :class:`HeadLossKernelCache`, scaled by ``dloss``.

    Raises
    ------
    ValueError
        If ``dloss`` is not a real number, if ``cache`` is neither cache the forward returns,
        or if a backward took this cache's gradients already.
    """
    check_scalar("dloss", dloss)
    if isinstance(cache, LinearCrossEntropyCache):  # a narrow vocabulary: the two kernels
        dlogits = softmax.cross_entropy_backward(dloss, cache.loss)
        return linear.linear_backward(dlogits, cache.linear)
    check_cache(cache, HeadLossKernelCache, "linear_cross_entropy_forward")
    if cache.dx is None:
        raise ValueError("this cache's gradients were taken by an earlier "
                         "linear_cross_entropy_backward: run the forward again")
    grads = (cache.dx, cache.dw, cache.db)
    cache.dx = cache.dw = cache.db = None  # handed over: the caller owns them now
    if dloss != 1.0:
        for g in grads:
            if g is not None:
                g *= g.dtype.type(dloss)
    return grads

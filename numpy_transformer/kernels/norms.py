"""LayerNorm and RMSNorm in Numba: a drop-in for ``functional/norms.py``.

Same contract as the readable reference (read that file first; ``tests/test_kernels_step.py``
checks every function here against it, forward and backward, float32 and float64):

* ``out, cache = layer_norm_forward(x, w, b, eps)``
* ``dx, dw, db = layer_norm_backward(dout, cache)``
* ``out, cache = rms_norm_forward(x, w, eps)``
* ``dx, dw = rms_norm_backward(dout, cache)``

with the very same ``LayerNormCache`` / ``RMSNormCache`` named tuples.

Why a kernel pays: the reference makes about eight passes over the (N, C) activations per
forward and ten per backward (mean, subtract, square, mean, multiply, ...), each allocating a
temporary. Here one row of C numbers is read once, its statistics kept in registers, and the
row written once; rows run in parallel (``prange``).

The parameter gradients ``dw = sum_rows dout * x_hat`` and ``db = sum_rows dout`` are sums
over *all* rows, so threads must not add into one array. The rows are cut into fixed blocks
of ``_ROWS`` rows; each block sums into its own row of a ``(blocks, C)`` scratch array, and
the blocks are added at the end. The blocks do not depend on the thread count, so the result
is bit-for-bit the same with 1 or 2 threads.

Row statistics (mean, variance, mean of products) are accumulated in float64 whatever the
input dtype; the reference accumulates float32 inputs in float32 (pairwise), so the two agree
to float32 rounding, not bit for bit. The forward's ``x_hat`` is computed in float64 and
rounded once (half the error of float32 arithmetic, which moved a float32 PyTorch cross-check
in ``reference_checks/`` past its bar); everything after it -- the affine output, and the whole
backward once a row's two means are rounded to the input's dtype -- runs in that dtype, as the
reference's does. At the char model's width (84) that made the forward 1.3x and the backward
1.8x faster than float64 work on every element. Rows go to the threads in the same fixed
blocks in the forward as in the backward: one task per block of rows, not per row.

References
----------
Ba, Kiros & Hinton, "Layer Normalization", 2016.
Zhang & Sennrich, "Root Mean Square Layer Normalization", 2019.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .._checks import check_scalar, check_shaped
from ..functional.norms import LayerNormCache, RMSNormCache, check_norm_inputs
from ..ownership import kept
from ..threads import alone_below
from ._jit import jit_options
from ._validate import check_cache, check_consistent, check_kernel_float

# The operations this module gives the numba backend (numpy_transformer.backend)
__all__ = ['layer_norm_forward', 'layer_norm_backward', 'rms_norm_forward', 'rms_norm_backward']

_ROWS = 64  # rows per block: a task for a thread, and one parameter-gradient partial sum
# "reassoc" lets the compiler split each row sum into several SIMD partial sums. A sum in one
# fixed order is a chain of dependent additions, 4 cycles each, and made these kernels 2x
# slower. The order still depends only on the compiled code, not on the threads, so results
# stay reproducible; they differ from the reference's pairwise sums by rounding only.
# error_model="numpy": x / 0 gives inf or NaN as in NumPy instead of raising ZeroDivisionError
# (that check keeps the compiler from vectorising a loop with a division).
_JIT = jit_options(fastmath={"reassoc"}, error_model="numpy")


def _rows(a: np.ndarray) -> np.ndarray:
    """(..., C) -> C-contiguous (N, C): a view when possible, else one copy."""
    return np.ascontiguousarray(a).reshape(-1, a.shape[-1])


def _check_inputs(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, eps) -> None:
    """The reference's checks, and one dtype the kernels are compiled for."""
    check_norm_inputs(x, w, b)
    check_kernel_float("x", x)
    if eps is not None:
        check_scalar("eps", eps)


def _check_backward(dout, cache, kind: type, forward: str) -> None:
    """dout shaped like the forward's output, of its dtype; a cache that fits."""
    check_cache(cache, kind, forward)
    x_hat, w, r = cache
    check_consistent(cache, all(isinstance(a, np.ndarray) for a in cache)
                     and x_hat.ndim >= 1 and w.shape == x_hat.shape[-1:]
                     and r.shape == x_hat.shape[:-1] + (1,))
    check_kernel_float("cache.x_hat", x_hat)
    check_shaped("dout", dout, x_hat.shape, x_hat.dtype)


def _blocks(n: int) -> int:
    return max(1, -(-n // _ROWS))


# ------------------------------------------------------------------------------- LayerNorm
@njit(parallel=True, **_JIT)
def _layer_norm_forward_kernel(x, w, b, eps, rows, out, x_hat, rstd):
    # pragma: no cover - compiled
    # x, out, x_hat: (N, C); w, b: (C,); rstd: (N,)
    n, c = x.shape
    for blk in prange(-(-n // rows)):
        for i in range(blk * rows, min(n, (blk + 1) * rows)):
            xi = x[i]
            mu = 0.0  # (1) mu = mean_C x  (float64 accumulator)
            for j in range(c):
                mu += xi[j]
            mu /= c
            var = 0.0  # (1) var = mean_C (x - mu)^2, two-pass as the reference
            for j in range(c):
                d = xi[j] - mu
                var += d * d
            var /= c
            r = 1.0 / np.sqrt(var + eps)  # (2) rstd
            rstd[i] = r
            xh_i, out_i = x_hat[i], out[i]
            for j in range(c):
                xh_i[j] = (xi[j] - mu) * r  # (2) x_hat, in float64, rounded once
            for j in range(c):
                out_i[j] = xh_i[j] * w[j] + b[j]  # (3), in x's dtype, as the reference


@njit(parallel=True, **_JIT)
def _layer_norm_backward_kernel(dout, x_hat, w, rstd, dx, dw_part, db_part, rows):
    # pragma: no cover - compiled
    # dout, x_hat, dx: (N, C); w: (C,); rstd: (N,); dw_part, db_part: (blocks, C) float64
    n, c = dout.shape
    t = dout.dtype.type
    for blk in prange(dw_part.shape[0]):
        dw_blk, db_blk = dw_part[blk], db_part[blk]
        for i in range(blk * rows, min(n, (blk + 1) * rows)):
            g_i, xh_i = dout[i], x_hat[i]
            # (3) out = x_hat * w + b  =>  dw += dout * x_hat,  db += dout,  dxh = dout * w
            m1 = 0.0  # mean_C dxh
            m2 = 0.0  # mean_C dxh * x_hat
            for j in range(c):
                g = g_i[j]
                xh = xh_i[j]
                dw_blk[j] += g * xh
                db_blk[j] += g
                dxh = g * w[j]
                m1 += dxh
                m2 += dxh * xh
            m1_t, m2_t = t(m1 / c), t(m2 / c)
            # (2), (1)  dx = rstd * (dxh - mean_C dxh - x_hat * mean_C(dxh * x_hat))
            r = rstd[i]
            dx_i = dx[i]
            for j in range(c):
                dx_i[j] = r * (g_i[j] * w[j] - m1_t - xh_i[j] * m2_t)


def layer_norm_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-5, *,
                       keep: bool = True):
    """LayerNorm over the last axis; see ``functional.norms.layer_norm_forward``.

    Parameters
    ----------
    x : ndarray of shape (..., C)
    w, b : ndarray of shape (C,)
    eps : float, default 1e-5
    keep : bool, default True
        Whether to return the cache; False (inference): None.

    Returns
    -------
    out : ndarray of shape (..., C)
    cache : LayerNormCache or None
        ``x_hat`` (..., C), ``w`` (C,) (``ownership.kept``), ``rstd`` (..., 1), as the
        reference's.
    """
    _check_inputs(x, w, b, eps)
    x2 = _rows(x)  # (N, C)
    out, x_hat = np.empty_like(x2), np.empty_like(x2)
    rstd = np.empty(x2.shape[0], dtype=x.dtype)  # (N,)
    with alone_below(x2.shape[0]):
        _layer_norm_forward_kernel(x2, w.astype(x.dtype, copy=False),
                                   b.astype(x.dtype, copy=False), float(eps), _ROWS, out, x_hat,
                                   rstd)
    if not keep:
        return out.reshape(x.shape), None
    return (out.reshape(x.shape),
            LayerNormCache(x_hat.reshape(x.shape), kept(w), rstd.reshape(x.shape[:-1] + (1,))))


def layer_norm_backward(dout: np.ndarray, cache: LayerNormCache):
    """Returns ``(dx, dw, db)``; see ``functional.norms.layer_norm_backward``."""
    _check_backward(dout, cache, LayerNormCache, "layer_norm_forward")
    x_hat, w, rstd = cache
    c = w.shape[0]
    dout2, x_hat2 = _rows(dout.astype(x_hat.dtype, copy=False)), _rows(x_hat)  # (N, C)
    n = dout2.shape[0]
    dx = np.empty_like(x_hat2)
    dw_part = np.zeros((_blocks(n), c))  # float64 partial sums, one row per block of rows
    db_part = np.zeros((_blocks(n), c))
    with alone_below(n):
        _layer_norm_backward_kernel(dout2, x_hat2, w.astype(x_hat.dtype, copy=False),
                                    rstd.reshape(-1), dx, dw_part, db_part, _ROWS)
    dt = x_hat.dtype
    return dx.reshape(x_hat.shape), dw_part.sum(axis=0).astype(dt), db_part.sum(axis=0).astype(dt)


# ------------------------------------------------------------------------------- RMSNorm
@njit(parallel=True, **_JIT)
def _rms_norm_forward_kernel(x, w, eps, rows, out, x_hat, rrms):  # pragma: no cover - compiled
    # x, out, x_hat: (N, C); w: (C,); rrms: (N,)
    n, c = x.shape
    for blk in prange(-(-n // rows)):
        for i in range(blk * rows, min(n, (blk + 1) * rows)):
            xi = x[i]
            ms = 0.0  # (1) mean_C x^2
            for j in range(c):
                ms += xi[j] * xi[j]
            r = 1.0 / np.sqrt(ms / c + eps)  # (1) rrms
            rrms[i] = r
            xh_i, out_i = x_hat[i], out[i]
            for j in range(c):
                xh_i[j] = xi[j] * r  # (2) x_hat, in float64, rounded once
            for j in range(c):
                out_i[j] = xh_i[j] * w[j]  # (3), in x's dtype


@njit(parallel=True, **_JIT)
def _rms_norm_backward_kernel(dout, x_hat, w, rrms, dx, dw_part, rows):
    # pragma: no cover - compiled
    # dout, x_hat, dx: (N, C); w: (C,); rrms: (N,); dw_part: (blocks, C) float64
    n, c = dout.shape
    t = dout.dtype.type
    for blk in prange(dw_part.shape[0]):
        dw_blk = dw_part[blk]
        for i in range(blk * rows, min(n, (blk + 1) * rows)):
            g_i, xh_i = dout[i], x_hat[i]
            # (3) out = x_hat * w  =>  dw += dout * x_hat,  dxh = dout * w
            m2 = 0.0  # mean_C dxh * x_hat
            for j in range(c):
                g = g_i[j]
                xh = xh_i[j]
                dw_blk[j] += g * xh
                m2 += g * w[j] * xh
            m2_t = t(m2 / c)
            # (2), (1)  dx = rrms * (dxh - x_hat * mean_C(dxh * x_hat))
            r = rrms[i]
            dx_i = dx[i]
            for j in range(c):
                dx_i[j] = r * (g_i[j] * w[j] - xh_i[j] * m2_t)


def rms_norm_forward(x: np.ndarray, w: np.ndarray, eps: float | None = None, *,
                     keep: bool = True):
    """RMSNorm over the last axis; see ``functional.norms.rms_norm_forward``.

    ``eps=None`` means ``np.finfo(x.dtype).eps``, as in the reference; without ``keep`` the
    cache is None.
    """
    _check_inputs(x, w, None, eps)
    eps = np.finfo(x.dtype).eps if eps is None else eps
    x2 = _rows(x)  # (N, C)
    out, x_hat = np.empty_like(x2), np.empty_like(x2)
    rrms = np.empty(x2.shape[0], dtype=x.dtype)  # (N,)
    with alone_below(x2.shape[0]):
        _rms_norm_forward_kernel(x2, w.astype(x.dtype, copy=False), float(eps), _ROWS, out,
                                 x_hat, rrms)
    if not keep:
        return out.reshape(x.shape), None
    return (out.reshape(x.shape),
            RMSNormCache(x_hat.reshape(x.shape), kept(w), rrms.reshape(x.shape[:-1] + (1,))))


def rms_norm_backward(dout: np.ndarray, cache: RMSNormCache):
    """Returns ``(dx, dw)``; see ``functional.norms.rms_norm_backward``."""
    _check_backward(dout, cache, RMSNormCache, "rms_norm_forward")
    x_hat, w, rrms = cache
    dout2, x_hat2 = _rows(dout.astype(x_hat.dtype, copy=False)), _rows(x_hat)  # (N, C)
    dx = np.empty_like(x_hat2)
    dw_part = np.zeros((_blocks(dout2.shape[0]), w.shape[0]))
    with alone_below(dout2.shape[0]):
        _rms_norm_backward_kernel(dout2, x_hat2, w.astype(x_hat.dtype, copy=False),
                                  rrms.reshape(-1), dx, dw_part, _ROWS)
    return dx.reshape(x_hat.shape), dw_part.sum(axis=0).astype(x_hat.dtype)

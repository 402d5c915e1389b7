"""The feed-forward network on the numba backend; ReLU with biases in one pass over its rows.

Same contract and result as its reference, ``functional/feedforward.py`` (read that file
first; ``tests/test_kernel_feedforward.py`` checks this one against it, float32 and float64):

* ``out, cache = feed_forward_forward(x, weights, activation)``
* ``dx, grads = feed_forward_backward(dout, cache)``

with the reference's ``FeedForwardCache`` (one array left out, last paragraph). Every
activation but one is the reference's composition (``compose_forward``) of the numba
pieces: ``kernels/linear.py``'s linear maps and the activation's kernels where
``kernels/activations.py`` has them (its reference otherwise). The one is ReLU with both
biases, the chapter's network ``out = max(x w1 + b1, 0) w2 + b2``.

Why one kernel: the rows are cut into chunks, as in ``kernels/linear.py`` (read that file
first), and each chunk goes through both products and the ReLU while it is in the core's
cache. Apart, the down-projection read the hidden activations h, (N, F), back from memory, and
in the backward pass its gradient dh was written to memory and read back by the
up-projection's. For one chunk of rows::

    forward   x_own = x                                     the cache's copy of x
              h   = max(x w1 + b1, 0)                       (1), (2)  kept for the backward
              out = h w2 + b2                               (3)
    backward  dh  = (dout w2^T) [h > 0]                     (3), then (2): h > 0 exactly where
              dw2 += h^T dout,   db2 += sum_rows dout       (3)         x w1 + b1 > 0
              dx  = dh w1^T                                 (1)
              dw1 += x^T dh,     db1 += sum_rows dh         (1)

As in ``kernels/linear.py`` each chunk writes its own partial weight gradients (bias
gradients in float64), added at the end; the chunks depend only on the number of rows, so
results are the same bit for bit on any number of threads, and the same as the linear
kernels' with the ReLU applied between them. Few rows go to the reference.

The two GELUs are composed with one array fewer kept: the cache holds h, which the
activation's backward needs, and not a = act(h), the down-projection's input (``down.x`` is
None). The backward makes a again from h with the same kernel, the very same bits: one
activation's pass more, and at GPT-2's shape one (B, T, F) array less a layer at the step's
peak. A reference cache is taken as it is; the reference's backward cannot take this
forward's cache (``backend.NEEDS_ITS_PARTNER``).
"""

from __future__ import annotations

from collections.abc import Callable

import numba
import numpy as np
from numba import njit, prange

from .._checks import check_last_dim, check_shaped
from ..functional import feedforward as reference
from ..functional.feedforward import (
    FeedForwardCache,
    check_feed_forward_weights,
    compose_backward,
    compose_forward,
)
from ..functional.linear import LinearCache
from ..ownership import kept
from ..threads import blas_on_calling_thread
from . import activations
from . import linear as fast_linear
from ._jit import jit_options
from ._validate import check_cache, check_consistent, check_kernel_float
from .blas import gemm, gemm_address
from .linear import _chunks, _use_reference

# The operations this module gives the numba backend (numpy_transformer.backend)
__all__ = ['feed_forward_forward', 'feed_forward_backward']

_JIT = jit_options()
# the activations whose cache is their input h: the down-projection's input act(h) is made
# again in the backward instead of kept (the last paragraph above)
_MADE_AGAIN = ("gelu", "gelu_tanh")


@njit(parallel=True, **_JIT)
def _forward_kernel(x, w1, b1, w2, b2, n_chunks, gemm_fn, x_own, h, out):  # pragma: no cover
    # x, x_own: (N, C), w1: (C, F), b1: (F,), w2: (F, C), b2: (C,) -> h: (N, F), out: (N, C)
    n = x.shape[0]
    step = -(-n // n_chunks)
    for c in prange(n_chunks):
        lo, hi = c * step, min(n, (c + 1) * step)
        xc, hc, oc = x_own[lo:hi], h[lo:hi], out[lo:hi]
        for i in range(hi - lo):
            for j in range(xc.shape[1]):
                xc[i, j] = x[lo + i, j]  # the cache's copy, while the chunk is in cache
        gemm(xc, w1, hc, gemm_fn)  # (1) x w1
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


def _activation_pair(name: str) -> tuple[Callable, Callable]:
    """The activation's kernels where ``kernels/activations.py`` has them, else its reference."""
    if f"{name}_forward" in activations.__all__:
        return getattr(activations, f"{name}_forward"), getattr(activations, f"{name}_backward")
    return reference.activation_pair(name)


def _one_pass(activation: str, w1: np.ndarray, b1, w2: np.ndarray, b2, dtype) -> bool:
    """Whether the one-pass kernel computes this network: ReLU, both biases, one dtype, and
    an output as wide as the input."""
    return (activation == "relu" and b1 is not None and b2 is not None
            and w2.shape[1:] == w1.shape[:1]
            and all(a.dtype == dtype for a in (w1, b1, w2, b2)))


def _one_pass_cache(cache: FeedForwardCache) -> bool:
    """Whether the one-pass kernel's backward fits the cache, as :func:`_one_pass`."""
    activation, up, gate, _, down = cache
    return (activation == "relu" and gate is None and up.has_bias and down.has_bias
            and isinstance(up.x, np.ndarray) and isinstance(up.w, np.ndarray)
            and isinstance(down.w, np.ndarray) and down.w.shape[1:] == up.w.shape[:1]
            and up.x.dtype == up.w.dtype == down.w.dtype)


def _with_activation_output(cache: FeedForwardCache) -> FeedForwardCache:
    """The cache with the down-projection's input a = act(h) made again from h, which the
    activation's cache holds, where the forward left it out (see the module docstring)."""
    if cache.down.x is not None or cache.activation not in _MADE_AGAIN:
        return cache  # the reference's cache, or another activation's
    a, _ = _activation_pair(cache.activation)[0](cache.act)  # (2), the forward's very bits
    return cache._replace(down=cache.down._replace(x=a))


def feed_forward_forward(x: np.ndarray, weights: dict, activation: str, *, keep: bool = True):
    """The feed-forward network; see ``functional.feedforward.feed_forward_forward``.

    Raises
    ------
    ValueError
        If x is not a float32 or float64 array whose last axis is C, or the weights do not
        fit.
    """
    check_feed_forward_weights(weights, activation)
    check_kernel_float("x", x)
    for name, (w, b) in weights.items():
        check_kernel_float(f"weights[{name!r}] w", w)
        if b is not None:
            check_kernel_float(f"weights[{name!r}] b", b)
    (w1, b1), (w2, b2) = weights["up"], weights["down"]
    if not keep or not _one_pass(activation, w1, b1, w2, b2, x.dtype):
        out, cache = compose_forward(x, weights, activation, fast_linear.linear_forward,
                                     _activation_pair(activation), keep)
        if cache is None or activation not in _MADE_AGAIN:
            return out, cache
        return out, cache._replace(down=cache.down._replace(x=None))  # a: made again
    check_last_dim("x", x, w1.shape[0])
    check_shaped("weights['up'] b", b1, w1.shape[1:], what="w's columns")
    check_shaped("weights['down'] b", b2, w2.shape[1:], what="w's columns")
    if _use_reference(x.size // w1.shape[0]):
        return reference.feed_forward_forward(x, weights, activation)
    x2 = np.ascontiguousarray(x).reshape(-1, w1.shape[0])  # (N, C)
    x_own, out = np.empty_like(x2), np.empty_like(x2)  # (N, C)
    h = np.empty((x2.shape[0], w1.shape[1]), dtype=x.dtype)  # (N, F)
    w1, w2 = kept(w1), kept(w2)  # the cache's (ownership.py)
    with blas_on_calling_thread():
        _forward_kernel(x2, w1, b1, w2, b2, _chunks(x2.shape[0]), gemm_address(x.dtype), x_own,
                        h, out)
    h = h.reshape(x.shape[:-1] + h.shape[-1:])  # (..., F): ReLU's cache, and (3)'s input
    return out.reshape(x.shape), FeedForwardCache(
        activation, LinearCache(x_own.reshape(x.shape), w1, True), None, h,
        LinearCache(h, w2, True))


def feed_forward_backward(dout: np.ndarray, cache: FeedForwardCache):
    """Returns ``(dx, grads)``; see ``functional.feedforward.feed_forward_backward``.

    Raises
    ------
    ValueError
        If dout is not shaped like the forward's output, or the cache is not the forward's.
    """
    check_cache(cache, FeedForwardCache, "feed_forward_forward")
    activation, up, gate, _, down = cache
    check_consistent(cache, isinstance(up, LinearCache) and isinstance(down, LinearCache)
                     and (gate is None or isinstance(gate, LinearCache)))
    if not _one_pass_cache(cache):
        return compose_backward(dout, _with_activation_output(cache),
                                fast_linear.linear_backward, _activation_pair(activation))
    (x, w1, _), (h, w2, _) = up, down
    check_consistent(cache, all(isinstance(a, np.ndarray) and a.dtype == x.dtype
                                for a in (x, h, w1, w2)) and w1.ndim == 2
                     and w1.shape == w2.shape[::-1] and x.shape[-1:] == w1.shape[:1]
                     and h.shape == x.shape[:-1] + w1.shape[1:])
    check_kernel_float("cache.x", x)
    check_shaped("dout", dout, x.shape, x.dtype)
    (c, f), dtype = w1.shape, x.dtype
    n = x.size // c
    if _use_reference(n):
        return reference.feed_forward_backward(dout, cache)
    dout2, x2, h2 = (np.ascontiguousarray(a).reshape(n, -1) for a in (dout, x, h))  # (N, .)
    chunks = _chunks(n)
    dx = np.empty((n, c), dtype)  # (N, C)
    dw1_part, dw2_part = np.empty((chunks, c, f), dtype), np.empty((chunks, f, c), dtype)
    db1_part, db2_part = np.zeros((chunks, f)), np.zeros((chunks, c))
    with blas_on_calling_thread():
        _backward_kernel(dout2, x2, h2, w1, w2, chunks,
                         numba.get_num_threads(), gemm_address(dtype), dx, dw1_part, db1_part,
                         dw2_part, db2_part)
    return dx.reshape(x.shape), {
        "up": (dw1_part.sum(axis=0), db1_part.sum(axis=0).astype(dtype)),
        "down": (dw2_part.sum(axis=0), db2_part.sum(axis=0).astype(dtype))}

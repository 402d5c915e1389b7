"""Fused softmax cross-entropy in Numba: a drop-in for ``functional/softmax.py``'s loss.

Same contract as the readable reference (checked against it in ``tests/test_kernels_step.py``):

* ``loss, cache = cross_entropy_forward(logits, targets, ignore_index=-100, mask=None)``
* ``dlogits = cross_entropy_backward(dloss, cache)``

with the very same ``CrossEntropyCache`` (``probs`` (N, V), flat ``targets``, ``weight``,
``shape``).

The reference runs log-softmax as six whole-array passes (max, subtract, exp, sum, log,
subtract), then ``exp`` again for the probabilities, then a gather for the loss; its backward
copies the probabilities, scatters the one-hot and scales. Here the forward reads each row of
V logits twice (max; then exp, sum) and writes the probabilities once, and the backward is
one pass. Rows run in parallel.

The per-row losses go to an array that NumPy sums, so the result does not depend on the
thread count.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .._checks import check_scalar
from ..functional.softmax import CrossEntropyCache, counted_targets
from ._jit import jit_options
from ._validate import check_cache, check_consistent, check_kernel_float
from .special import exp_shifted

# The operations this module gives the numba backend (numpy_transformer.backend)
__all__ = ['cross_entropy_forward', 'cross_entropy_backward']

# reassoc: SIMD row sums; error_model="numpy": x / 0 gives inf/NaN as in NumPy instead of
# raising, a check that keeps the compiler from vectorising a loop with a division
_JIT = jit_options(fastmath={"reassoc"}, error_model="numpy")


@njit(parallel=True, **_JIT)
def _cross_entropy_forward_kernel(logits, targets, weight, probs, row_loss):
    # pragma: no cover - compiled
    # logits, probs: (N, V); targets: (N,) int64; weight, row_loss: (N,) float64
    n, v = logits.shape
    for i in prange(n):
        m = logits[i, 0]  # row max, the stabilising shift
        for j in range(1, v):
            m = logits[i, j] if logits[i, j] > m else m  # a select, which vectorises
        row = probs[i]
        for j in range(v):  # a loop, not row[:] = logits[i]: an array-to-array assignment
            row[j] = logits[i, j]  # compiles Numba's shape-error message, slowly
        # math.exp would call libm once per entry (no SIMD without Intel's SVML)
        exp_shifted(row, v, m)  # e = exp(x - m)
        z = 0.0  # (1) z = sum_j e_j, in float64
        for j in range(v):
            z += row[j]
        inv_z = logits.dtype.type(1.0 / z)  # in the logits' dtype: no conversions per entry
        for j in range(v):
            row[j] *= inv_z  # p = exp(x - m) / z
        # (1) logp[t] = x_t - m - log z   (2) loss_n = -w_n logp[t]
        row_loss[i] = -weight[i] * (logits[i, targets[i]] - m - math.log(z))


@njit(parallel=True, **_JIT)
def _cross_entropy_backward_kernel(probs, targets, scale, dlogits):  # pragma: no cover
    # probs, dlogits: (N, V); targets: (N,); scale: (N,) = dloss * w_n
    n, v = probs.shape
    for i in prange(n):
        s = scale[i]
        for j in range(v):
            dlogits[i, j] = probs[i, j] * s  # dloss w_n p
        dlogits[i, targets[i]] -= s  # - dloss w_n onehot(t)


def cross_entropy_forward(logits: np.ndarray, targets: np.ndarray, ignore_index: int = -100,
                          mask: np.ndarray | None = None, *, keep: bool = True):
    """Mean negative log-likelihood; see ``functional.softmax.cross_entropy_forward``.

    Same arguments, same ``ValueError`` cases, same returns ``(loss, CrossEntropyCache)``
    (``(loss, None)`` without ``keep``).
    """
    flat_t, weight = counted_targets(logits, targets, ignore_index, mask)
    check_kernel_float("logits", logits)
    vocab = logits.shape[-1]
    x = np.ascontiguousarray(logits).reshape(-1, vocab)  # (N, V)
    probs = np.empty_like(x)
    row_loss = np.empty(x.shape[0])  # float64
    _cross_entropy_forward_kernel(x, flat_t, weight.astype(np.float64), probs, row_loss)
    loss = logits.dtype.type(row_loss.sum())  # rounded to the logits' dtype, as the reference
    return float(loss), CrossEntropyCache(probs, flat_t, weight, logits.shape) if keep else None


def cross_entropy_backward(dloss: float, cache: CrossEntropyCache) -> np.ndarray:
    """``dlogits = dloss * w_n (softmax(logits) - onehot(target))``, shaped like the logits."""
    check_scalar("dloss", dloss)
    check_cache(cache, CrossEntropyCache, "cross_entropy_forward")
    probs, targets, weight, shape = cache
    check_consistent(cache, all(isinstance(a, np.ndarray) for a in (probs, targets, weight))
                     and probs.ndim == 2 and targets.shape == weight.shape == probs.shape[:1]
                     and targets.dtype.kind in "iu" and isinstance(shape, tuple)
                     and np.prod(shape, dtype=int) == probs.size)
    check_kernel_float("cache.probs", probs)
    dlogits = np.empty_like(probs)
    scale = (weight * weight.dtype.type(dloss)).astype(probs.dtype)
    _cross_entropy_backward_kernel(probs, targets.astype(np.int64, copy=False), scale, dlogits)
    return dlogits.reshape(shape)

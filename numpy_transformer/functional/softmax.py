"""Softmax and the log-softmax cross-entropy loss, with closed-form backwards (no Jacobians).

References
----------
Bridle, "Probabilistic Interpretation of Feedforward Classification Network Outputs", 1990.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import check_float, check_scalar, check_shaped

# The operations of the backends (numpy_transformer.backend)
__all__ = [
    'softmax_forward', 'softmax_backward', 'log_softmax', 'cross_entropy_forward',
    'cross_entropy_backward'
]


def softmax_forward(x: np.ndarray, *, keep: bool = True):
    """Softmax along the last axis, stabilised by the row max.

    Returns ``(y, cache)``; the cache is ``y`` itself, all the backward needs (None without
    ``keep``).

    Notes
    -----
    (1) y_i = exp(x_i - max x) / sum_j exp(x_j - max x)
    """
    check_float("x", x)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    y = e / e.sum(axis=-1, keepdims=True)
    return y, y if keep else None


def softmax_backward(dy: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``dx = y * (dy - sum_j dy_j y_j)``: the Jacobian ``diag(y) - y y^T`` applied, never built."""
    check_shaped("dy", dy, y.shape)
    return y * (dy - (dy * y).sum(axis=-1, keepdims=True))  # (1), as a product with dy


def log_softmax(x: np.ndarray) -> np.ndarray:
    """``x - logsumexp(x)`` along the last axis, computed stably."""
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


class CrossEntropyCache(NamedTuple):
    probs: np.ndarray  # (N, V) softmax of the logits
    targets: np.ndarray  # (N,) target ids, 0 where not counted
    weight: np.ndarray  # (N,) 1/count where counted, else 0
    shape: tuple  # the logits' shape


def counted_targets(logits: np.ndarray, targets: np.ndarray, ignore_index: int = -100,
                    mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Validate the targets of a cross-entropy and weigh them: ``(flat_targets, weight)``.

    ``flat_targets`` (N,) holds the target ids with 0 where a target is not counted;
    ``weight`` (N,) is 1/count where counted and 0 elsewhere, in the logits' dtype. Shared by
    the reference below and the compiled fused loss, so both refuse the same inputs alike.
    """
    check_float("logits", logits)
    targets = np.asarray(targets)
    if not np.issubdtype(targets.dtype, np.integer):
        raise ValueError(f"targets must be integer class ids, got dtype {targets.dtype}")
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets of shape {targets.shape} do not match logits {logits.shape}")
    vocab = logits.shape[-1]
    counted = targets != ignore_index
    if mask is not None:
        if np.shape(mask) != targets.shape:
            raise ValueError(f"mask of shape {np.shape(mask)} does not match targets "
                             f"{targets.shape}")
        counted &= np.asarray(mask, dtype=bool)
    bad = counted & ((targets < 0) | (targets >= vocab))
    if bad.any():
        raise ValueError(f"target id {targets[bad].flat[0]} is outside [0, {vocab})")
    n = int(counted.sum())
    if n == 0:
        raise ValueError("cross_entropy has no counted target (all ignored or masked)")
    flat_t = np.where(counted, targets, 0).reshape(-1).astype(np.int64)  # (N,)
    weight = counted.reshape(-1).astype(logits.dtype) / logits.dtype.type(n)  # (N,)
    return flat_t, weight


def cross_entropy_forward(logits: np.ndarray, targets: np.ndarray, ignore_index: int = -100,
                          mask: np.ndarray | None = None, *, keep: bool = True):
    """Mean negative log-likelihood of ``targets`` under ``softmax(logits)``.

    Parameters
    ----------
    logits : ndarray of shape (..., V), typically (B, T, V)
    targets : ndarray of int, shape (...), typically (B, T)
    ignore_index : int, default -100
        Targets equal to it are not counted (as ``F.cross_entropy``).
    mask : ndarray of bool, shape (...), optional
        ``True`` = count this target. Combined with ``ignore_index``.
    keep : bool, default True
        Whether to return the cache a backward needs (the probabilities); False: None.

    Returns
    -------
    loss : float
        Mean over the counted targets.
    cache : CrossEntropyCache or None

    Raises
    ------
    ValueError
        On shape mismatch, non-integer targets, ids outside [0, V), or no counted target.

    Notes
    -----
    (1) logp = log_softmax(logits)   (2) loss = -(1/N) sum_{counted n} logp[n, target_n]
    """
    flat_t, weight = counted_targets(logits, targets, ignore_index, mask)
    logp = log_softmax(logits.reshape(-1, logits.shape[-1]))  # (1) (N, V)
    loss = -(logp[np.arange(flat_t.size), flat_t] * weight).sum()  # (2)
    if not keep:
        return float(loss), None
    return float(loss), CrossEntropyCache(np.exp(logp), flat_t, weight, logits.shape)


def cross_entropy_backward(dloss: float, cache: CrossEntropyCache) -> np.ndarray:
    """``dlogits = dloss * w_n (softmax(logits) - onehot(target))``, shaped like the logits."""
    check_scalar("dloss", dloss)
    probs, targets, weight, shape = cache
    # (2), (1): d(-logp[n, t])/dlogits[n] = p[n] - onehot(t); counted rows carry weight 1/N
    dlogits = probs.copy()
    dlogits[np.arange(targets.size), targets] -= 1.0
    dlogits *= (weight * dloss)[:, None]
    return dlogits.reshape(shape)

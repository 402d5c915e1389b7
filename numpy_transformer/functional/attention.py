"""Scaled dot-product attention: the readable NumPy reference, forward next to backward.

Contract shared with the compiled, fused attention of the other backend (see
``numpy_transformer.backend``; either can replace the other without changing any caller):

* ``out, cache = sdpa_forward(q, k, v, mask=None, bias=None, scale=None)``
* ``dq, dk, dv = sdpa_backward(dout, cache)``

q : (B, H, T_q, D), k and v : (B, H, T_k, D); ``mask`` is boolean, ``True`` = may attend,
broadcastable to (B, H, T_q, T_k); ``bias`` is an additive float score bias (ALiBi), also
broadcastable, and treated as a constant (no gradient). The cache is opaque: only the matching
backward reads it. A query whose every key is masked gets a zero output and zero gradients.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import check_float, check_scalar, check_shaped

# The operations of the backends (numpy_transformer.backend)
__all__ = ['sdpa_forward', 'sdpa_backward', 'attention_weights']


class SDPACache(NamedTuple):
    q: np.ndarray  # (B, H, T_q, D), the forward's own copy (as are k and v)
    k: np.ndarray  # (B, H, T_k, D)
    v: np.ndarray  # (B, H, T_k, D)
    probs: np.ndarray  # (B, H, T_q, T_k) attention weights, 0 where masked
    scale: float


def check_attention_inputs(q, k, v, mask=None, bias=None, scale=None) -> None:
    """Raise ``ValueError`` naming the offending value unless the inputs fit the contract
    (non-empty: T_q, T_k and D of 0 are refused)."""
    if scale is not None:
        check_scalar("scale", scale)
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_float(name, x, ndim=4)
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {k.shape} and {v.shape}")
    if q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {q.shape} and k {k.shape} must agree on batch, heads and head width")
    scores_shape = q.shape[:3] + (k.shape[2],)
    for name, m in (("mask", mask), ("bias", bias)):
        if m is None:
            continue
        if name == "bias":
            check_float("bias", m)  # an array, as q, k, v (a mask may be any array-like)
        m = np.asarray(m)
        if name == "mask" and m.dtype != np.bool_:
            raise ValueError(f"mask must be boolean (True = may attend), got dtype {m.dtype}")
        try:
            shape = np.broadcast_shapes(m.shape, scores_shape)
        except ValueError:
            shape = None
        if shape != scores_shape:
            raise ValueError(f"{name} of shape {m.shape} does not broadcast to the scores "
                             f"(B, H, T_q, T_k) = {scores_shape}")


def check_sdpa_grads(dout: np.ndarray, q: np.ndarray) -> None:
    """Raise ``ValueError`` unless ``dout`` is shaped like the forward's output (q's shape and
    dtype)."""
    check_shaped("dout", dout, q.shape, q.dtype)


def scores_forward(q, k, mask=None, bias=None, scale=None):
    """Masked, scaled, biased scores and their softmax: the attention weights.

    Returns ``(probs, scale)`` with probs of shape (B, H, T_q, T_k); rows whose keys are all
    masked are all zero. Used by the forward pass and for plotting attention maps.
    """
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.swapaxes(-1, -2)) * q.dtype.type(scale)  # (1) s = q k^T / sqrt(D)
    if bias is not None:
        s = s + bias  # (2) s += bias
    if mask is not None:
        s = np.where(mask, s, -np.inf)  # (3) masked scores -> -inf
    m = s.max(axis=-1, keepdims=True)  # (4) p = softmax(s), stabilised by the row max
    m = np.where(np.isfinite(m), m, 0.0)  # a fully masked row has max -inf: use 0 instead
    e = np.exp(s - m)
    z = e.sum(axis=-1, keepdims=True)
    probs = e / np.where(z > 0, z, 1.0)  # fully masked row: e = 0, so probs = 0
    return probs.astype(q.dtype, copy=False), scale


def attention_weights(q, k, mask=None, bias=None, scale=None) -> np.ndarray:
    """The attention weights (B, H, T_q, T_k) for plotting; zero rows where nothing is visible."""
    check_attention_inputs(q, k, k, mask, bias, scale)
    return scores_forward(q, k, mask, bias, scale)[0]


def sdpa_forward(q, k, v, mask=None, bias=None, scale=None):
    """Scaled dot-product attention, ``softmax(q k^T / sqrt(D) + bias, masked) v``.

    Parameters
    ----------
    q : ndarray of shape (B, H, T_q, D)
    k, v : ndarray of shape (B, H, T_k, D)
    mask : ndarray of bool, broadcastable to (B, H, T_q, T_k), optional
        ``True`` = the query may attend the key.
    bias : ndarray of float, broadcastable to (B, H, T_q, T_k), optional
        Added to the scaled scores before masking (for example ALiBi). Constant.
    scale : float, optional
        Score scale, default ``1 / sqrt(D)``.

    Returns
    -------
    out : ndarray of shape (B, H, T_q, D)
    cache : SDPACache

    Raises
    ------
    ValueError
        If shapes, dtypes, the mask or the bias do not fit.

    Notes
    -----
    (1) s = q k^T * scale   (2) s += bias   (3) s[~mask] = -inf
    (4) p = softmax(s) along keys (0 for a fully masked row)   (5) out = p v

    References
    ----------
    Vaswani et al., "Attention Is All You Need", 2017.
    """
    check_attention_inputs(q, k, v, mask, bias, scale)
    probs, scale = scores_forward(q, k, mask, bias, scale)
    out = probs @ v  # (5) (B, H, T_q, D)
    # the cache owns what it keeps: the caller may write into q, k and v before the backward
    return out, SDPACache(q.copy(), k.copy(), v.copy(), probs, scale)


def sdpa_backward(dout, cache: SDPACache):
    """Gradients of :func:`sdpa_forward`: returns ``(dq, dk, dv)``, each shaped like its input."""
    q, k, v, p, scale = cache
    check_sdpa_grads(dout, q)
    # (5) out = p v          =>  dv = p^T dout,  dp = dout v^T
    dv = p.swapaxes(-1, -2) @ dout  # (B, H, T_k, D)
    dp = dout @ v.swapaxes(-1, -2)  # (B, H, T_q, T_k)
    # (4) p = softmax(s)      =>  ds = p * (dp - sum_j dp p)   (masked entries: p = 0, ds = 0)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    # (3), (2) masking and the constant bias pass ds through unchanged
    # (1) s = q k^T * scale   =>  dq = ds k * scale,  dk = ds^T q * scale
    sc = q.dtype.type(scale)
    dq = (ds @ k) * sc
    dk = (ds.swapaxes(-1, -2) @ q) * sc
    return dq, dk, dv

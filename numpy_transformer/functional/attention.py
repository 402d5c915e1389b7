"""Scaled dot-product attention: the readable NumPy reference, forward next to backward.

Contract shared with the compiled, fused attention of the other backend (see
``numpy_transformer.backend``; either can replace the other without changing any caller):

* ``out, cache = sdpa_forward(q, k, v, mask=None, bias=None, scale=None, dropout=None)``
* ``dq, dk, dv = sdpa_backward(dout, cache)``

q : (B, H, T_q, D), k and v : (B, H_kv, T_k, D) with H_kv dividing H; ``mask`` is boolean,
``True`` = may attend, broadcastable to (B, H, T_q, T_k); ``bias`` is an additive float score
bias (ALiBi), also broadcastable, and treated as a constant (no gradient); ``dropout`` the
multipliers of the attention weights (inverted dropout, 0 or 1 / (1 - p): the
``functional.activations.dropout_mask`` a module draws in training), broadcastable as well,
also a constant. The cache is opaque: only the matching backward reads it. A query whose
every key is masked gets a zero output and zero gradients.

H_kv = H is multi-head attention. H_kv < H is grouped-query attention (Ainslie et al. 2023):
the H query heads fall into H_kv groups of G = H / H_kv consecutive heads, and every head of
group j reads the keys and values of kv head j, so query head h reads kv head h // G (the
order of ``torch.repeat_interleave`` and of ``F.scaled_dot_product_attention(...,
enable_gqa=True)``). H_kv = 1 is multi-query attention (Shazeer 2019). This is one pair, not
a second one beside it, because GQA changes only which keys a head reads: equation (0) below,
and its backward, the sum over each group.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import check_float, check_scalar, check_shaped

# The operations of the backends (numpy_transformer.backend)
__all__ = ['sdpa_forward', 'sdpa_backward', 'attention_weights']


class SDPACache(NamedTuple):
    q: np.ndarray  # (B, H, T_q, D), the forward's own copy (as are k and v)
    k: np.ndarray  # (B, H_kv, T_k, D), before (0): G times less than repeated
    v: np.ndarray  # (B, H_kv, T_k, D)
    probs: np.ndarray  # (B, H, T_q, T_k) attention weights, 0 where masked, before (4b)
    scale: float
    dropout: np.ndarray | None  # the multipliers of (4b), the forward's own copy, or None


def check_attention_inputs(q, k, v, mask=None, bias=None, scale=None, dropout=None) -> None:
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
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {q.shape} and k {k.shape} must agree on batch and head width")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"k's {k.shape[1]} heads must divide q's {q.shape[1]} heads "
                         f"(q {q.shape}, k {k.shape})")
    scores_shape = q.shape[:3] + (k.shape[2],)
    for name, m in (("mask", mask), ("bias", bias), ("dropout", dropout)):
        if m is None:
            continue
        if name != "mask":
            check_float(name, m)  # an array, as q, k, v (a mask may be any array-like)
        if name == "dropout" and m.dtype != q.dtype:  # else the product would change dtype
            raise ValueError(f"dropout must have q's dtype {q.dtype}, got {m.dtype}")
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


def repeat_kv(x: np.ndarray, heads: int) -> np.ndarray:
    """(0) The keys (or values) each query head reads: (B, H_kv, T, D) -> (B, H, T, D).

    Query head h reads kv head h // G, G = H / H_kv; with G = 1 this is x itself.
    """
    return x if x.shape[1] == heads else np.repeat(x, heads // x.shape[1], axis=1)


def repeat_kv_backward(dx: np.ndarray, kv_heads: int) -> np.ndarray:
    """(0) x_h = x[h // G]  =>  dx_j = sum of dx_h over the G query heads h of group j.

    (B, H, T, D) -> (B, H_kv, T, D): every kv head's gradient gathers its group's.
    """
    b, h, t, d = dx.shape
    return dx if h == kv_heads else dx.reshape(b, kv_heads, h // kv_heads, t, d).sum(axis=2)


def scores_forward(q, k, mask=None, bias=None, scale=None):
    """Masked, scaled, biased scores and their softmax: the attention weights.

    Returns ``(probs, scale)`` with probs of shape (B, H, T_q, T_k); rows whose keys are all
    masked are all zero. Used by the forward pass and for plotting attention maps. k holds
    one head per query head, (B, H, T_k, D): repeated by (0) first in grouped-query attention.
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
    return scores_forward(q, repeat_kv(k, q.shape[1]), mask, bias, scale)[0]  # (0), (1)-(4)


def sdpa_forward(q, k, v, mask=None, bias=None, scale=None, dropout=None, *, keep=True):
    """Scaled dot-product attention, ``(softmax(q k^T / sqrt(D) + bias, masked) * dropout) v``.

    Parameters
    ----------
    q : ndarray of shape (B, H, T_q, D)
    k, v : ndarray of shape (B, H_kv, T_k, D)
        H_kv must divide H: H_kv = H is multi-head attention, H_kv < H grouped-query
        attention (query head h reads kv head h // (H / H_kv)).
    mask : ndarray of bool, broadcastable to (B, H, T_q, T_k), optional
        ``True`` = the query may attend the key.
    bias : ndarray of float, broadcastable to (B, H, T_q, T_k), optional
        Added to the scaled scores before masking (for example ALiBi). Constant.
    scale : float, optional
        Score scale, default ``1 / sqrt(D)``.
    dropout : ndarray of float, broadcastable to (B, H, T_q, T_k), optional
        Multipliers of the attention weights after the softmax: inverted dropout's 0 or
        1 / (1 - p) (``functional.activations.dropout_mask``), as GPT-2's ``attn_pdrop``
        and ``torch.nn.functional.scaled_dot_product_attention(dropout_p=p)``. Constant.
    keep : bool, default True
        Whether to return the cache a backward needs; False (inference): None, and nothing
        is copied.

    Returns
    -------
    out : ndarray of shape (B, H, T_q, D)
    cache : SDPACache or None

    Raises
    ------
    ValueError
        If shapes, dtypes, the mask or the bias do not fit.

    Notes
    -----
    (0) k_h = k[h // G], v_h = v[h // G], G = H / H_kv   (the identity when H_kv = H)
    (1) s = q k_h^T * scale   (2) s += bias   (3) s[~mask] = -inf
    (4) p = softmax(s) along keys (0 for a fully masked row)
    (4b) p~ = p * dropout   (p~ = p without dropout)   (5) out = p~ v_h

    References
    ----------
    Vaswani et al., "Attention Is All You Need", 2017.
    Ainslie et al., "GQA: Training Generalized Multi-Query Transformer Models from Multi-Head
    Checkpoints", 2023.
    """
    check_attention_inputs(q, k, v, mask, bias, scale, dropout)
    heads = q.shape[1]
    probs, scale = scores_forward(q, repeat_kv(k, heads), mask, bias, scale)  # (0)-(4)
    dropped = probs if dropout is None else probs * dropout  # (4b) (B, H, T_q, T_k)
    out = dropped @ repeat_kv(v, heads)  # (0), (5) (B, H, T_q, D)
    if not keep:
        return out, None
    # the cache owns what it keeps: the caller may write into q, k, v and the multipliers
    # before the backward
    return out, SDPACache(q.copy(), k.copy(), v.copy(), probs, scale,
                          None if dropout is None else dropout.copy())


def sdpa_backward(dout, cache: SDPACache):
    """Gradients of :func:`sdpa_forward`: returns ``(dq, dk, dv)``, each shaped like its input."""
    q, k, v, p, scale, drop = cache
    check_sdpa_grads(dout, q)
    heads, kv_heads = q.shape[1], k.shape[1]
    k_h, v_h = repeat_kv(k, heads), repeat_kv(v, heads)  # (0) again: (B, H, T_k, D)
    p_dropped = p if drop is None else p * drop  # (4b) p~ again
    # (5) out = p~ v_h       =>  dv_h = p~^T dout,  dp~ = dout v_h^T
    dv_h = p_dropped.swapaxes(-1, -2) @ dout  # (B, H, T_k, D)
    dp = dout @ v_h.swapaxes(-1, -2)  # (B, H, T_q, T_k)
    if drop is not None:
        dp = dp * drop  # (4b) p~ = p * dropout  =>  dp = dp~ * dropout
    # (4) p = softmax(s)      =>  ds = p * (dp - sum_j dp p)   (masked entries: p = 0, ds = 0)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    # (3), (2) masking and the constant bias pass ds through unchanged
    # (1) s = q k_h^T * scale   =>  dq = ds k_h * scale,  dk_h = ds^T q * scale
    sc = q.dtype.type(scale)
    dq = (ds @ k_h) * sc  # (B, H, T_q, D)
    dk_h = (ds.swapaxes(-1, -2) @ q) * sc  # (B, H, T_k, D)
    # (0) k_h = k[h // G]     =>  dk, dv sum their group's G query heads: (B, H_kv, T_k, D)
    return dq, repeat_kv_backward(dk_h, kv_heads), repeat_kv_backward(dv_h, kv_heads)

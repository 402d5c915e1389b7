"""Affine map ``out = x @ w + b`` and its backward.

The weight is stored as (C_in, C_out) so that the forward reads as the math does. PyTorch's
``nn.Linear`` stores the transpose, (C_out, C_in); the weight exchange in
``numpy_transformer.interop`` transposes on the way in and out.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import check_float, check_last_dim, check_positive, check_shaped

# The operations of the backends (numpy_transformer.backend)
__all__ = ['linear_forward', 'linear_backward', 'linear_heads_forward']


class LinearCache(NamedTuple):
    x: np.ndarray  # (..., C_in)
    w: np.ndarray  # (C_in, C_out)
    has_bias: bool


def check_linear_inputs(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> None:
    """Raise ``ValueError`` unless x is (..., C_in), w (C_in, C_out) and b None or (C_out,)."""
    check_float("x", x)
    check_float("w", w, ndim=2)
    check_last_dim("x", x, w.shape[0])
    if b is not None:
        check_shaped("b", b, w.shape[1:], what="w's columns")


def check_heads(w: np.ndarray, groups: int, heads: int) -> None:
    """Raise ``ValueError`` unless w's columns split into ``groups`` x ``heads`` heads."""
    check_positive("groups", groups, integer=True)
    check_positive("heads", heads, integer=True)
    if w.shape[1] % (groups * heads):
        raise ValueError(f"w has {w.shape[1]} columns, which do not split into {groups} "
                         f"groups of {heads} heads")


def linear_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None):
    """Affine map over the last axis.

    Parameters
    ----------
    x : ndarray of shape (..., C_in)
    w : ndarray of shape (C_in, C_out)
    b : ndarray of shape (C_out,), optional

    Returns
    -------
    out : ndarray of shape (..., C_out)
    cache : LinearCache

    Notes
    -----
    (1) out = x w + b
    """
    check_linear_inputs(x, w, b)
    out = x @ w  # (1) (..., C_out)
    if b is not None:
        out += b
    return out, LinearCache(x, w, b is not None)


def linear_backward(dout: np.ndarray, cache: LinearCache):
    """Returns ``(dx, dw, db)``; ``db`` is ``None`` when the forward had no bias."""
    x, w, has_bias = cache
    c_in, c_out = w.shape
    check_shaped("dout", dout, x.shape[:-1] + (c_out,))
    x2, dout2 = x.reshape(-1, c_in), dout.reshape(-1, c_out)  # fold all leading axes: (N, C)
    # (1) out = x w + b   =>   dx = dout w^T,  dw = x^T dout,  db = sum_N dout
    dx = (dout2 @ w.T).reshape(x.shape)
    dw = x2.T @ dout2
    db = dout2.sum(axis=0) if has_bias else None
    return dx, dw, db


def linear_heads_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, groups: int,
                         heads: int):
    """``linear_forward`` for the stacked projections of attention, split into heads.

    The output columns are ``groups`` blocks (q, k, v side by side) of ``heads`` heads of
    width D each; they come back as one (S, B, H, T, D) array, S = ``groups``, so that
    ``y[0]`` is the (B, H, T, D) query heads. The cache is ``linear_forward``'s, and the
    backward is ``linear_backward`` of the gradient laid out as (B, T, S*H*D).

    Parameters
    ----------
    x : ndarray of shape (B, T, C_in)
    w : ndarray of shape (C_in, S*H*D)
    b : ndarray of shape (S*H*D,), optional
    groups, heads : int
        S and H.

    Returns
    -------
    y : ndarray of shape (S, B, H, T, D)
        C-contiguous, each head's (T, D) rows together, as the compiled version writes it:
        the attention that reads it sees one memory layout on either backend.
    cache : LinearCache
    """
    check_float("x", x, ndim=3)
    check_linear_inputs(x, w, b)
    check_heads(w, groups, heads)
    out, cache = linear_forward(x, w, b)  # (1) (B, T, S*H*D)
    bsz, t, c = out.shape
    heads_view = out.reshape(bsz, t, groups, heads, c // (groups * heads))  # (2)
    return np.ascontiguousarray(heads_view.transpose(2, 0, 3, 1, 4)), cache

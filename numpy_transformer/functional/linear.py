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
__all__ = ['linear_forward', 'linear_backward', 'linear_heads_forward',
           'linear_heads_backward']


class LinearCache(NamedTuple):
    x: np.ndarray  # (..., C_in), the forward's own copy
    w: np.ndarray  # (C_in, C_out), the forward's own copy
    has_bias: bool


class LinearHeadsCache(NamedTuple):
    x: np.ndarray  # (B, T, C_in), the forward's own copy
    ws: tuple  # S weights (C_in, C), the forward's own copies
    has_bias: bool
    heads: int  # H


def check_linear_inputs(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> None:
    """Raise ``ValueError`` unless x is (..., C_in), w (C_in, C_out) and b None or (C_out,)."""
    check_float("x", x)
    check_float("w", w, ndim=2)
    check_last_dim("x", x, w.shape[0])
    if b is not None:
        check_shaped("b", b, w.shape[1:], what="w's columns")


def check_heads(ws: tuple, bs: tuple | None, heads: int) -> None:
    """Raise ``ValueError`` unless ws is a non-empty tuple of (C_in, C) weights whose C split
    into ``heads`` heads, and bs None or a tuple of as many (C,) biases."""
    check_positive("heads", heads, integer=True)
    if not isinstance(ws, tuple) or not ws:
        raise ValueError(f"ws must be a non-empty tuple of weights, got {type(ws).__name__}")
    if bs is not None and (not isinstance(bs, tuple) or len(bs) != len(ws)):
        raise ValueError(f"bs must be None or a tuple of {len(ws)} biases, one per weight")
    for i, w in enumerate(ws):
        check_float(f"ws[{i}]", w, ndim=2)
        if w.shape[1] % heads:
            raise ValueError(f"ws[{i}] has {w.shape[1]} columns, which do not split into "
                             f"{heads} heads")
        if bs is not None:
            check_shaped(f"bs[{i}]", bs[i], w.shape[1:], what="w's columns")


def check_heads_grads(dys, x: np.ndarray, ws: tuple, heads: int) -> None:
    """Raise ``ValueError`` unless dys holds one (B, H, T, D) gradient per weight of ws."""
    if not isinstance(dys, (tuple, list)) or len(dys) != len(ws):
        raise ValueError(f"dys must be {len(ws)} gradients, one per projection")
    bsz, t, _ = x.shape
    for i, (w, dy) in enumerate(zip(ws, dys, strict=True)):
        check_shaped(f"dys[{i}]", dy, (bsz, heads, t, w.shape[1] // heads), np.result_type(x, w))


def split_heads(x: np.ndarray, heads: int) -> np.ndarray:
    """(B, T, C) -> (B, H, T, D) with D = C / H: head h owns features h*D .. (h+1)*D - 1."""
    b, t, c = x.shape
    return x.reshape(b, t, heads, c // heads).transpose(0, 2, 1, 3)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(B, H, T, D) -> (B, T, H*D): the inverse of :func:`split_heads` (and its backward)."""
    b, h, t, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, t, h * d)


def linear_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, *,
                   keep: bool = True):
    """Affine map over the last axis.

    Parameters
    ----------
    x : ndarray of shape (..., C_in)
    w : ndarray of shape (C_in, C_out)
    b : ndarray of shape (C_out,), optional
    keep : bool, default True
        Whether to return the cache a backward needs; False (inference): the cache is None
        and nothing is copied.

    Returns
    -------
    out : ndarray of shape (..., C_out)
    cache : LinearCache or None

    Notes
    -----
    (1) out = x w + b
    """
    check_linear_inputs(x, w, b)
    out = x @ w  # (1) (..., C_out)
    if b is not None:
        out += b
    if not keep:
        return out, None
    # the cache owns what it keeps: the caller may write into x and w before the backward
    return out, LinearCache(x.copy(), w.copy(), b is not None)


def linear_backward(dout: np.ndarray, cache: LinearCache):
    """Returns ``(dx, dw, db)``; ``db`` is ``None`` when the forward had no bias."""
    x, w, has_bias = cache
    if not (isinstance(x, np.ndarray) and isinstance(w, np.ndarray)):
        raise ValueError("cache must be the LinearCache that linear_forward returns, with "
                         f"its x and w; got x {type(x).__name__}, w {type(w).__name__}")
    c_in, c_out = w.shape
    check_shaped("dout", dout, x.shape[:-1] + (c_out,))
    x2, dout2 = x.reshape(-1, c_in), dout.reshape(-1, c_out)  # fold all leading axes: (N, C)
    # (1) out = x w + b   =>   dx = dout w^T,  dw = x^T dout,  db = sum_N dout
    dx = (dout2 @ w.T).reshape(x.shape)
    dw = x2.T @ dout2
    db = dout2.sum(axis=0) if has_bias else None
    return dx, dw, db


def linear_heads_forward(x: np.ndarray, ws: tuple, bs: tuple | None, heads: int, *,
                         keep: bool = True):
    """Several affine maps of one source, each split into heads: attention's projections.

    Parameters
    ----------
    x : ndarray of shape (B, T, C_in)
    ws : tuple of S ndarrays of shape (C_in, C)
        The weights (for example wq, wk, wv), each C = H*D.
    bs : tuple of S ndarrays of shape (C,), or None
        The biases, or none at all.
    heads : int
        H.
    keep : bool, default True
        As :func:`linear_forward`'s.

    Returns
    -------
    ys : tuple of S ndarrays of shape (B, H, T, D)
    cache : LinearHeadsCache or None

    Notes
    -----
    For each weight w_s and bias b_s:

    (1) y_s = x w_s + b_s          (B, T, C)
    (2) y_s = split_heads(y_s)     (B, H, T, D)
    """
    check_float("x", x, ndim=3)
    check_heads(ws, bs, heads)
    for i, w in enumerate(ws):
        check_linear_inputs(x, w, None if bs is None else bs[i])
    ys = []
    for i, w in enumerate(ws):
        y = x @ w  # (1) (B, T, C)
        if bs is not None:
            y += bs[i]  # (1)
        ys.append(split_heads(y, heads))  # (2) (B, H, T, D)
    if not keep:
        return tuple(ys), None
    # the cache owns what it keeps: the caller may write into x and ws before the backward
    return tuple(ys), LinearHeadsCache(x.copy(), tuple(w.copy() for w in ws), bs is not None,
                                       heads)


def linear_heads_backward(dys: tuple, cache: LinearHeadsCache):
    """Gradients of :func:`linear_heads_forward`: returns ``(dx, dws, dbs)``.

    ``dx`` (B, T, C_in) sums the paths through every projection of x; ``dws`` and ``dbs`` are
    tuples of one gradient per weight and bias (``dbs`` is None without biases).
    """
    x, ws, has_bias, heads = cache
    check_heads_grads(dys, x, ws, heads)
    bsz, t, c_in = x.shape
    x2 = x.reshape(-1, c_in)  # (N, C_in), N = B T
    dx = np.zeros_like(x2)  # (N, C_in)
    dws, dbs = [], []
    for w, dy in zip(ws, dys, strict=True):
        dy2 = merge_heads(dy).reshape(-1, w.shape[1])  # (2) split heads  =>  merge (N, C)
        # (1) y = x w + b   =>   dx += dy w^T,  dw = x^T dy,  db = sum_N dy
        dx += dy2 @ w.T
        dws.append(x2.T @ dy2)
        dbs.append(dy2.sum(axis=0) if has_bias else None)
    return dx.reshape(x.shape), tuple(dws), tuple(dbs) if has_bias else None

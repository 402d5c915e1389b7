"""Compositions that the compiled backend fuses into one pass: each written here as the plain
sequence of functional pieces it stands for.

These are the references its fused versions are tested against (same names, same signatures,
same caches), and what the numpy backend runs. None of them adds math: read the pieces in
their own files first.

* ``layer_norm_backward_residual`` / ``rms_norm_backward_residual``: a norm's backward with a
  residual connection's gradient joined, ``dx = dres + norm'(dout)`` (the pre-LN block).
* ``relu_ffn_forward`` / ``relu_ffn_backward``: the ReLU feed-forward network, linear -> ReLU
  -> linear.
* ``embeddings_forward`` / ``embeddings_backward``: token lookup, scale and position rows.
* ``add_into``: the residual addition ``sub += x``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import check_float, check_scalar, check_shaped
from .activations import relu_backward, relu_forward
from .embedding import embedding_backward, embedding_forward
from .linear import LinearCache, linear_backward, linear_forward
from .norms import LayerNormCache, RMSNormCache, layer_norm_backward, rms_norm_backward

# The operations of the backends (numpy_transformer.backend)
__all__ = [
    'layer_norm_backward_residual', 'rms_norm_backward_residual', 'relu_ffn_forward',
    'relu_ffn_backward', 'embeddings_forward', 'embeddings_backward', 'add_into'
]


# ----------------------------------------------------------------------------- norms + residual
def layer_norm_backward_residual(dout: np.ndarray, cache: LayerNormCache, dres: np.ndarray):
    """``(dres + dx, dw, db)``: :func:`layer_norm_backward` of ``dout``, plus ``dres``, the
    gradient that reached the norm's input around it (a residual connection)."""
    check_shaped("dres", dres, cache.x_hat.shape, what="dout")
    dx, dw, db = layer_norm_backward(dout, cache)
    return dres + dx, dw, db


def rms_norm_backward_residual(dout: np.ndarray, cache: RMSNormCache, dres: np.ndarray):
    """``(dres + dx, dw)``: :func:`rms_norm_backward` of ``dout``, plus ``dres``."""
    check_shaped("dres", dres, cache.x_hat.shape, what="dout")
    dx, dw = rms_norm_backward(dout, cache)
    return dres + dx, dw


# ----------------------------------------------------------------------------- ReLU FFN
class FeedForwardCache(NamedTuple):
    x: np.ndarray  # (N, C) the input rows
    h: np.ndarray  # (N, F) the ReLU's output
    w1: np.ndarray  # (C, F)
    w2: np.ndarray  # (F, C)
    shape: tuple  # the input's shape


def relu_ffn_forward(x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray,
                     b2: np.ndarray):
    """``out = max(x w1 + b1, 0) w2 + b2`` over the last axis; returns ``(out, cache)``.

    Notes
    -----
    (1) a = x w1 + b1   (2) h = max(a, 0)   (3) out = h w2 + b2
    """
    a, _ = linear_forward(x, w1, b1)  # (1) (..., F)
    h, _ = relu_forward(a)  # (2)
    out, _ = linear_forward(h, w2, b2)  # (3) (..., C)
    return out, FeedForwardCache(x.reshape(-1, w1.shape[0]), h.reshape(-1, w1.shape[1]), w1,
                                 w2, x.shape)


def relu_ffn_backward(dout: np.ndarray, cache: FeedForwardCache):
    """Returns ``(dx, dw1, db1, dw2, db2)``, dx shaped like the forward's x."""
    x, h, w1, w2, shape = cache
    check_shaped("dout", dout, shape)
    # (3) out = h w2 + b2
    dh, dw2, db2 = linear_backward(dout, LinearCache(h.reshape(shape[:-1] + h.shape[-1:]), w2,
                                                     True))
    # (2) h = max(a, 0): h > 0 exactly where a > 0, so the ReLU's own backward reads h
    da = relu_backward(dh, h.reshape(dh.shape))
    # (1) a = x w1 + b1
    dx, dw1, db1 = linear_backward(da, LinearCache(x.reshape(shape), w1, True))
    return dx, dw1, db1, dw2, db2


# ----------------------------------------------------------------------------- embeddings
def embeddings_forward(ids: np.ndarray, table: np.ndarray, scale: float = 1.0,
                       positions: np.ndarray | None = None):
    """``table[ids] * scale + positions``; returns ``(out, cache)`` with
    :func:`embedding_forward`'s cache.

    Parameters
    ----------
    ids : ndarray of int, shape (B, T)
    table : ndarray of shape (V, C)
    scale : float, default 1.0
    positions : ndarray of shape (T, C), optional
        One row per position, added to every sequence (a position table's first T rows).

    Notes
    -----
    (1) e = table[ids]   (2) e = e * scale   (3) out = e + positions
    """
    check_scalar("scale", scale)
    e, cache = embedding_forward(ids, table)  # (1) (B, T, C)
    e = e * scale  # (2)
    if positions is not None:
        check_shaped("positions", positions, e.shape[1:], what="(T, C) of ids and table")
    return (e if positions is None else e + positions), cache  # (3)


def embeddings_backward(dout: np.ndarray, cache, scale: float = 1.0) -> np.ndarray:
    """``dtable`` (V, C) of :func:`embeddings_forward`; the position rows' gradient is the
    caller's (``dout`` summed over the batch, for a learned table)."""
    check_scalar("scale", scale)
    check_shaped("dout", dout, cache.ids.shape + cache.table_shape[1:])
    # (3) passes dout to e unchanged; (2) e = e * scale; (1) rows summed per id
    return embedding_backward(dout * scale, cache)


# ----------------------------------------------------------------------------- residual
def check_residual(x: np.ndarray, sub: np.ndarray) -> None:
    """Raise ``ValueError`` unless x and sub are float arrays of one shape, sub writeable."""
    check_float("sub", sub)
    check_shaped("x", x, sub.shape, what="sub")
    if not sub.flags.writeable:
        raise ValueError("sub must be writeable: the sum is written into it")


def add_into(x: np.ndarray, sub: np.ndarray) -> np.ndarray:
    """``sub += x`` in place (a residual addition into the sublayer's fresh output); returns
    ``sub``. Both share shape and dtype."""
    check_residual(x, sub)
    return np.add(x, sub, out=sub)

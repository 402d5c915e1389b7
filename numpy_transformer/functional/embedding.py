"""Token embedding: a row lookup ``out[b, t] = table[ids[b, t]]`` and its backward; and the
model's embeddings, the lookup scaled and with position rows added."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import check_float, check_ids, check_scalar, check_shaped

# The operations of the backends (numpy_transformer.backend)
__all__ = ['embedding_forward', 'embedding_backward', 'embeddings_forward', 'embeddings_backward']


class EmbeddingCache(NamedTuple):
    ids: np.ndarray  # (B, T) int, a copy of the caller's
    table_shape: tuple[int, int]  # (V, C)
    dtype: np.dtype


def check_embedding_ids(ids: object, table: np.ndarray) -> np.ndarray:
    """``ids`` as a non-empty (B, T) integer array of rows of ``table``, else ``ValueError``."""
    ids = check_ids("ids", ids, table.shape[0])
    if ids.ndim != 2 or ids.size == 0:
        raise ValueError(f"ids must have shape (B, T) with B, T >= 1, got {ids.shape}")
    return ids


def embedding_forward(ids: np.ndarray, table: np.ndarray, *, keep: bool = True):
    """Look up one row of ``table`` per token id.

    Parameters
    ----------
    ids : ndarray of int, shape (B, T)
    table : ndarray of shape (V, C)
    keep : bool, default True
        Whether to return the cache a backward needs; False (inference): None.

    Returns
    -------
    out : ndarray of shape (B, T, C)
    cache : EmbeddingCache or None

    Raises
    ------
    ValueError
        If ``ids`` is not integer or holds an id outside ``[0, V)``.

    Notes
    -----
    (1) out[b, t, :] = table[ids[b, t], :]
    """
    check_float("table", table, ndim=2)
    ids = check_embedding_ids(ids, table)
    return table[ids], EmbeddingCache(ids.copy(), table.shape, table.dtype) if keep else None


def embedding_backward(dout: np.ndarray, cache: EmbeddingCache) -> np.ndarray:
    """Returns ``dtable`` of shape (V, C): rows of ``dout`` summed per id (repeats accumulate)."""
    ids, (vocab, width), dtype = cache
    check_shaped("dout", dout, ids.shape + (width,))
    # (1) out[b, t] = table[ids[b, t]]  =>  dtable[v] = sum over (b, t) with ids[b, t] == v
    dtable = np.zeros((vocab, width), dtype=dtype)
    np.add.at(dtable, ids.reshape(-1), dout.reshape(-1, width))
    return dtable


def embeddings_forward(ids: np.ndarray, table: np.ndarray, scale: float = 1.0,
                       positions: np.ndarray | None = None, *, keep: bool = True):
    """``table[ids] * scale + positions``; returns ``(out, cache)`` with
    :func:`embedding_forward`'s cache (None without ``keep``).

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
    e, cache = embedding_forward(ids, table, keep=keep)  # (1) (B, T, C)
    e = e * scale  # (2)
    if positions is not None:
        check_shaped("positions", positions, e.shape[1:], what="(T, C) of ids and table")
    return (e if positions is None else e + positions), cache  # (3)


def embeddings_backward(dout: np.ndarray, cache: EmbeddingCache, scale: float = 1.0):
    """``dtable`` (V, C) of :func:`embeddings_forward`; the position rows' gradient is the
    caller's (``dout`` summed over the batch, for a learned table)."""
    check_scalar("scale", scale)
    check_shaped("dout", dout, cache.ids.shape + cache.table_shape[1:])
    # (3) passes dout to e unchanged; (2) e = e * scale; (1) rows summed per id
    return embedding_backward(dout * scale, cache)

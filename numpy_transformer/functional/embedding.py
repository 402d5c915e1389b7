"""Token embedding: a row lookup ``out[b, t] = table[ids[b, t]]`` and its backward."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import check_float, check_ids, check_shaped

# The operations of the backends (numpy_transformer.backend)
__all__ = ['embedding_forward', 'embedding_backward']


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


def embedding_forward(ids: np.ndarray, table: np.ndarray):
    """Look up one row of ``table`` per token id.

    Parameters
    ----------
    ids : ndarray of int, shape (B, T)
    table : ndarray of shape (V, C)

    Returns
    -------
    out : ndarray of shape (B, T, C)
    cache : EmbeddingCache

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
    return table[ids], EmbeddingCache(ids.copy(), table.shape, table.dtype)


def embedding_backward(dout: np.ndarray, cache: EmbeddingCache) -> np.ndarray:
    """Returns ``dtable`` of shape (V, C): rows of ``dout`` summed per id (repeats accumulate)."""
    ids, (vocab, width), dtype = cache
    check_shaped("dout", dout, ids.shape + (width,))
    # (1) out[b, t] = table[ids[b, t]]  =>  dtable[v] = sum over (b, t) with ids[b, t] == v
    dtable = np.zeros((vocab, width), dtype=dtype)
    np.add.at(dtable, ids.reshape(-1), dout.reshape(-1, width))
    return dtable

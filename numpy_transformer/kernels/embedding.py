"""The embeddings in Numba: lookup, scale and positions in one pass, and the table's gradient.

Same contracts as the references in ``functional/embedding.py`` (``tests/test_kernels_step.py``
checks them against those, bit for bit):

* ``out, cache = embeddings_forward(ids, table, scale=1.0, positions=None)``:
  ``out[b, t] = table[ids[b, t]] * scale + positions[t]``, rows in parallel, each entry
  rounded as the three NumPy passes round it (the lookup, ``* scale``, ``+ positions``).
  One pass instead of three, and no intermediate arrays (``benchmarks/README.md``).
* ``dtable = embeddings_backward(dout, cache, scale=1.0)``: the rows of ``dout * scale``
  summed per id, and ``embedding_backward(dout, cache)``, the same with scale 1. The
  reference scatters with ``np.add.at(dtable, ids, dout)``, NumPy's unbuffered
  scatter-add, which handles repeated ids correctly but pays a per-index overhead.
  The loop below does the same additions in the same order: for each token n,
  ``dtable[ids[n]] += dout[n] * scale``. It stays serial: two threads could hit the same row.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .._checks import check_scalar, check_shaped
from ..functional.embedding import EmbeddingCache, check_embedding_ids
from ..threads import alone_below
from ._jit import jit_options
from ._validate import check_cache, check_consistent, check_kernel_float

# The operations this module gives the numba backend (numpy_transformer.backend)
__all__ = ['embeddings_forward', 'embeddings_backward', 'embedding_backward']

_JIT = jit_options(error_model="numpy")


@njit(parallel=True, **_JIT)
def _lookup_rows(ids, table, scale, positions, has_positions, out):  # pragma: no cover
    # ids: (N,) = (B T,) ; table: (V, C); positions: (T, C), unused without; out: (N, C)
    t_len = positions.shape[0]
    for n in prange(ids.size):
        src, dst = table[ids[n]], out[n]
        for j in range(dst.size):
            e = src[j] * scale  # (1) lookup, (2) scale
            if has_positions:
                e = e + positions[n % t_len, j]  # (3) + PE[t]
            dst[j] = e


@njit(**_JIT)
def _scatter_add_rows(dtable, ids, dout, scale):  # pragma: no cover - compiled
    # dtable: (V, C); ids: (N,); dout: (N, C)
    for n in range(ids.size):
        row = ids[n]
        for j in range(dout.shape[1]):
            # (2) e = table[ids] * scale  =>  (1) dtable[v] = sum over n with ids[n] == v
            dtable[row, j] += dout[n, j] * scale


def embeddings_forward(ids: np.ndarray, table: np.ndarray, scale: float = 1.0,
                       positions: np.ndarray | None = None, *, keep: bool = True):
    """``table[ids] * scale + positions``: token rows, scaled, plus one position row per step.

    Parameters
    ----------
    ids : ndarray of int, shape (B, T)
    table : ndarray of shape (V, C)
    scale : float, default 1.0
    positions : ndarray of shape (T, C), table's dtype, optional
    keep : bool, default True
        Whether to return the cache; False (inference): None.

    Returns
    -------
    out : ndarray of shape (B, T, C), table's dtype
    cache : EmbeddingCache or None
        As ``functional.embedding.embedding_forward``'s (its ids a copy, as int64).

    Raises
    ------
    ValueError
        For ids that are not integers in ``[0, V)`` or not (B, T), or positions that are not
        (T, C) of the table's dtype.
    """
    check_kernel_float("table", table, ndim=2)
    ids = check_embedding_ids(ids, table)
    check_scalar("scale", scale)
    has_positions = positions is not None
    if has_positions:
        check_shaped("positions", positions, (ids.shape[1], table.shape[1]), table.dtype,
                     what="(T, C) of ids and table, in the table's dtype")
    out = np.empty(ids.shape + table.shape[1:], dtype=table.dtype)  # (B, T, C)
    ids = ids.astype(np.int64)  # the kernel's dtype, and a copy the cache owns
    with alone_below(ids.size):
        _lookup_rows(ids.reshape(-1), table, table.dtype.type(scale),
                     np.ascontiguousarray(positions) if has_positions else table[:1],
                     has_positions, out.reshape(-1, table.shape[1]))
    return out, EmbeddingCache(ids, table.shape, table.dtype) if keep else None


def embedding_backward(dout: np.ndarray, cache: EmbeddingCache) -> np.ndarray:
    """Returns ``dtable`` of shape (V, C); see ``functional.embedding.embedding_backward``."""
    return embeddings_backward(dout, cache, 1.0)


def embeddings_backward(dout: np.ndarray, cache: EmbeddingCache, scale: float = 1.0):
    """Returns ``dtable`` of shape (V, C): rows of ``dout * scale`` summed per id (repeats
    accumulate); see ``functional.embedding.embeddings_backward``."""
    check_cache(cache, EmbeddingCache, "embeddings_forward")
    ids, table_shape, dtype = cache
    check_consistent(cache, isinstance(ids, np.ndarray) and ids.ndim == 2
                     and ids.dtype.kind in "iu" and len(table_shape) == 2)
    vocab, width = table_shape
    check_shaped("dout", dout, ids.shape + (width,), dtype)
    check_kernel_float("dout", dout)
    check_scalar("scale", scale)
    dtable = np.zeros((vocab, width), dtype=dtype)
    _scatter_add_rows(dtable, ids.reshape(-1).astype(np.int64, copy=False),
                      np.ascontiguousarray(dout, dtype=dtype).reshape(-1, width),
                      dtype.type(scale))
    return dtable

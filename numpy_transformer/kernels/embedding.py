"""The embedding backward in Numba: a drop-in for ``functional.embedding.embedding_backward``.

The reference scatters with ``np.add.at(dtable, ids, dout)``, NumPy's unbuffered scatter-add,
which handles repeated ids correctly but pays a per-index overhead. The loop below does the
same additions in the same order (so the result is bit-for-bit the reference's): for each
token n, ``dtable[ids[n]] += dout[n]``. It stays serial: two threads could hit the same row.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..functional.embedding import EmbeddingCache


@njit(cache=True, nogil=True, error_model="numpy")
def _scatter_add_rows(dtable, ids, dout):  # pragma: no cover - compiled
    # dtable: (V, C); ids: (N,); dout: (N, C)
    for n in range(ids.size):
        row = ids[n]
        for j in range(dout.shape[1]):
            dtable[row, j] += dout[n, j]  # (1) dtable[v] = sum over n with ids[n] == v


def embedding_backward(dout: np.ndarray, cache: EmbeddingCache) -> np.ndarray:
    """Returns ``dtable`` of shape (V, C): rows of ``dout`` summed per id (repeats accumulate)."""
    ids, (vocab, width), dtype = cache
    dtable = np.zeros((vocab, width), dtype=dtype)
    _scatter_add_rows(dtable, ids.reshape(-1).astype(np.int64, copy=False),
                      np.ascontiguousarray(dout, dtype=dtype).reshape(-1, width))
    return dtable

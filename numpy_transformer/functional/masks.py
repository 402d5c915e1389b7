"""Boolean attention masks. ONE convention throughout the library: ``True`` = may attend.

This is the convention of ``torch.nn.functional.scaled_dot_product_attention``. PyTorch's
``nn.MultiheadAttention`` uses the opposite one for ``attn_mask`` / ``key_padding_mask``
(``True`` = masked out); convert with :func:`from_torch_ignore_mask`.

Masks broadcast against scores of shape (B, H, T_q, T_k).
"""

from __future__ import annotations

import numpy as np

# The masks of attention (numpy_transformer.backend offers them with the operations)
__all__ = ['causal_mask', 'key_padding_mask', 'combine_masks', 'from_torch_ignore_mask']


def causal_mask(t_q: int, t_k: int | None = None) -> np.ndarray:
    """Lower-triangular mask: query i may attend key j iff j <= i + (t_k - t_q).

    Parameters
    ----------
    t_q : int
        Number of queries.
    t_k : int, optional
        Number of keys (default ``t_q``). When ``t_k > t_q`` the queries are the *last*
        ``t_q`` positions of the key sequence, as during cached decoding.

    Returns
    -------
    mask : ndarray of bool, shape (T_q, T_k)
    """
    t_k = t_q if t_k is None else t_k
    if t_q < 1 or t_k < t_q:
        raise ValueError(f"causal_mask needs 1 <= t_q <= t_k, got t_q={t_q}, t_k={t_k}")
    return np.tri(t_q, t_k, k=t_k - t_q, dtype=bool)


def key_padding_mask(lengths: np.ndarray, t_k: int) -> np.ndarray:
    """Mask out padded keys: key j of sequence b is visible iff j < lengths[b].

    Returns
    -------
    mask : ndarray of bool, shape (B, 1, 1, T_k)
    """
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or not np.issubdtype(lengths.dtype, np.integer):
        raise ValueError(f"lengths must be a 1-D integer array, got {lengths!r}")
    if (lengths < 0).any() or (lengths > t_k).any():
        raise ValueError(f"lengths must lie in [0, {t_k}], got {lengths.tolist()}")
    return (np.arange(t_k)[None, :] < lengths[:, None])[:, None, None, :]


def combine_masks(*masks: np.ndarray | None) -> np.ndarray | None:
    """Logical AND of the given masks (``None`` entries are skipped; all ``None`` -> ``None``)."""
    out = None
    for m in masks:
        if m is not None:
            out = m if out is None else np.logical_and(out, m)
    return out


def from_torch_ignore_mask(ignore: np.ndarray) -> np.ndarray:
    """Convert an ``nn.MultiheadAttention`` mask (``True`` = ignore) to ours (``True`` = attend)."""
    return ~np.asarray(ignore, dtype=bool)

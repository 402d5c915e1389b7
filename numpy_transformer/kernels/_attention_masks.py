"""The mask analysis of the fused attention, in plain NumPy: what the kernels may skip.

A boolean mask (``True`` = may attend) is either recognised as ``causal_mask`` AND key
padding, whose hidden keys the kernels of ``_attention_kernels.py`` skip without reading
the mask, or handed to them whole, flattened with the element strides of its broadcast.
"""

from __future__ import annotations

import functools

import numpy as np

from ..functional.masks import causal_mask


@functools.lru_cache(maxsize=4)
def _causal(t_q: int, t_k: int) -> np.ndarray:
    m = causal_mask(t_q, t_k)
    m.flags.writeable = False
    return m


def _as_4d(x: np.ndarray) -> np.ndarray:
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


def _analyse_mask(mask, b: int, t_q: int, t_k: int):
    """Split a boolean mask into what the kernel can skip and what it must read element-wise.

    Returns ``(causal, kv_len, rest)``. Either the mask is ``causal_mask(t_q, t_k)`` (when
    ``causal``) AND ``key j < kv_len[b]`` -- what ``causal_mask``, ``key_padding_mask`` and
    ``combine_masks`` build -- and ``rest`` is ``None``; or ``causal`` is False,
    ``kv_len[b] = t_k`` and ``rest`` is the mask (4-D), read element by element.
    Recognising the structure is one pass over the mask, small next to the attention itself.
    """
    all_keys = np.full(b, t_k, dtype=np.int64)
    if mask is None:
        return False, all_keys, None
    m = _as_4d(np.asarray(mask))
    if m.shape[1] != 1 or m.shape[2] not in (1, t_q) or m.shape[3] != t_k:
        return False, all_keys, m  # differs between heads, or broadcast along keys: read it
    rows = m[:, 0]  # (B or 1, T_q or 1, T_k)
    last = rows[:, -1]  # (B or 1, T_k): the last query sees every unpadded key, causal or not
    lengths = last.sum(axis=-1)  # (B or 1,)
    if not np.array_equal(last, np.arange(t_k) < lengths[:, None]):
        return False, all_keys, m  # the visible keys are not a prefix 0 .. kv_len - 1
    kv_len = np.broadcast_to(lengths, (b,)).astype(np.int64)

    def hides_padding(n, rows_b):  # keys n.. of this batch entry hidden from every query
        return not rows_b[:, n:].any()

    if rows.shape[1] == t_q and t_q <= t_k:
        tri = _causal(t_q, t_k)
        if all(np.array_equal(r[:, :n], tri[:, :n]) and hides_padding(n, r)
               for r, n in zip(rows, lengths, strict=True)):
            return True, kv_len, None
    if all(r[:, :n].all() and hides_padding(n, r) for r, n in zip(rows, lengths, strict=True)):
        return False, kv_len, None  # key padding only (or nothing masked)
    return False, all_keys, m


def _flat_with_strides(x: np.ndarray | None, dtype):
    """A 4-D broadcastable array as (1-D contiguous copy, element strides over B,H,T_q,T_k).

    Axes of length 1 get stride 0, so the kernel reads ``flat[b*s0 + h*s1 + i*s2 + j*s3]``
    whatever the broadcast pattern, without ever building the (B, H, T_q, T_k) array.
    """
    if x is None:
        return np.zeros(1, dtype=dtype), np.zeros(4, dtype=np.int64), False
    # a copy, always: the cache keeps it, and the caller may write into its own before the
    # backward (writeable, too: Numba types read-only arrays separately)
    x = np.array(_as_4d(x), dtype=dtype, order="C")
    strides = [s // x.itemsize if n > 1 else 0 for s, n in zip(x.strides, x.shape, strict=True)]
    return x.reshape(-1), np.array(strides, dtype=np.int64), True

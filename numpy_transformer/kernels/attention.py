"""Fused scaled dot-product attention in Numba: a drop-in for the NumPy reference.

Same contract as :mod:`numpy_transformer.functional.attention` (read that file first: it is the
readable reference, and every kernel below is checked against it in
``tests/test_kernel_attention.py``):

* ``out, cache = sdpa_forward(q, k, v, mask=None, bias=None, scale=None, dropout=None)``
* ``dq, dk, dv = sdpa_backward(dout, cache)``

q, k, v and dout may have any strides. The forward copies q, k and v into C-contiguous arrays
its cache owns (the caller may write into its own before the backward); the kernel makes the
copies itself, each work item those of the rows it reads, so that they cost a parallel pass
over rows already in cache instead of three serial ones beforehand. The parts of a general
mask and of a bias it keeps are copies too. The outputs are (B, H, T, D) views of memory laid
out (B, T, H, D), so that merging the heads afterwards is a free reshape; the backward reads
dout in that order, so the model's gradient of the merged heads is read where it lies.

The reference keeps the whole (B, H, T_q, T_k) probability tensor for its backward pass. This
kernel keeps only one number per query row, the log-sum-exp ``lse = m + log(sum_j exp(s_j - m))``,
and rebuilds a block of probability rows ``p = exp(s - lse)`` when the backward pass needs it
(FlashAttention, Dao et al. 2022). Memory is then O(T) per head instead of O(T^2), at the price
of computing ``q k^T`` twice.

Grouped-query attention (k and v with H_kv < H heads, see the reference) runs the same
compiled kernels: the forward repeats each kv head for the G = H / H_kv query heads that read
it, equation (0), while making the copies its cache owns anyway, and the backward sums the
G gradients of each kv head back into one. The cache then holds k and v G times; a kernel
that reads kv head h // G in place would spare that memory, at the price of a second set of
compiled kernels for one index.

A decoding step (``keep=False`` with one query per sequence: a token after the key/value cache,
``nn/decoding.py``) runs none of the compiled code: its keys and values are views of the
cache's buffers, which the kernel would copy whole at every token. It computes the
reference's steps (1)-(5) on them where they lie, the G query heads of a kv head as G rows of
one product, so that (0) copies nothing either (:func:`_decode_step`).

Dropout on the attention weights (``dropout=``, a model's ``attn_dropout`` in training, GPT-2's
``attn_pdrop``) runs in the same kernels: the multipliers scale each block of probabilities
where it is made, equation (4b). The cache keeps a copy of them, as it keeps a general mask
(the reference keeps them too, beside the (B, H, T_q, T_k) probabilities that this cache
does not hold).

Three files: this one holds the public wrappers (validation, the cache, the contract);
``_attention_kernels.py`` the compiled code, with the plan of the kernels in the reference's
step numbers (how the work is split, the causal skipping, the threads); ``_attention_masks.py``
the pure-NumPy analysis of the mask that tells the kernels what they may skip.

References
----------
Vaswani et al., "Attention Is All You Need", 2017.
Dao et al., "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness", 2022.
Milakov & Gimelshein, "Online normalizer calculation for softmax", 2018 (the log-sum-exp trick).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba
import numpy as np

from ..functional.attention import (
    check_attention_inputs,
    check_sdpa_grads,
    repeat_kv,
    repeat_kv_backward,
    scores_forward,
)
from ..threads import blas_on_calling_thread
from ._attention_kernels import _BLOCK_Q, _sdpa_backward_kernel, _sdpa_forward_kernel
from ._attention_masks import _analyse_mask, _flat_with_strides
from ._validate import check_cache, check_consistent, check_kernel_float
from .blas import gemm_address

# The operations this module gives the numba backend (numpy_transformer.backend)
__all__ = ['sdpa_forward', 'sdpa_backward']

# Work items the backward pass makes at least, query blocks allowing: two per thread on up to
# eight threads
_BACKWARD_ITEMS = 16


class SDPAKernelCache(NamedTuple):
    q: np.ndarray  # (B, H, T_q, D) C-contiguous, the forward's own copy (as are k and v)
    k: np.ndarray  # (B, H, T_k, D) C-contiguous
    v: np.ndarray  # (B, H, T_k, D) C-contiguous
    out: np.ndarray  # (B, H, T_q, D) needed for delta_i = sum_d dout_id out_id
    lse: np.ndarray  # (B, H, T_q) float64 log-sum-exp of each row; -inf for a fully masked row
    scale: float
    shape: tuple  # (B, H, T_q, T_k, D)
    causal: bool
    kv_len: np.ndarray  # (B,) int64 number of visible (unpadded) keys per batch entry
    mask: np.ndarray  # 1-D bool, general mask in its own (unbroadcast) shape, a copy; dummy if
    # unused
    mask_strides: np.ndarray  # (4,) int64 element strides of ``mask`` over (B, H, T_q, T_k)
    has_mask: bool
    bias: np.ndarray  # 1-D float, a copy, like ``mask``
    bias_strides: np.ndarray  # (4,) int64
    has_bias: bool
    kv_heads: int  # H_kv of the caller's k and v: the backward sums dk, dv over G = H / H_kv
    dropout: np.ndarray  # 1-D float, the multipliers of (4b), a copy, like ``bias``
    dropout_strides: np.ndarray  # (4,) int64
    has_dropout: bool


def _heads_of(x: np.ndarray, heads: int) -> np.ndarray:
    """(0) x (B, H_kv, T, D) with one head per query head, (B, H, T, D), C-contiguous: the
    reference's ``repeat_kv``, a new array unless H_kv = H, when it is x (copied only if x is
    not C-contiguous)."""
    return np.ascontiguousarray(repeat_kv(x, heads))


def _owned(q, k, v, keep: bool, one_per_head: bool) -> tuple:
    """``(q_own, k_own, v_own)``, what the cache keeps: it owns them, so with ``keep`` empty
    arrays that the kernel fills with copies of q, and of k and v unless (0) made them (H_kv <
    H, ``one_per_head`` False); an array that is not copied is passed as it is."""
    copy_kv = keep and one_per_head
    return (np.empty_like(q) if keep else q,
            *((np.empty_like(k), np.empty_like(v)) if copy_kv else (k, v)))


def _decode_step(q, k, v, mask, bias, scale) -> np.ndarray:
    """(0)-(5) of the reference for one query per sequence, q (B, H, 1, D), over k and v
    (B, H_kv, T_k, D) read where they lie: the G = H / H_kv query heads of kv head j are the
    G rows of one product with it, so nothing of k or v is repeated or copied."""
    b, h, t_q, d = q.shape
    kv_heads, t_k = k.shape[1], k.shape[2]
    grouped = (b, kv_heads, h // kv_heads * t_q, t_k)  # a kv head's G query heads as rows
    if mask is not None and np.all(mask):  # the causal mask of a new position: every key
        mask = None

    def by_group(a):  # a mask or a bias laid out like the grouped scores
        return None if a is None else np.broadcast_to(a, (b, h, t_q, t_k)).reshape(grouped)

    probs, _ = scores_forward(q.reshape(grouped[:3] + (d,)), k, by_group(mask), by_group(bias),
                              scale)  # (0)-(4) (B, H_kv, G, T_k)
    return (probs @ v).reshape(b, h, t_q, d)  # (5)


def _heads_view(b: int, h: int, t: int, d: int, dtype) -> np.ndarray:
    """An empty (B, H, T, D) array whose memory is laid out (B, T, H, D).

    The heads of one position sit side by side, as the model's (B, T, C) activations hold
    them, so merging the heads back (``nn.attention.merge_heads``) is a free reshape.
    """
    return np.empty((b, t, h, d), dtype=dtype).transpose(0, 2, 1, 3)


def sdpa_forward(q, k, v, mask=None, bias=None, scale=None, dropout=None, *, keep=True):
    """Fused scaled dot-product attention, ``softmax(q k^T * scale + bias, masked) v``.

    Same parameters (``keep`` too), returns and errors as
    :func:`numpy_transformer.functional.attention.sdpa_forward`; only the cache differs
    (``SDPAKernelCache``: the per-row log-sum-exp instead of the probabilities).

    Parameters
    ----------
    q : ndarray of shape (B, H, T_q, D), float32 or float64
    k, v : ndarray of shape (B, H_kv, T_k, D), same dtype, H_kv dividing H
    mask : ndarray of bool, broadcastable to (B, H, T_q, T_k), optional
        ``True`` = may attend. ``causal_mask(T_q, T_k)``, ``key_padding_mask(lengths, T_k)`` and
        their AND are recognised and their hidden keys are skipped, not computed.
    bias : ndarray of float, broadcastable to (B, H, T_q, T_k), optional
        Constant additive score bias (ALiBi). Converted to q's dtype.
    scale : float, optional
        Score scale, default ``1 / sqrt(D)``.
    dropout : ndarray of float, broadcastable to (B, H, T_q, T_k), q's dtype, optional
        The multipliers of the attention weights after the softmax (inverted dropout).

    Notes
    -----
    The reference's equations (0)-(5). Stored for backward: lse = log sum_j exp(s_j), so that
    p = exp(s - lse); float64 for either dtype (float32 would shift every rebuilt p by up to
    about 1e-6 relative).
    """
    check_attention_inputs(q, k, v, mask, bias, scale, dropout)
    check_kernel_float("q", q)  # and so k and v, of q's dtype
    if not keep and q.shape[2] == 1 and dropout is None:  # a decoding step: module docstring
        return _decode_step(q, k, v, mask, bias, scale), None
    b, h, t_q, d = q.shape
    t_k, kv_heads = k.shape[2], k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    causal, kv_len, rest = _analyse_mask(mask, b, t_q, t_k)
    mask_flat, mstr, has_mask = _flat_with_strides(rest, np.bool_)
    bias_flat, bstr, has_bias = _flat_with_strides(bias, q.dtype)
    drop_flat, dstr, has_drop = _flat_with_strides(dropout, q.dtype)
    # C-contiguous q, k, v (a copy only where the caller's are not), whatever the caller's
    # strides, so one compiled signature; k and v with one head per query head, (0)
    q, k, v = np.ascontiguousarray(q), _heads_of(k, h), _heads_of(v, h)
    q_own, k_own, v_own = _owned(q, k, v, keep, kv_heads == h)
    out = _heads_view(b, h, t_q, d, q.dtype)  # (B, H, T_q, D)
    lse = np.empty((b, h, t_q), dtype=np.float64)  # (B, H, T_q)
    with blas_on_calling_thread(), numba.parallel_chunksize(h):
        # the kernel writes the memory's own (B, T_q, H, D) order
        _sdpa_forward_kernel(q, k, v, q.dtype.type(scale), causal, kv_len, mask_flat, mstr,
                             has_mask, bias_flat, bstr, has_bias, drop_flat, dstr, has_drop,
                             numba.get_num_threads(), gemm_address(q.dtype), q_own is not q,
                             k_own is not k, q_own, k_own, v_own, out.transpose(0, 2, 1, 3),
                             lse)
    if not keep:
        return out, None
    cache = SDPAKernelCache(q_own, k_own, v_own, out, lse, scale, (b, h, t_q, t_k, d), causal,
                            kv_len, mask_flat, mstr, has_mask, bias_flat, bstr, has_bias,
                            kv_heads, drop_flat, dstr, has_drop)
    return out, cache


def _reach(strides: np.ndarray, extents: tuple) -> int:
    """One past the largest flat index the kernel reads through ``strides`` over ``extents``."""
    return 1 + sum((n - 1) * int(s) for s, n in zip(strides, extents, strict=True))


def _check_cache(c: SDPAKernelCache) -> None:
    """Raise ``ValueError`` unless ``c`` is an SDPAKernelCache whose arrays fit its shape."""
    check_cache(c, SDPAKernelCache, "sdpa_forward")
    arrays = (c.q, c.k, c.v, c.out, c.lse, c.kv_len, c.mask, c.mask_strides, c.bias,
              c.bias_strides, c.dropout, c.dropout_strides)
    ok = all(isinstance(x, np.ndarray) for x in arrays) and len(c.shape) == 5
    if ok:
        b, h, t_q, t_k, d = c.shape
        scores = (b, h, t_q, t_k)
        ok = (c.q.shape == c.out.shape == (b, h, t_q, d)
              and c.k.shape == c.v.shape == (b, h, t_k, d)
              and c.k.flags.c_contiguous and c.v.flags.c_contiguous
              and c.q.dtype == c.k.dtype == c.v.dtype == c.out.dtype
              and c.lse.shape == (b, h, t_q) and c.lse.dtype == np.float64
              and c.kv_len.shape == (b,) and c.kv_len.dtype == np.int64
              and 0 <= c.kv_len.min() and c.kv_len.max() <= t_k
              and c.mask_strides.shape == c.bias_strides.shape == c.dropout_strides.shape
              == (4,) and (c.mask_strides >= 0).all() and (c.bias_strides >= 0).all()
              and (c.dropout_strides >= 0).all()
              and (not c.has_mask or _reach(c.mask_strides, scores) <= c.mask.size)
              and (not c.has_bias or _reach(c.bias_strides, scores) <= c.bias.size)
              and (not c.has_dropout or _reach(c.dropout_strides, scores) <= c.dropout.size)
              and c.bias.dtype == c.dropout.dtype == c.q.dtype
              and isinstance(c.kv_heads, int) and 0 < c.kv_heads <= h and h % c.kv_heads == 0)
    check_consistent(c, ok)
    check_kernel_float("cache.q", c.q)


def sdpa_backward(dout, cache: SDPAKernelCache):
    """Gradients of :func:`sdpa_forward`: returns ``(dq, dk, dv)``, each shaped like its input.

    Rows whose keys are all masked get zero gradients; a masked (query, key) pair contributes
    exactly zero to dq, dk and dv. Like the forward's output, each gradient is a (B, H, T, D)
    view of memory laid out as (B, T, H, D), so that merging its heads is a free reshape;
    dk and dv (B, H_kv, T_k, D) too, in grouped-query attention.
    """
    _check_cache(cache)
    check_sdpa_grads(dout, cache.q)
    b, h, t_q, t_k, d = cache.shape
    dtype = cache.q.dtype
    # (B, T_q, H, D), C-contiguous and writeable whatever the caller passes: one signature
    # of the kernel. The model's dout, its merged heads' gradient split by head, is such an
    # array seen (B, H, T_q, D): then nothing is copied
    dout = np.ascontiguousarray(dout.transpose(0, 2, 1, 3))
    dout = dout if dout.flags.writeable else dout.copy()
    # at least _BACKWARD_ITEMS work items where the query blocks allow: one chunk per head
    # unless there are few heads. A count of the shape alone, not of the threads: the chunks'
    # sums then give the same bits on any thread count
    n_blk = -(-t_q // _BLOCK_Q)
    n_chunks = max(1, min(n_blk, -(-_BACKWARD_ITEMS // (b * h))))
    dq, dk, dv = (_heads_view(b, h, t, d, dtype) for t in (t_q, t_k, t_k))
    part_shape = (b, h, n_chunks, t_k, d) if n_chunks > 1 else (1, 1, 1, 1, 1)  # else unused
    dk_part, dv_part = np.empty(part_shape, dtype), np.empty(part_shape, dtype)
    with blas_on_calling_thread(), numba.parallel_chunksize(h):
        _sdpa_backward_kernel(dout, cache.q, cache.k, cache.v, cache.out, cache.lse,
                              dtype.type(cache.scale), cache.causal, cache.kv_len,
                              cache.mask, cache.mask_strides, cache.has_mask,
                              cache.bias, cache.bias_strides, cache.has_bias,
                              cache.dropout, cache.dropout_strides, cache.has_dropout,
                              numba.get_num_threads(), n_chunks, gemm_address(dtype),
                              dq, dk, dv, dk_part, dv_part)
    if n_chunks > 1:
        dk[...] = dk_part.sum(axis=2)
        dv[...] = dv_part.sum(axis=2)
    if cache.kv_heads < h:
        dk, dv = _group_sum(dk, cache.kv_heads), _group_sum(dv, cache.kv_heads)
    return dq, dk, dv


def _group_sum(dx: np.ndarray, kv_heads: int) -> np.ndarray:
    """(0) k_h = k[h // G]  =>  the reference's ``repeat_kv_backward``: dk_j sums the G query
    heads of group j. dx (B, H, T, D) -> (B, H_kv, T, D), a view of (B, T, H_kv, D) memory."""
    b, _, t, d = dx.shape
    out = _heads_view(b, kv_heads, t, d, dx.dtype)
    out[...] = repeat_kv_backward(dx, kv_heads)
    return out

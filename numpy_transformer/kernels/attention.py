"""Fused scaled dot-product attention in Numba: a drop-in for the NumPy reference.

Same contract as :mod:`numpy_transformer.functional.attention` (read that file first: it is the
readable reference, and every kernel below is checked against it in
``tests/test_kernel_attention.py``):

* ``out, cache = sdpa_forward(q, k, v, mask=None, bias=None, scale=None)``
* ``dq, dk, dv = sdpa_backward(dout, cache, out=None)``

q, k, v and dout may have any strides: the attention module passes views straight into its
stacked (B, T, 3, H, D) projection. The kernel gathers each block of queries into contiguous
scratch itself; keys and values, which every query block reads whole, are copied once. The
outputs are (B, H, T, D) views of memory laid out (B, T, H, D), so that merging the heads
afterwards is a free reshape, and ``out=`` lets the backward pass write dq, dk, dv
straight into the buffer the next matrix product reads.

The reference keeps the whole (B, H, T_q, T_k) probability tensor for its backward pass. This
kernel keeps only one number per query row, the log-sum-exp ``lse = m + log(sum_j exp(s_j - m))``,
and rebuilds a block of probability rows ``p = exp(s - lse)`` when the backward pass needs it
(FlashAttention, Dao et al. 2022). Memory is then O(T) per head instead of O(T^2), at the price
of computing ``q k^T`` twice.

How the work is split
---------------------
Queries are cut into blocks of ``_BLOCK_Q`` rows. A block's scores are kept transposed,
``s_t[j, r] = s[i0 + r, j]``: key j by query r, so that the block's queries sit side by side in
memory. Every softmax loop then runs along a row of ``s_t``, across queries, where the
compiler makes SIMD code of it and each query keeps its own running max and sum. The products
run through OpenBLAS (NumPy's, ``kernels/blas.py``) in pieces of keys small enough for its
small-matrix kernels (measured 1.2-2x faster than whole products at T = 1024). For one
(batch, head) pair and one query block the forward pass does::

    s_t = k (q_blk * scale)^T              (T_k, n)  BLAS            (1)
    s_t = s_t + bias, masked -> -inf                                 (2) (3)
    m   = max over keys,  e = exp(s - m),  z = sum_j e    along the query axis  (4)
    out = (e_t^T v) / z                    (n, D)    BLAS            (5)
    lse = m + log z                        (n,)      kept for the backward pass

and the backward pass, for the same block, with delta_i = sum_d dout_id out_id::

    s_t = k (q_blk * scale)^T              (T_k, n)  recomputed      (1)-(3)
    p_t = exp(s_t - lse)                                             (4)
    dp_t = v dout_blk^T                    (T_k, n)                  (5)
    ds_t = p_t * (dp_t - delta)                                      (4)
    dv += p_t dout_blk,  dk += ds_t (q_blk * scale),  dq_blk = ds_t^T k * scale   (5), (1)

A causal mask is never materialised: query ``i`` sees keys ``j < kend(i) = i + 1 + T_k - T_q``,
so a block stops at its last row's ``kend`` and, within it, key j is skipped for the rows
before ``_first_row(j)``: the upper triangle is skipped, not computed and thrown away. The
products skip it too, up to pieces of ``_DIAG_KEYS`` keys along the block's diagonal
(``_scores_t``, ``_keys_product``, ``_queries_product``).
Per-batch key padding works the same way (``kend`` is also capped at the sequence's length).
Any other boolean mask is read element by element.

The forward pass runs in parallel over (batch, query block, head) items. The backward pass runs
in parallel over (batch, chunk, head) items, where each item owns private dk and dv
accumulators, so no two threads ever add into the same memory; a head is split into several
chunks of query blocks only when there are too few heads to keep every thread busy, and the
chunks' partial sums are added at the end. Work items are handed out H at a time
(``numba.parallel_chunksize(H)``): one thread then writes all heads of a row, which sit side
by side in the (B, T, H, D) outputs (two threads writing alternate heads fought over the
same cache lines), and the long rows at the bottom of a causal triangle do not all land on
one thread.

``exp`` is written out (``special.exp_clamped``) because without Intel's SVML library Numba
calls libm's scalar ``exp`` once per element, which would dominate the run time for small
head widths; the hand-written one vectorises and is as accurate as ``np.exp`` to a few units
in the last place.

References
----------
Vaswani et al., "Attention Is All You Need", 2017.
Dao et al., "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness", 2022.
Milakov & Gimelshein, "Online normalizer calculation for softmax", 2018 (the log-sum-exp trick).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numba
import numpy as np
from numba import njit, prange

from ..functional.attention import check_attention_inputs, check_sdpa_grads
from ..functional.masks import causal_mask
from ..threads import blas_on_calling_thread
from ._jit import jit_options
from ._validate import check_cache, check_consistent, check_kernel_float
from .blas import gemm, gemm_address
from .special import exp_clamped

# The operations this module gives the numba backend (numpy_transformer.backend)
__all__ = ['sdpa_forward', 'sdpa_backward']

# Query rows per block. Measured on the benchmark machine (2 MiB L2 per core, T up to 2048):
# 128 rows were best overall among 64, 128 and 256 (64 and 256 were each 0-10% slower on
# most shapes, 256 faster at T = 512, D = 32). One block's scores, (2048, 128) float32, take
# 1 MiB. Under a causal mask a block computes its rectangle up to its last row's keys, so the
# hidden triangle it computes and discards is 128 * 128 / 2 scores per block.
_BLOCK_Q = 128

_JIT = jit_options(fastmath=False)


class SDPAKernelCache(NamedTuple):
    q: np.ndarray  # (B, H, T_q, D) as given (any strides, not copied)
    k: np.ndarray  # (B, H, T_k, D) C-contiguous (copied if it was a view)
    v: np.ndarray  # (B, H, T_k, D) C-contiguous
    out: np.ndarray  # (B, H, T_q, D) needed for delta_i = sum_d dout_id out_id
    lse: np.ndarray  # (B, H, T_q) float64 log-sum-exp of each row; -inf for a fully masked row
    scale: float
    shape: tuple  # (B, H, T_q, T_k, D)
    causal: bool
    kv_len: np.ndarray  # (B,) int64 number of visible (unpadded) keys per batch entry
    mask: np.ndarray  # 1-D bool, general mask in its own (unbroadcast) shape; dummy if unused
    mask_strides: np.ndarray  # (4,) int64 element strides of ``mask`` over (B, H, T_q, T_k)
    has_mask: bool
    bias: np.ndarray  # 1-D float, like ``mask``
    bias_strides: np.ndarray  # (4,) int64
    has_bias: bool


# ---------------------------------------------------------------------------------------------
# Helpers on a transposed block of scores, s_t[j, r] = s[i0 + r, j]: loops run along r, the
# block's queries, which sit side by side in memory, so the compiler turns them into SIMD code
# and every query keeps its own running max and sum.
# ---------------------------------------------------------------------------------------------

@njit(**_JIT)
def _key_end(i, b, t_q, t_k, causal, kv_len):
    # (3) the structured part of the mask: query i of batch entry b sees keys j < _key_end
    end = kv_len[b]
    if causal:
        end = min(end, i + 1 + t_k - t_q)
    return max(end, 0)


@njit(**_JIT)
def _first_row(j, i0, n, t_q, t_k, causal):
    # (3) the same structure seen from key j: rows r < _first_row of the block starting at
    # query i0 are hidden from it (j >= i + 1 + t_k - t_q), rows from there on see it
    if not causal:
        return 0
    return min(max(j + t_q - t_k - i0, 0), n)


@njit(**_JIT)
def _mask_scores(s_t, i0, n, b, h, t_q, t_k, causal, mask, mstr, has_mask, bias, bstr,
                 has_bias):
    # (2)-(3) in place on the visible part of s_t (k_hi, n): s += bias; s = -inf where masked
    if not (has_mask or has_bias):
        return
    for j in range(s_t.shape[0]):
        row = s_t[j]
        lo = _first_row(j, i0, n, t_q, t_k, causal)
        if has_bias:
            base = b * bstr[0] + h * bstr[1] + i0 * bstr[2] + j * bstr[3]
            for r in range(lo, n):
                row[r] += bias[base + r * bstr[2]]
        if has_mask:
            base = b * mstr[0] + h * mstr[1] + i0 * mstr[2] + j * mstr[3]
            for r in range(lo, n):
                if not mask[base + r * mstr[2]]:
                    row[r] = -np.inf


# Loops over a row segment take the segment as a slice and run from 0: a loop from a start
# that is only known at run time (range(lo, n)) is not turned into SIMD code, because the
# compiler must then allow for a negative index, which NumPy semantics wrap around.

@njit(**_JIT)
def _max_into(m, x):
    # m = max(m, x) entry by entry.  m, x: (n,)
    for r in range(x.size):
        m[r] = max(m[r], x[r])


@njit(**_JIT)
def _add_into(acc, x):
    # acc += x entry by entry.  acc, x: (n,), any float dtypes
    for r in range(x.size):
        acc[r] += x[r]


@njit(**_JIT)
def _exp_minus(x, shift):
    # x = exp(x - shift) entry by entry, 0 where x = -inf.  x, shift: (n,)
    for r in range(x.size):
        x[r] = exp_clamped(x[r] - shift[r])


@njit(**_JIT)
def _softmax_backward_into(p, ds, lse_hi, lse_lo, delta):
    # in place, entry by entry: p holds s -> p, ds holds dp -> ds.  All (n,), one dtype.
    # lse in two parts: in float32 the pair keeps the float64 lse's precision
    for r in range(p.size):
        pr = exp_clamped((p[r] - lse_hi[r]) - lse_lo[r])  # (4) p = exp(s - lse)
        p[r] = pr
        # (4) p = softmax(s)  =>  ds = p * (dp - delta)   (p = 0 masked: ds = 0)
        ds[r] = pr * (ds[r] - delta[r])


@njit(**_JIT)
def _column_max(s_t, i0, n, t_q, t_k, causal, m):
    # (4) m[r] = max_j s[i0 + r, j] over the visible keys, -inf if there are none.
    # s_t: (k_hi, n), m: (>= n,) of s_t's dtype
    m[:n] = -np.inf
    for j in range(s_t.shape[0]):
        lo = _first_row(j, i0, n, t_q, t_k, causal)
        _max_into(m[lo:n], s_t[j, lo:n])


@njit(**_JIT)
def _exp_columns(e_t, i0, n, t_q, t_k, causal, m, z):
    # (4) in place on e_t (k_hi, n): e = exp(s - m[r]), z[r] = sum_j e; 0 where hidden or
    # masked. z: (>= n,) float64, already zeroed. Two loops per row of keys: with the float64
    # sum in the exp's loop the compiler gave up on SIMD code, and a float32 sum (fused, 20%
    # faster) moved the float32 gradients of the PyTorch cross-checks (reference_checks/)
    # from 1.07e-5 to 1.30e-5 relative, past their bar
    for j in range(e_t.shape[0]):
        lo = _first_row(j, i0, n, t_q, t_k, causal)
        e_t[j, :lo] = 0.0
        _exp_minus(e_t[j, lo:n], m[lo:n])
        _add_into(z[lo:n], e_t[j, lo:n])


@njit(**_JIT)
def _softmax_backward_columns(p_t, ds_t, i0, n, t_q, t_k, causal, lse_hi, lse_lo, delta):
    # in place on the transposed block: p_t (k_hi, n) holds s^T -> p^T; ds_t holds
    # dp^T -> ds^T. lse_hi, lse_lo, delta: (>= n,)
    for j in range(p_t.shape[0]):
        lo = _first_row(j, i0, n, t_q, t_k, causal)
        p_t[j, :lo] = 0.0  # hidden by the causal structure: p = 0, ds = 0
        ds_t[j, :lo] = 0.0
        _softmax_backward_into(p_t[j, lo:n], ds_t[j, lo:n], lse_hi[lo:n], lse_lo[lo:n],
                               delta[lo:n])


@njit(**_JIT)
def _copy_rows(src, rows, scale, dst):
    # dst[:rows] = src[:rows] * scale: gathers a strided (rows, D) slice into contiguous scratch
    for r in range(rows):
        for c in range(src.shape[1]):
            dst[r, c] = src[r, c] * scale


@njit(**_JIT)
def _gathered(src, rows, scale, scratch):
    # src[:rows] * scale as a C-contiguous (rows, D) view of the 1-D scratch, for BLAS
    dst = scratch[:rows * src.shape[1]].reshape((rows, src.shape[1]))
    _copy_rows(src, rows, scale, dst)
    return dst


@njit(**_JIT)
def _gathered_t(src, rows, scale, scratch):
    # (src[:rows] * scale)^T as a C-contiguous (D, rows) view of the 1-D scratch: a product
    # k (q^T) with q^T laid out this way (not as q's transposed view) takes OpenBLAS's
    # small-matrix kernels below (1.2-1.5x faster at D = 16-64)
    d = src.shape[1]
    dst = scratch[:rows * d].reshape((d, rows))
    for c in range(d):
        for r in range(rows):
            dst[c, r] = src[r, c] * scale
    return dst


# Products of a block. Without a causal mask every query sees every key (up to k_hi) and the
# products are whole; keys are multiplied in pieces small enough for the small-matrix kernels
# of OpenBLAS (SkylakeX build), which skip its packing step for m * n * k <= 100^3: cutting
# the keys into such pieces was 1.4-2x faster (T = 1024, D = 16-64, one thread: e^T v 65 -> 34
# us at D = 16, 149 -> 112 at D = 64). Under a causal mask the keys from _full_keys on sit on
# the block's diagonal: query r sees key j only from r = _first_row(j) on. Those keys go in
# pieces of _DIAG_KEYS, each multiplied from the first query that sees its first key, so that
# about half of the diagonal square is not computed at all (at the char model's shape, T = 100
# in one block, attention forward and backward took 15% less time than with whole products).
_SMALL_PRODUCT = 1_000_000
_DIAG_KEYS = 32


@njit(**_JIT)
def _key_piece(m, n):
    # keys (rows) per piece, so that one piece's product stays small: m * n * piece <=
    # _SMALL_PRODUCT, for the product of a (piece, m) and an (m, n) matrix, or its transpose
    return max(16, _SMALL_PRODUCT // (m * n))


@njit(**_JIT)
def _full_keys(k_hi, i0, t_q, t_k, causal):
    # keys j < _full_keys are seen by every query of the block starting at i0 (fewer than
    # _DIAG_KEYS of them join the diagonal's first piece: computing a few hidden entries
    # costs less than one more call)
    if not causal:
        return k_hi
    full = min(k_hi, max(0, i0 + 1 + t_k - t_q))
    return full if full >= _DIAG_KEYS else 0


@njit(**_JIT)
def _next_piece(j0, k_hi, i0, n, d, t_q, t_k, causal):
    # (j1, r0): the piece of keys j0 .. j1 - 1 that starts at j0, and the first of the
    # block's n queries to see any of them; products of head width d
    full = _full_keys(k_hi, i0, t_q, t_k, causal)
    j1 = min(full, j0 + _key_piece(d, n)) if j0 < full else min(k_hi, j0 + _DIAG_KEYS)
    return j1, _first_row(j0, i0, n, t_q, t_k, causal)


@njit(**_JIT)
def _scores_t(a, b_t, out, i0, n, t_q, t_k, causal, fn):
    # out[j, r] = a[j] . b_t[:, r] where query r sees key j: the visible part of the product
    # a b_t.  a: (k_hi, D), b_t: (D, n), out: (k_hi, n), its hidden entries left as they were
    j0 = 0
    while j0 < out.shape[0]:
        j1, r0 = _next_piece(j0, out.shape[0], i0, n, a.shape[1], t_q, t_k, causal)
        gemm(a[j0:j1], b_t[:, r0:], out[j0:j1, r0:], fn)
        j0 = j1


@njit(**_JIT)
def _keys_product(p_t, x, out, i0, n, t_q, t_k, causal, fn):
    # out += p_t x, with p_t zero where hidden (those terms are skipped).
    # p_t: (k_hi, n), x: (n, D), out: (k_hi, D)
    j0 = 0
    while j0 < out.shape[0]:
        j1, r0 = _next_piece(j0, out.shape[0], i0, n, x.shape[1], t_q, t_k, causal)
        gemm(p_t[j0:j1, r0:], x[r0:], out[j0:j1], fn, True)
        j0 = j1


@njit(**_JIT)
def _queries_product(e_t, x, out, i0, n, t_q, t_k, causal, fn):
    # out = e_t^T x, summed over the pieces of keys, with e_t zero where hidden (those terms
    # are skipped).  e_t: (k_hi, n), x: (k_hi, D), out: (n, D)
    out[:] = 0.0
    j0 = 0
    while j0 < e_t.shape[0]:
        j1, r0 = _next_piece(j0, e_t.shape[0], i0, n, x.shape[1], t_q, t_k, causal)
        gemm(e_t[j0:j1, r0:].T, x[j0:j1], out[r0:], fn, True)
        j0 = j1


# ---------------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------------

@njit(parallel=True, **_JIT)
def _sdpa_forward_kernel(q, k, v, scale, causal, kv_len, mask, mstr, has_mask, bias, bstr,
                         has_bias, n_threads, fn, out, lse):  # pragma: no cover - compiled
    # Equations (1)-(5) of functional/attention.sdpa_forward, one query block per work item.
    # q: (B, H, T_q, D) any strides, k, v: (B, H, T_k, D) C-contiguous -> out: (B, T_q, H, D)
    # C-contiguous (the caller returns its (B, H, T_q, D) view: a C array, whatever T_q, so
    # decoding one token at a time calls the kernel compiled for training), lse: (B, H, T_q)
    # float64
    n_b, heads, t_q, d = q.shape
    t_k = k.shape[2]
    n_blk = (t_q + _BLOCK_Q - 1) // _BLOCK_Q
    # scratch, one row per thread (n_threads = numba.get_num_threads(), passed in because a
    # compiled function asking for it could not be cached on disk), reused by every block the
    # thread takes: allocating a block's buffers inside the loop made the OS hand out, and
    # zero, fresh pages for every block, which cost a third of the backward pass's time
    s_scratch = np.empty((n_threads, _BLOCK_Q * t_k), q.dtype)  # one block's scores
    qs_scratch = np.empty((n_threads, _BLOCK_Q * d), q.dtype)
    o_scratch = np.empty((n_threads, _BLOCK_Q * d), q.dtype)  # out, before the 1 / z
    m_scratch = np.empty((n_threads, _BLOCK_Q), q.dtype)  # row max
    z_scratch = np.empty((n_threads, _BLOCK_Q))
    for item in prange(n_b * heads * n_blk):
        b, blk, h = item // (heads * n_blk), (item // heads) % n_blk, item % heads
        i0 = blk * _BLOCK_Q
        i1 = min(i0 + _BLOCK_Q, t_q)
        n = i1 - i0
        # rows' visible key ranges only grow with i, so the last row's bounds the block's
        k_hi = _key_end(i1 - 1, b, t_q, t_k, causal, kv_len)
        if k_hi == 0:
            out[b, i0:i1, h] = 0.0
            lse[b, h, i0:i1] = -np.inf
            continue
        tid = numba.get_thread_id()
        qs_t = _gathered_t(q[b, h, i0:i1], n, scale, qs_scratch[tid])  # (D, n) (q * scale)^T
        ks, vs = k[b, h, :k_hi], v[b, h, :k_hi]  # (k_hi, D)
        e_t = s_scratch[tid, :k_hi * n].reshape((k_hi, n))  # (k_hi, n) transposed scores
        _scores_t(ks, qs_t, e_t, i0, n, t_q, t_k, causal, fn)  # (1) s^T = k (q * scale)^T
        _mask_scores(e_t, i0, n, b, h, t_q, t_k, causal, mask, mstr, has_mask, bias, bstr,
                     has_bias)
        m, z = m_scratch[tid], z_scratch[tid]
        _column_max(e_t, i0, n, t_q, t_k, causal, m)  # (4) softmax, stabilised by the max
        for r in range(n):
            z[r] = 0.0
            if m[r] == -np.inf:  # every key masked: e = 0 below, so z = 0 and out = 0
                m[r] = 0.0
        _exp_columns(e_t, i0, n, t_q, t_k, causal, m, z)  # (4) e = exp(s - m), z = sum e
        o = o_scratch[tid, :n * d].reshape((n, d))
        # (5) out = p v = (e v) / z  (n, D)
        _queries_product(e_t, vs, o, i0, n, t_q, t_k, causal, fn)
        for r in range(n):
            i = i0 + r
            lse[b, h, i] = m[r] + math.log(z[r]) if z[r] > 0.0 else -np.inf
            inv_z = q.dtype.type(1.0 / z[r] if z[r] > 0.0 else 0.0)
            for col in range(d):
                out[b, i, h, col] = o[r, col] * inv_z


# ---------------------------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------------------------

@njit(parallel=True, **_JIT)
def _sdpa_backward_kernel(dout, q, k, v, out, lse, scale, causal, kv_len, mask, mstr,
                          has_mask, bias, bstr, has_bias, n_threads, n_chunks, fn,
                          dq, dk, dv, dk_part, dv_part):  # pragma: no cover - compiled
    # Backward of (5)-(1) with p rebuilt from lse; mirrors functional/attention.sdpa_backward.
    # dout, q, out: (B, H, T_q, D), any strides; k, v: (B, H, T_k, D) C-contiguous (the
    # forward's); lse: (B, H, T_q)
    # -> dq: (B, H, T_q, D), dk, dv: (B, H, T_k, D), any strides. With n_chunks > 1 a head's
    # query blocks are shared out: chunk c leaves its sums in dk_part, dv_part[b, h, c]
    # (T_k, D) for the caller to add; with n_chunks == 1 dk_part, dv_part are unused.
    n_b, heads, t_q, d = q.shape
    t_k = k.shape[2]
    n_blk = (t_q + _BLOCK_Q - 1) // _BLOCK_Q
    # scratch, one row per thread (see the forward)
    p_scratch = np.empty((n_threads, _BLOCK_Q * t_k), q.dtype)
    ds_scratch = np.empty((n_threads, _BLOCK_Q * t_k), q.dtype)
    qs_scratch = np.empty((n_threads, 2, _BLOCK_Q * d), q.dtype)  # q * scale, and transposed
    do_scratch = np.empty((n_threads, 2, _BLOCK_Q * d), q.dtype)  # dout, and transposed
    dq_scratch = np.empty((n_threads, _BLOCK_Q * d), q.dtype)  # dq / scale
    acc_scratch = np.empty((n_threads, 2, t_k * d), q.dtype)  # the chunk's dk and dv sums
    row_scratch = np.empty((n_threads, 3, _BLOCK_Q), q.dtype)  # lse (two parts) and delta
    one = q.dtype.type(1)
    for item in prange(n_b * heads * n_chunks):
        b, c, h = item // (heads * n_chunks), (item // heads) % n_chunks, item % heads
        tid = numba.get_thread_id()
        k_all = _key_end(t_q - 1, b, t_q, t_k, causal, kv_len)  # keys any query may see
        ks, vs = k[b, h, :k_all], v[b, h, :k_all]  # (k_all, D)
        dk_acc, dv_acc = acc_scratch[tid, 0], acc_scratch[tid, 1]  # (t_k * D,) flat
        dk_acc[:] = 0.0
        dv_acc[:] = 0.0
        # chunk c takes blocks c, c + n_chunks, ...: under a causal mask each chunk then gets
        # a similar share of short (early) and long (late) rows
        for blk in range(c, n_blk, n_chunks):
            i0 = blk * _BLOCK_Q
            i1 = min(i0 + _BLOCK_Q, t_q)
            n = i1 - i0
            k_hi = _key_end(i1 - 1, b, t_q, t_k, causal, kv_len)
            if k_hi == 0:
                dq[b, h, i0:i1] = 0.0
                continue
            qs = _gathered(q[b, h, i0:i1], n, scale, qs_scratch[tid, 0])  # (n, D) q * scale
            qs_t = _gathered_t(q[b, h, i0:i1], n, scale, qs_scratch[tid, 1])  # (D, n)
            do_blk = _gathered(dout[b, h, i0:i1], n, one, do_scratch[tid, 0])  # (n, D)
            do_t = _gathered_t(dout[b, h, i0:i1], n, one, do_scratch[tid, 1])  # (D, n)
            # lse = lse_hi + lse_lo, two numbers of the scores' dtype (in float32 the pair
            # keeps the float64 lse's precision); 0 for a fully masked row, whose scores are
            # all hidden or -inf, so that p = exp(-inf) = 0 there instead of nan
            lse_hi, lse_lo, delta = row_scratch[tid, 0], row_scratch[tid, 1], row_scratch[tid, 2]
            for r in range(n):
                row_lse = lse[b, h, i0 + r]
                if row_lse == -np.inf:
                    row_lse = 0.0
                lse_hi[r] = row_lse
                lse_lo[r] = row_lse - lse_hi[r]
                total = 0.0  # (4) delta_i = sum_j dp_ij p_ij = sum_d dout_id out_id
                for col in range(d):
                    total += do_blk[r, col] * out[b, h, i0 + r, col]
                delta[r] = total
            p_t = p_scratch[tid, :k_hi * n].reshape((k_hi, n))
            # (1) s^T = k (q * scale)^T, again  (k_hi, n)
            _scores_t(ks[:k_hi], qs_t, p_t, i0, n, t_q, t_k, causal, fn)
            _mask_scores(p_t, i0, n, b, h, t_q, t_k, causal, mask, mstr, has_mask, bias, bstr,
                         has_bias)
            ds_t = ds_scratch[tid, :k_hi * n].reshape((k_hi, n))
            # (5) out = p v  =>  dp^T = v dout^T
            _scores_t(vs[:k_hi], do_t, ds_t, i0, n, t_q, t_k, causal, fn)
            _softmax_backward_columns(p_t, ds_t, i0, n, t_q, t_k, causal, lse_hi, lse_lo, delta)
            # (5) out = p v  =>  dv = p^T dout
            _keys_product(p_t, do_blk, dv_acc[:k_hi * d].reshape((k_hi, d)), i0, n, t_q, t_k,
                          causal, fn)
            # (3), (2) masking and the constant bias pass ds through unchanged
            # (1) s = q k^T * scale  =>  dq = ds k * scale,  dk = ds^T q * scale
            # qs holds q * scale
            _keys_product(ds_t, qs, dk_acc[:k_hi * d].reshape((k_hi, d)), i0, n, t_q, t_k,
                          causal, fn)
            dq_blk = dq_scratch[tid, :n * d].reshape((n, d))
            _queries_product(ds_t, ks[:k_hi], dq_blk, i0, n, t_q, t_k, causal, fn)
            _copy_rows(dq_blk, n, scale, dq[b, h, i0:i1])
        dk_sum, dv_sum = dk_acc.reshape((t_k, d)), dv_acc.reshape((t_k, d))
        if n_chunks == 1:
            _copy_rows(dk_sum, t_k, one, dk[b, h])
            _copy_rows(dv_sum, t_k, one, dv[b, h])
        else:
            _copy_rows(dk_sum, t_k, one, dk_part[b, h, c])  # (not a slice assignment: its
            _copy_rows(dv_sum, t_k, one, dv_part[b, h, c])  # shape check compiles for ~2 s)


# ---------------------------------------------------------------------------------------------
# Python wrappers: validation, mask analysis, the public contract
# ---------------------------------------------------------------------------------------------

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
    """A 4-D broadcastable array as (1-D contiguous copy or view, element strides over B,H,T_q,T_k).

    Axes of length 1 get stride 0, so the kernel reads ``flat[b*s0 + h*s1 + i*s2 + j*s3]``
    whatever the broadcast pattern, without ever building the (B, H, T_q, T_k) array.
    """
    if x is None:
        return np.zeros(1, dtype=dtype), np.zeros(4, dtype=np.int64), False
    x = np.ascontiguousarray(_as_4d(x), dtype=dtype)
    if not x.flags.writeable:  # keep one compiled signature (Numba types read-only separately)
        x = x.copy()
    strides = [s // x.itemsize if n > 1 else 0 for s, n in zip(x.strides, x.shape, strict=True)]
    return x.reshape(-1), np.array(strides, dtype=np.int64), True




def _writeable(x: np.ndarray) -> np.ndarray:
    """x, or a copy if read-only (Numba compiles read-only arrays as a separate type)."""
    return x if x.flags.writeable else x.copy()


def _heads_view(b: int, h: int, t: int, d: int, dtype) -> np.ndarray:
    """An empty (B, H, T, D) array whose memory is laid out (B, T, H, D).

    The heads of one position sit side by side, as the model's (B, T, C) activations hold
    them, so merging the heads back (``nn.attention.merge_heads``) is a free reshape.
    """
    return np.empty((b, t, h, d), dtype=dtype).transpose(0, 2, 1, 3)


def sdpa_forward(q, k, v, mask=None, bias=None, scale=None):
    """Fused scaled dot-product attention, ``softmax(q k^T * scale + bias, masked) v``.

    Same parameters, returns and errors as
    :func:`numpy_transformer.functional.attention.sdpa_forward`; only the cache differs
    (``SDPAKernelCache``: the per-row log-sum-exp instead of the probabilities).

    Parameters
    ----------
    q : ndarray of shape (B, H, T_q, D), float32 or float64
    k, v : ndarray of shape (B, H, T_k, D), same dtype
    mask : ndarray of bool, broadcastable to (B, H, T_q, T_k), optional
        ``True`` = may attend. ``causal_mask(T_q, T_k)``, ``key_padding_mask(lengths, T_k)`` and
        their AND are recognised and their hidden keys are skipped, not computed.
    bias : ndarray of float, broadcastable to (B, H, T_q, T_k), optional
        Constant additive score bias (ALiBi). Converted to q's dtype.
    scale : float, optional
        Score scale, default ``1 / sqrt(D)``.

    Returns
    -------
    out : ndarray of shape (B, H, T_q, D), q's dtype
    cache : SDPAKernelCache

    Raises
    ------
    ValueError
        If shapes, dtypes, the mask or the bias do not fit (same checks as the reference).

    Notes
    -----
    (1) s = q k^T * scale   (2) s += bias   (3) s[~mask] = -inf
    (4) p = softmax(s) along keys (0 for a fully masked row)   (5) out = p v
    Stored for backward: lse = log sum_j exp(s_j), so that p = exp(s - lse). lse is float64
    for either input dtype (one number per row): rounded to float32 it would shift every
    rebuilt p by up to about 1e-6 relative.
    """
    check_attention_inputs(q, k, v, mask, bias, scale)
    check_kernel_float("q", q)  # and so k and v, of q's dtype
    b, h, t_q, d = q.shape
    t_k = k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    causal, kv_len, rest = _analyse_mask(mask, b, t_q, t_k)
    mask_flat, mstr, has_mask = _flat_with_strides(rest, np.bool_)
    bias_flat, bstr, has_bias = _flat_with_strides(bias, q.dtype)
    q = _writeable(q)
    # keys and values are read whole by every query block: one contiguous copy when they are
    # views (the models' own come contiguous, from kernels.linear.linear_heads_forward)
    # instead of a gather per block
    k, v = (_writeable(np.ascontiguousarray(x)) for x in (k, v))
    out = _heads_view(b, h, t_q, d, q.dtype)  # (B, H, T_q, D)
    lse = np.empty((b, h, t_q), dtype=np.float64)  # (B, H, T_q)
    with blas_on_calling_thread(), numba.parallel_chunksize(h):
        # the kernel writes the memory's own (B, T_q, H, D) order
        _sdpa_forward_kernel(q, k, v, q.dtype.type(scale), causal, kv_len, mask_flat, mstr,
                             has_mask, bias_flat, bstr, has_bias, numba.get_num_threads(),
                             gemm_address(q.dtype), out.transpose(0, 2, 1, 3), lse)
    cache = SDPAKernelCache(q, k, v, out, lse, scale, (b, h, t_q, t_k, d), causal, kv_len,
                            mask_flat, mstr, has_mask, bias_flat, bstr, has_bias)
    return out, cache


def _reach(strides: np.ndarray, extents: tuple) -> int:
    """One past the largest flat index the kernel reads through ``strides`` over ``extents``."""
    return 1 + sum((n - 1) * int(s) for s, n in zip(strides, extents, strict=True))


def _check_cache(c: SDPAKernelCache) -> None:
    """Raise ``ValueError`` unless ``c`` is an SDPAKernelCache whose arrays fit its shape."""
    check_cache(c, SDPAKernelCache, "sdpa_forward")
    arrays = (c.q, c.k, c.v, c.out, c.lse, c.kv_len, c.mask, c.mask_strides, c.bias,
              c.bias_strides)
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
              and c.mask_strides.shape == c.bias_strides.shape == (4,)
              and (c.mask_strides >= 0).all() and (c.bias_strides >= 0).all()
              and (not c.has_mask or _reach(c.mask_strides, scores) <= c.mask.size)
              and (not c.has_bias or _reach(c.bias_strides, scores) <= c.bias.size)
              and c.bias.dtype == c.q.dtype)
    check_consistent(c, ok)
    check_kernel_float("cache.q", c.q)


def sdpa_backward(dout, cache: SDPAKernelCache, out=None):
    """Gradients of :func:`sdpa_forward`: returns ``(dq, dk, dv)``, each shaped like its input.

    Rows whose keys are all masked get zero gradients; a masked (query, key) pair contributes
    exactly zero to dq, dk and dv. Like the forward's output, each gradient is a (B, H, T, D)
    view of memory laid out as (B, T, H, D). ``out``, as in the reference: three arrays (any
    strides) that the kernel writes the gradients into directly, returned.
    """
    _check_cache(cache)
    check_sdpa_grads(dout, cache.q, cache.shape[3], out)
    b, h, t_q, t_k, d = cache.shape
    dtype = cache.q.dtype
    dout = _writeable(dout)
    # enough work items for two per thread: one chunk per head unless there are few heads
    n_blk = -(-t_q // _BLOCK_Q)
    n_chunks = max(1, min(n_blk, -(-2 * numba.get_num_threads() // (b * h))))
    if out is None:
        out = tuple(_heads_view(b, h, t, d, dtype) for t in (t_q, t_k, t_k))
    dq, dk, dv = out
    part_shape = (b, h, n_chunks, t_k, d) if n_chunks > 1 else (1, 1, 1, 1, 1)  # else unused
    dk_part, dv_part = np.empty(part_shape, dtype), np.empty(part_shape, dtype)
    with blas_on_calling_thread(), numba.parallel_chunksize(h):
        _sdpa_backward_kernel(dout, cache.q, cache.k, cache.v, cache.out, cache.lse,
                              dtype.type(cache.scale), cache.causal, cache.kv_len,
                              cache.mask, cache.mask_strides, cache.has_mask,
                              cache.bias, cache.bias_strides, cache.has_bias,
                              numba.get_num_threads(), n_chunks, gemm_address(dtype),
                              dq, dk, dv, dk_part, dv_part)
    if n_chunks > 1:
        dk[...] = dk_part.sum(axis=2)
        dv[...] = dv_part.sum(axis=2)
    return out

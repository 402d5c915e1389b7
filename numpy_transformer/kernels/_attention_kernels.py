"""The compiled code of the fused attention: the two kernels and their helpers.

Read ``kernels/attention.py`` first: its header gives the contract, and its wrappers
validate the inputs, analyse the mask (``_attention_masks.py``) and call the two kernels
below, ``_sdpa_forward_kernel`` and ``_sdpa_backward_kernel``. The equation numbers are those
of ``functional/attention.py``.

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
    e_t = e_t * dropout^T                   with dropout only                (4b)

and the backward pass, for the same block, with delta_i = sum_d dout_id out_id::

    s_t = k (q_blk * scale)^T              (T_k, n)  recomputed      (1)-(3)
    p_t = exp(s_t - lse)                                             (4)
    dp_t = v dout_blk^T                    (T_k, n)                  (5)
    dp_t = dp_t * dropout^T,  after ds: p_t = p_t * dropout^T    (4b), with dropout only
    ds_t = p_t * (dp_t - delta)                                      (4)
    dv += p_t dout_blk,  dk += ds_t (q_blk * scale),  dq_blk = ds_t^T k * scale   (5), (1)

With dropout of the weights, (4b) p~ = p * dropout, the multipliers scale each block where
its probabilities are made: before the product with v in the forward pass; in the backward
pass, dp~ into dp, and p into p~ for dv after ds is made from p. The row sums need no change:
out = p~ v gives delta_i = sum_j dp_ij p_ij = sum_d dout_id out_id with dp = dp~ * dropout, as
without dropout.

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
chunks of query blocks only when there are few (batch, head) pairs (fewer than
``attention._BACKWARD_ITEMS``: a count of the shape, never of the threads), and the chunks'
partial sums are added at the end, in order. So both passes give the same bits on any number of
threads (``tests/test_threads.py``). Work items are handed out H at a time
(``numba.parallel_chunksize(H)``): one thread then writes all heads of a row, which sit side by
side in the (B, T, H, D) outputs (two threads writing alternate heads fought over the same
cache lines), and the long rows at the bottom of a causal triangle do not all land on one
thread.

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

import math

import numba
import numpy as np
from numba import njit, prange

from ._jit import helper, jit_options
from .blas import gemm
from .special import exp_clamped

# Query rows per block. Measured on the benchmark machine (T up to 2048): 128 rows were best
# overall among 64, 128 and 256 (64 and 256 were each 0-10% slower on most shapes, 256 faster
# at T = 512, D = 32). One block's scores, (2048, 128) float32, fit in a core's L2 cache.
# Under a causal mask a block computes its rectangle up to its last row's keys, so the
# hidden triangle it computes and discards is 128 * 128 / 2 scores per block.
_BLOCK_Q = 128

_JIT = jit_options(fastmath=False)


# ---------------------------------------------------------------------------------------------
# Helpers on a transposed block of scores, s_t[j, r] = s[i0 + r, j]: loops run along r, the
# block's queries, which sit side by side in memory, so the compiler turns them into SIMD code
# and every query keeps its own running max and sum.
# ---------------------------------------------------------------------------------------------

@helper(_JIT)
def _key_end(i, b, t_q, t_k, causal, kv_len):
    # (3) the structured part of the mask: query i of batch entry b sees keys j < _key_end
    end = kv_len[b]
    if causal:
        end = min(end, i + 1 + t_k - t_q)
    return max(end, 0)


@helper(_JIT)
def _first_row(j, i0, n, t_q, t_k, causal):
    # (3) the same structure seen from key j: rows r < _first_row of the block starting at
    # query i0 are hidden from it (j >= i + 1 + t_k - t_q), rows from there on see it
    if not causal:
        return 0
    return min(max(j + t_q - t_k - i0, 0), n)


@helper(_JIT)
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


@helper(_JIT)
def _drop_scores(x_t, i0, n, b, h, t_q, t_k, causal, drop, dstr):
    # (4b) x = x * dropout in place on the visible part of a transposed block x_t (k_hi, n):
    # e before the product with v, dp~ into dp, p into p~
    for j in range(x_t.shape[0]):
        row = x_t[j]
        lo = _first_row(j, i0, n, t_q, t_k, causal)
        base = b * dstr[0] + h * dstr[1] + i0 * dstr[2] + j * dstr[3]
        for r in range(lo, n):
            row[r] *= drop[base + r * dstr[2]]


# Loops over a row segment take the segment as a slice and run from 0: a loop from a start
# that is only known at run time (range(lo, n)) is not turned into SIMD code, because the
# compiler must then allow for a negative index, which NumPy semantics wrap around.

@helper(_JIT)
def _max_into(m, x):
    # m = max(m, x) entry by entry.  m, x: (n,)
    for r in range(x.size):
        m[r] = max(m[r], x[r])


@helper(_JIT)
def _add_into(acc, x):
    # acc += x entry by entry.  acc, x: (n,), any float dtypes
    for r in range(x.size):
        acc[r] += x[r]


@helper(_JIT)
def _exp_minus(x, shift):
    # x = exp(x - shift) entry by entry, 0 where x = -inf.  x, shift: (n,)
    for r in range(x.size):
        x[r] = exp_clamped(x[r] - shift[r])


@helper(_JIT)
def _softmax_backward_into(p, ds, lse_hi, lse_lo, delta):
    # in place, entry by entry: p holds s -> p, ds holds dp -> ds.  All (n,), one dtype.
    # lse in two parts: in float32 the pair keeps the float64 lse's precision
    for r in range(p.size):
        pr = exp_clamped((p[r] - lse_hi[r]) - lse_lo[r])  # (4) p = exp(s - lse)
        p[r] = pr
        # (4) p = softmax(s)  =>  ds = p * (dp - delta)   (p = 0 masked: ds = 0)
        ds[r] = pr * (ds[r] - delta[r])


@helper(_JIT)
def _column_max(s_t, i0, n, t_q, t_k, causal, m):
    # (4) m[r] = max_j s[i0 + r, j] over the visible keys, -inf if there are none.
    # s_t: (k_hi, n), m: (>= n,) of s_t's dtype
    m[:n] = -np.inf
    for j in range(s_t.shape[0]):
        lo = _first_row(j, i0, n, t_q, t_k, causal)
        _max_into(m[lo:n], s_t[j, lo:n])


@helper(_JIT)
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


@helper(_JIT)
def _softmax_backward_columns(p_t, ds_t, i0, n, t_q, t_k, causal, lse_hi, lse_lo, delta):
    # in place on the transposed block: p_t (k_hi, n) holds s^T -> p^T; ds_t holds
    # dp^T -> ds^T. lse_hi, lse_lo, delta: (>= n,)
    for j in range(p_t.shape[0]):
        lo = _first_row(j, i0, n, t_q, t_k, causal)
        p_t[j, :lo] = 0.0  # hidden by the causal structure: p = 0, ds = 0
        ds_t[j, :lo] = 0.0
        _softmax_backward_into(p_t[j, lo:n], ds_t[j, lo:n], lse_hi[lo:n], lse_lo[lo:n],
                               delta[lo:n])


@helper(_JIT)
def _copy_rows(src, rows, scale, dst):
    # dst[:rows] = src[:rows] * scale: gathers a strided (rows, D) slice into contiguous scratch
    for r in range(rows):
        for c in range(src.shape[1]):
            dst[r, c] = src[r, c] * scale


@helper(_JIT)
def _gathered(src, rows, scale, scratch):
    # src[:rows] * scale as a C-contiguous (rows, D) view of the 1-D scratch, for BLAS
    dst = scratch[:rows * src.shape[1]].reshape((rows, src.shape[1]))
    _copy_rows(src, rows, scale, dst)
    return dst


@helper(_JIT)
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
# The loops over the pieces start from np.intp(0), not 0: Numba types a while loop's first call
# with the literal 0 as an argument of its own type, Literal[int](0), and compiled
# _next_piece and _first_row a second time for it


@helper(_JIT)
def _key_piece(m, n):
    # keys (rows) per piece, so that one piece's product stays small: m * n * piece <=
    # _SMALL_PRODUCT, for the product of a (piece, m) and an (m, n) matrix, or its transpose
    return max(16, _SMALL_PRODUCT // (m * n))


@helper(_JIT)
def _full_keys(k_hi, i0, t_q, t_k, causal):
    # keys j < _full_keys are seen by every query of the block starting at i0 (fewer than
    # _DIAG_KEYS of them join the diagonal's first piece: computing a few hidden entries
    # costs less than one more call)
    if not causal:
        return k_hi
    full = min(k_hi, max(0, i0 + 1 + t_k - t_q))
    return full if full >= _DIAG_KEYS else 0


@helper(_JIT)
def _next_piece(j0, k_hi, i0, n, d, t_q, t_k, causal):
    # (j1, r0): the piece of keys j0 .. j1 - 1 that starts at j0, and the first of the
    # block's n queries to see any of them; products of head width d
    full = _full_keys(k_hi, i0, t_q, t_k, causal)
    j1 = min(full, j0 + _key_piece(d, n)) if j0 < full else min(k_hi, j0 + _DIAG_KEYS)
    return j1, _first_row(j0, i0, n, t_q, t_k, causal)


@helper(_JIT)
def _scores_t(a, b_t, out, i0, n, t_q, t_k, causal, fn):
    # out[j, r] = a[j] . b_t[:, r] where query r sees key j: the visible part of the product
    # a b_t.  a: (k_hi, D), b_t: (D, n), out: (k_hi, n), its hidden entries left as they were
    j0 = np.intp(0)  # not the literal 0: see the note above _key_piece
    while j0 < out.shape[0]:
        j1, r0 = _next_piece(j0, out.shape[0], i0, n, a.shape[1], t_q, t_k, causal)
        gemm(a[j0:j1], b_t[:, r0:], out[j0:j1, r0:], fn)
        j0 = j1


@helper(_JIT)
def _keys_product(p_t, x, out, i0, n, t_q, t_k, causal, fn):
    # out += p_t x, with p_t zero where hidden (those terms are skipped).
    # p_t: (k_hi, n), x: (n, D), out: (k_hi, D)
    j0 = np.intp(0)  # not the literal 0: see the note above _key_piece
    while j0 < out.shape[0]:
        j1, r0 = _next_piece(j0, out.shape[0], i0, n, x.shape[1], t_q, t_k, causal)
        gemm(p_t[j0:j1, r0:], x[r0:], out[j0:j1], fn, True)
        j0 = j1


@helper(_JIT)
def _queries_product(e_t, x, out, i0, n, t_q, t_k, causal, fn):
    # out = e_t^T x, summed over the pieces of keys, with e_t zero where hidden (those terms
    # are skipped).  e_t: (k_hi, n), x: (k_hi, D), out: (n, D)
    out[:] = 0.0
    j0 = np.intp(0)  # not the literal 0: see the note above _key_piece
    while j0 < e_t.shape[0]:
        j1, r0 = _next_piece(j0, e_t.shape[0], i0, n, x.shape[1], t_q, t_k, causal)
        gemm(e_t[j0:j1, r0:].T, x[j0:j1], out[r0:], fn, True)
        j0 = j1


# ---------------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------------

@njit(parallel=True, **_JIT)
def _sdpa_forward_kernel(q, k, v, scale, causal, kv_len, mask, mstr, has_mask, bias, bstr,
                         has_bias, drop, dstr, has_drop, n_threads, fn, copy_q, copy_kv,
                         q_own, k_own, v_own, out, lse):
    # pragma: no cover - compiled
    # Equations (1)-(5) of functional/attention.sdpa_forward, one query block per work item.
    # q: (B, H, T_q, D), k, v: (B, H, T_k, D), all C-contiguous -> out: (B, T_q, H, D)
    # C-contiguous (the caller returns its (B, H, T_q, D) view: a C array, whatever T_q, so
    # decoding one token at a time calls the kernel compiled for training), lse: (B, H, T_q)
    # float64. With copy_q, q_own = q, and with copy_kv, k_own = k and v_own = v: the cache's
    # copies, each item copying what it reads (its query rows; block 0 its head's keys and
    # values), on every thread while the rows are in cache
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
    one = q.dtype.type(1)
    for item in prange(n_b * heads * n_blk):
        b, blk, h = item // (heads * n_blk), (item // heads) % n_blk, item % heads
        i0 = blk * _BLOCK_Q
        i1 = min(i0 + _BLOCK_Q, t_q)
        n = i1 - i0
        if copy_q:  # the cache's copies (the wrapper's flags)
            _copy_rows(q[b, h, i0:i1], n, one, q_own[b, h, i0:i1])
        if copy_kv and blk == 0:
            _copy_rows(k[b, h], t_k, one, k_own[b, h])
            _copy_rows(v[b, h], t_k, one, v_own[b, h])
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
        if has_drop:  # (4b) p~ = p * dropout: e~ = e * dropout, over the same z
            _drop_scores(e_t, i0, n, b, h, t_q, t_k, causal, drop, dstr)
        o = o_scratch[tid, :n * d].reshape((n, d))
        # (5) out = p~ v = (e~ v) / z  (n, D)
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

@helper(_JIT)
def _backward_scratch(n_threads, t_k, d, dtype):
    # The backward's scratch, one row per thread (see the forward): p, ds (BLOCK_Q * T_k);
    # q * scale and dout, each also transposed; dq / scale; the chunk's dk and dv sums; lse
    # (two parts) and delta of a block's rows
    return (np.empty((n_threads, _BLOCK_Q * t_k), dtype),
            np.empty((n_threads, _BLOCK_Q * t_k), dtype),
            np.empty((n_threads, 2, _BLOCK_Q * d), dtype),
            np.empty((n_threads, 2, _BLOCK_Q * d), dtype),
            np.empty((n_threads, _BLOCK_Q * d), dtype),
            np.empty((n_threads, 2, t_k * d), dtype),
            np.empty((n_threads, 3, _BLOCK_Q), dtype))


@helper(_JIT)
def _store_key_sums(dk_acc, dv_acc, t_k, d, dk, dv):
    # dk, dv (T_k, D), any strides = a chunk's flat sums (not a slice assignment: its shape
    # check is slow to compile)
    one = dk_acc.dtype.type(1)
    _copy_rows(dk_acc.reshape((t_k, d)), t_k, one, dk)
    _copy_rows(dv_acc.reshape((t_k, d)), t_k, one, dv)


@helper(_JIT)
def _row_terms(lse, do_blk, out, n, lse_hi, lse_lo, delta):
    # The backward's per-row numbers of a query block of n rows. lse = lse_hi + lse_lo, two
    # numbers of the scores' dtype (in float32 the pair keeps the float64 lse's precision); 0
    # for a fully masked row, whose scores are all hidden or -inf, so that p = exp(-inf) = 0
    # there instead of nan. (4) delta_i = sum_j dp_ij p_ij = sum_d dout_id out_id.
    for r in range(n):
        row_lse = lse[r]
        if row_lse == -np.inf:
            row_lse = 0.0
        lse_hi[r] = row_lse
        lse_lo[r] = row_lse - lse_hi[r]
        total = 0.0
        for col in range(do_blk.shape[1]):
            total += do_blk[r, col] * out[r, col]
        delta[r] = total


@njit(parallel=True, **_JIT)
def _sdpa_backward_kernel(dout, q, k, v, out, lse, scale, causal, kv_len, mask, mstr,
                          has_mask, bias, bstr, has_bias, drop, dstr, has_drop, n_threads,
                          n_chunks, fn, dq, dk, dv, dk_part, dv_part):
    # pragma: no cover - compiled
    # Backward of (5)-(1) with p rebuilt from lse; mirrors functional/attention.sdpa_backward.
    # dout: (B, T_q, H, D) C-contiguous, the memory order the forward writes out in (the
    # wrapper's; the model's merged heads as they lie); q, out: (B, H, T_q, D), any
    # strides; k, v: (B, H, T_k, D) C-contiguous (the forward's); lse: (B, H, T_q)
    # -> dq: (B, H, T_q, D), dk, dv: (B, H, T_k, D), any strides. With n_chunks > 1 a head's
    # query blocks are shared out: chunk c leaves its sums in dk_part, dv_part[b, h, c]
    # (T_k, D) for the caller to add; with n_chunks == 1 dk_part, dv_part are unused.
    (n_b, heads, t_q, d), t_k = q.shape, k.shape[2]
    n_blk = (t_q + _BLOCK_Q - 1) // _BLOCK_Q
    p_scratch, ds_scratch, qs_scratch, do_scratch, dq_scratch, acc_scratch, row_scratch = \
        _backward_scratch(n_threads, t_k, d, q.dtype)
    one = q.dtype.type(1)
    for item in prange(n_b * heads * n_chunks):
        b, c, h = item // (heads * n_chunks), (item // heads) % n_chunks, item % heads
        tid = numba.get_thread_id()
        k_all = _key_end(t_q - 1, b, t_q, t_k, causal, kv_len)  # keys any query may see
        ks, vs = k[b, h, :k_all], v[b, h, :k_all]  # (k_all, D)
        acc_scratch[tid] = 0.0
        dk_acc, dv_acc = acc_scratch[tid, 0], acc_scratch[tid, 1]  # (t_k * D,) flat
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
            do_blk = _gathered(dout[b, i0:i1, h], n, one, do_scratch[tid, 0])  # (n, D)
            do_t = _gathered_t(dout[b, i0:i1, h], n, one, do_scratch[tid, 1])  # (D, n)
            lse_hi, lse_lo, delta = row_scratch[tid, 0], row_scratch[tid, 1], row_scratch[tid, 2]
            _row_terms(lse[b, h, i0:i1], do_blk, out[b, h, i0:i1], n, lse_hi, lse_lo, delta)
            p_t = p_scratch[tid, :k_hi * n].reshape((k_hi, n))
            # (1) s^T = k (q * scale)^T, again  (k_hi, n)
            _scores_t(ks[:k_hi], qs_t, p_t, i0, n, t_q, t_k, causal, fn)
            _mask_scores(p_t, i0, n, b, h, t_q, t_k, causal, mask, mstr, has_mask, bias, bstr,
                         has_bias)
            ds_t = ds_scratch[tid, :k_hi * n].reshape((k_hi, n))
            # (5) out = p~ v  =>  dp~^T = v dout^T
            _scores_t(vs[:k_hi], do_t, ds_t, i0, n, t_q, t_k, causal, fn)
            if has_drop:  # (4b) p~ = p * dropout  =>  dp = dp~ * dropout
                _drop_scores(ds_t, i0, n, b, h, t_q, t_k, causal, drop, dstr)
            _softmax_backward_columns(p_t, ds_t, i0, n, t_q, t_k, causal, lse_hi, lse_lo, delta)
            if has_drop:  # (4b) p~ = p * dropout, for dv
                _drop_scores(p_t, i0, n, b, h, t_q, t_k, causal, drop, dstr)
            # (5) out = p~ v  =>  dv = p~^T dout
            _keys_product(p_t, do_blk, dv_acc[:k_hi * d].reshape((k_hi, d)), i0, n, t_q, t_k,
                          causal, fn)
            # (3), (2) masking and the constant bias pass ds through unchanged
            # (1) s = q k^T * scale  =>  dq = ds k * scale,  dk = ds^T q * scale (qs: q * scale)
            _keys_product(ds_t, qs, dk_acc[:k_hi * d].reshape((k_hi, d)), i0, n, t_q, t_k,
                          causal, fn)
            dq_blk = dq_scratch[tid, :n * d].reshape((n, d))
            _queries_product(ds_t, ks[:k_hi], dq_blk, i0, n, t_q, t_k, causal, fn)
            _copy_rows(dq_blk, n, scale, dq[b, h, i0:i1])
        if n_chunks == 1:
            _store_key_sums(dk_acc, dv_acc, t_k, d, dk[b, h], dv[b, h])
        else:
            _store_key_sums(dk_acc, dv_acc, t_k, d, dk_part[b, h, c], dv_part[b, h, c])

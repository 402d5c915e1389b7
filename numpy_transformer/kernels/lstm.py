"""The LSTM recurrence in Numba: a drop-in for ``functional/lstm.py``.

Same contract as the readable reference (read that file first; ``tests/test_kernel_lstm.py``
checks this one against it, float32 and float64, random upstream gradients):

* ``out, (h_T, c_T), cache = lstm_forward(x, h0, c0, w_ih, w_hh, b)``
* ``dx, dh0, dc0, dw_ih, dw_hh, db = lstm_backward(dout, dh_T, dc_T, cache)``

with the very same ``LSTMCache``. In the reference's step numbers:

* Forward. The input part of (1), ``x_t W_ih + b``, is one matrix product for every step at
  once. The time loop then does, per step, only the product ``h_{t-1} W_hh`` (added onto that
  step's rows) and one fused pass over the gates: (2), (3) and (4) element by element, the
  activated gates written over their pre-activations.
* Backward. Per step, one fused pass computes ``dz_t`` from (4), (3), (2) (from the gates
  and ``tanh(c_t)`` the forward kept: no exp in the backward) and carries ``dc``, adding
  ``dz_t`` into ``db`` as it goes; one product gives ``dh_{t-1} = dz_t W_hh^T``. The weight
  gradients and ``dx`` of (1) wait until the loop is done: ``sum_t x_t^T dz_t`` and
  ``sum_t h_{t-1}^T dz_t`` are each one product over all steps, as is ``dx = dz W_ih^T``.

Sequences never interact, so the batch is cut into chunks of sequences and each chunk runs
its whole time loop, forward or backward, on one of Numba's threads: no thread waits for
another at any step. A chunk's weight gradients are its own partial sums, added at the end
(``db`` in float64). The chunks depend only on the batch size, not on the thread count, so
the results are bit for bit the same on any number of threads.

The nonlinearities are written with the vectorised ``exp`` of ``kernels/special.py``:
σ(z) = 1 / (1 + e) for z >= 0 and e / (1 + e) below, with e = exp(-|z|), and
tanh(z) = ±(1 - e) / (1 + e) with e = exp(-2|z|). Their error is within a few units of the
dtype's last place of 1 (absolute): float32 results agree with the reference to about 1e-6.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .._checks import check_shaped
from ..functional.lstm import LSTMCache, check_lstm_cache, check_lstm_inputs
from ..threads import blas_on_calling_thread
from ._jit import jit_options
from .blas import gemm, gemm_address
from .special import exp_clamped

# The operations this module gives the numba backend (numpy_transformer.backend)
__all__ = ['lstm_forward', 'lstm_backward']

_CHUNK_ROWS = 32  # sequences per chunk (about): B = 64 is two chunks, one per core
_JIT = jit_options(error_model="numpy")


def _chunks(batch: int) -> int:
    return -(-batch // _CHUNK_ROWS)


@njit(inline="always", **_JIT)
def _sigmoid(z, one):  # pragma: no cover - compiled
    e = exp_clamped(-abs(z))  # exp(-|z|) in (0, 1]: never overflows
    return one / (one + e) if z >= 0 else e / (one + e)


@njit(inline="always", **_JIT)
def _tanh(z, one):  # pragma: no cover - compiled
    a = abs(z)
    e = exp_clamped(-(a + a))  # exp(-2|z|)
    t = (one - e) / (one + e)
    return t if z >= 0 else -t


@njit(parallel=True, **_JIT)
def _forward_kernel(x2, h0, c0, w_ih, w_hh, b, n_chunks, gemm_fn, x_own, z2, h2, c2, tc2):
    # pragma: no cover - compiled
    # x2: (B T, C), row b T + t is x_t of sequence b; h0, c0: (B, H); w_ih: (C, 4H);
    # w_hh: (H, 4H); b: (4H,) -> x_own: (B T, C) the cache's copy of x2; z2: (B T, 4H)
    # gates, h2, c2, tc2 = tanh(c2): (B T, H), rows as x2's
    bsz, hidden = h0.shape
    t_len = z2.shape[0] // bsz
    one = z2.dtype.type(1)
    step = -(-bsz // n_chunks)
    for k in prange(n_chunks):
        lo, hi = k * step, min(bsz, (k + 1) * step)
        r0, r1 = lo * t_len, hi * t_len
        for q in range(r0, r1):  # the chunk's rows of x, copied while they pass through cache
            for j in range(x2.shape[1]):
                x_own[q, j] = x2[q, j]
        z = z2[r0:r1]
        gemm(x_own[r0:r1], w_ih, z, gemm_fn)  # (1) x_t W_ih, every step of the chunk at once
        for q in range(r1 - r0):
            for j in range(4 * hidden):
                z[q, j] += b[j]  # (1) + b
        for t in range(t_len):
            z_t = z2[r0 + t:r1:t_len]  # (rows, 4H): step t of each sequence of the chunk
            if t == 0:
                gemm(h0[lo:hi], w_hh, z_t, gemm_fn, True)  # (1) + h_0 W_hh
            else:
                gemm(h2[r0 + t - 1:r1:t_len], w_hh, z_t, gemm_fn, True)  # (1) + h_{t-1} W_hh
            for r in range(hi - lo):
                q = r0 + r * t_len + t
                c_prev = c0[lo + r] if t == 0 else c2[q - 1]
                zq, cq, tq, hq = z2[q], c2[q], tc2[q], h2[q]
                for j in range(hidden):
                    i = _sigmoid(zq[j], one)  # (2)
                    f = _sigmoid(zq[hidden + j], one)
                    g = _tanh(zq[2 * hidden + j], one)
                    o = _sigmoid(zq[3 * hidden + j], one)
                    zq[j], zq[hidden + j], zq[2 * hidden + j], zq[3 * hidden + j] = i, f, g, o
                    cq[j] = f * c_prev[j] + i * g  # (3)
                    tq[j] = _tanh(cq[j], one)
                    hq[j] = o * tq[j]  # (4)


@njit(parallel=True, **_JIT)
def _backward_kernel(dout2, x2, h0, c0, w_ih_t, w_hh_t, gates2, h2, c2, tc2, n_chunks,
                     gemm_fn, dh, dc, dz2, dx2, dw_ih_part, dw_hh_part, db_part):
    # pragma: no cover - compiled
    # rows as in _forward_kernel; w_ih_t (4H, C) and w_hh_t (4H, H) are the C-contiguous
    # transposed weights (a product with them runs 1.4x faster than with the transposed
    # views). dh, dc: (B, H) hold dh_T, dc_T on entry and dh0, dc0 on exit.
    # Out: dz2 (B T, 4H), dx2 (B T, C), per chunk dw_ih_part (chunks, C, 4H), dw_hh_part
    # (chunks, H, 4H), db_part (chunks, 4H) float64
    bsz, hidden = h0.shape
    t_len = gates2.shape[0] // bsz
    one = gates2.dtype.type(1)
    step = -(-bsz // n_chunks)
    for k in prange(n_chunks):
        lo, hi = k * step, min(bsz, (k + 1) * step)
        r0, r1 = lo * t_len, hi * t_len
        acc = db_part[k]  # (1) db = sum dz, summed as dz is made
        for t in range(t_len - 1, -1, -1):
            for r in range(hi - lo):
                q = r0 + r * t_len + t
                c_prev = c0[lo + r] if t == 0 else c2[q - 1]
                gq, tq, dq, dzq = gates2[q], tc2[q], dout2[q], dz2[q]
                dh_r, dc_r = dh[lo + r], dc[lo + r]
                for j in range(hidden):
                    i, f = gq[j], gq[hidden + j]
                    g, o = gq[2 * hidden + j], gq[3 * hidden + j]
                    tanh_c = tq[j]
                    dh_j = dq[j] + dh_r[j]  # from above, and from step t+1's (1)
                    # (4) h = o tanh(c)  =>  do = dh tanh(c),  dc += dh o (1 - tanh^2(c))
                    dc_j = dc_r[j] + dh_j * o * (one - tanh_c * tanh_c)
                    # (3) c = f c_prev + i g, then (2): dz = d(gate) * gate'
                    dzq[j] = dc_j * g * i * (one - i)
                    dzq[hidden + j] = dc_j * c_prev[j] * f * (one - f)
                    dzq[2 * hidden + j] = dc_j * i * (one - g * g)
                    dzq[3 * hidden + j] = dh_j * tanh_c * o * (one - o)
                    dc_r[j] = dc_j * f  # (3) dc_{t-1} = dc f
                for j in range(4 * hidden):
                    acc[j] += dzq[j]
            # (1) dh_{t-1} = dz_t W_hh^T (dout[t-1] is added at the next step)
            gemm(dz2[r0 + t:r1:t_len], w_hh_t, dh[lo:hi], gemm_fn)
        # (1) over every step of the chunk: dx = dz W_ih^T, dW_ih = x^T dz, dW_hh = h_prev^T dz
        dz = dz2[r0:r1]
        gemm(dz, w_ih_t, dx2[r0:r1], gemm_fn)
        gemm(x2[r0:r1].T, dz, dw_ih_part[k], gemm_fn)
        h_prev = np.empty((r1 - r0, hidden), h2.dtype)  # rows h_0 .. h_{T-1} per sequence
        for r in range(hi - lo):
            first = r * t_len
            h_prev[first] = h0[lo + r]
            h_prev[first + 1:first + t_len] = h2[r0 + first:r0 + first + t_len - 1]
        gemm(h_prev.T, dz, dw_hh_part[k], gemm_fn)


def _check_dtype(x: np.ndarray) -> None:
    if x.dtype not in (np.float32, np.float64):
        raise ValueError(f"x must be float32 or float64 for the LSTM kernel, got {x.dtype}")


def _state(name: str, s: np.ndarray | None, shape: tuple[int, int], dtype) -> np.ndarray:
    """A C-contiguous copy of ``s`` (it is written into), or zeros for None."""
    if s is None:
        return np.zeros(shape, dtype)
    if not isinstance(s, np.ndarray) or s.shape != shape or s.dtype != dtype:
        raise ValueError(f"{name} must be a {np.dtype(dtype)} array of shape {shape}, got "
                         f"{getattr(s, 'dtype', type(s).__name__)} {np.shape(s)}")
    return np.array(s, dtype=dtype, order="C")


def lstm_forward(x: np.ndarray, h0: np.ndarray | None, c0: np.ndarray | None,
                 w_ih: np.ndarray, w_hh: np.ndarray, b: np.ndarray, *, keep: bool = True):
    """One LSTM layer over a batch of sequences; see ``functional.lstm.lstm_forward``.

    Non-contiguous arguments are copied to C order first; a bad one raises ``ValueError``
    naming it, before any compiled code runs. The cache owns its arrays, as the reference's:
    the kernel copies x while it reads it; the weights are kept as the C-contiguous
    transposes the backward multiplies with (made here instead of there), seen through ``.T``
    with the reference's shapes; h0 and c0 are copies. Without ``keep`` the cache is None.
    """
    bsz, t_len, c_in, hidden = check_lstm_inputs(x, h0, c0, w_ih, w_hh, b)
    _check_dtype(x)
    dtype = x.dtype
    x, w_ih, w_hh, b = (np.ascontiguousarray(a) for a in (x, w_ih, w_hh, b))
    h0 = _state("h0", h0, (bsz, hidden), dtype)
    c0 = _state("c0", c0, (bsz, hidden), dtype)
    x_own = np.empty_like(x)  # (B, T, C), filled by the kernel
    gates = np.empty((bsz, t_len, 4 * hidden), dtype)  # (B, T, 4H)
    h = np.empty((bsz, t_len, hidden), dtype)  # (B, T, H)
    c = np.empty((bsz, t_len, hidden), dtype)
    tanh_c = np.empty((bsz, t_len, hidden), dtype)
    with blas_on_calling_thread():
        _forward_kernel(x.reshape(-1, c_in), h0, c0, w_ih, w_hh, b, _chunks(bsz),
                        gemm_address(dtype), x_own.reshape(-1, c_in),
                        gates.reshape(-1, 4 * hidden), h.reshape(-1, hidden),
                        c.reshape(-1, hidden), tanh_c.reshape(-1, hidden))
    final = (h[:, -1].copy(), c[:, -1].copy())
    if not keep:
        return h, final, None
    w_ih_t, w_hh_t = (np.array(w.T, order="C") for w in (w_ih, w_hh))  # (4H, C), (4H, H)
    return h, final, LSTMCache(x_own, h0, c0, w_ih_t.T, w_hh_t.T, gates, c, tanh_c, h)


def lstm_backward(dout: np.ndarray, dh_T: np.ndarray | None, dc_T: np.ndarray | None,
                  cache: LSTMCache):
    """Backpropagation through time; see ``functional.lstm.lstm_backward``.

    Raises
    ------
    ValueError
        If ``cache`` is not an ``LSTMCache``, or ``dout``, ``dh_T`` or ``dc_T`` do not have
        the shape and dtype of the forward's output and final state.
    """
    x, h0, c0, w_ih, w_hh, gates, c, tanh_c, h = check_lstm_cache(cache)
    bsz, t_len, hidden = h.shape
    dtype = x.dtype
    dout = np.ascontiguousarray(check_shaped("dout", dout, h.shape, dtype))
    dh = _state("dh_T", dh_T, (bsz, hidden), dtype)  # becomes dh0
    dc = _state("dc_T", dc_T, (bsz, hidden), dtype)  # becomes dc0
    # the reference's cache may hold non-contiguous arrays; the kernel's own are contiguous
    x, h0, c0, gates, c, tanh_c, h = (np.ascontiguousarray(a)
                                      for a in (x, h0, c0, gates, c, tanh_c, h))
    chunks, c_in = _chunks(bsz), x.shape[-1]
    dz = np.empty((bsz * t_len, 4 * hidden), dtype)  # (B T, 4H)
    dx = np.empty((bsz, t_len, c_in), dtype)
    dw_ih_part = np.empty((chunks, c_in, 4 * hidden), dtype)
    dw_hh_part = np.empty((chunks, hidden, 4 * hidden), dtype)
    db_part = np.zeros((chunks, 4 * hidden))
    with blas_on_calling_thread():
        _backward_kernel(dout.reshape(-1, hidden), x.reshape(-1, c_in), h0, c0,
                         np.ascontiguousarray(w_ih.T), np.ascontiguousarray(w_hh.T),
                         gates.reshape(-1, 4 * hidden), h.reshape(-1, hidden),
                         c.reshape(-1, hidden), tanh_c.reshape(-1, hidden), chunks,
                         gemm_address(dtype), dh, dc, dz,
                         dx.reshape(-1, c_in), dw_ih_part, dw_hh_part, db_part)
    return (dx, dh, dc, dw_ih_part.sum(axis=0), dw_hh_part.sum(axis=0),
            db_part.sum(axis=0).astype(dtype))

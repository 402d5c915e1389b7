"""One LSTM layer over a whole sequence, and its backward: backpropagation through time.

The gates are laid out as in ``torch.nn.LSTM``, in the order input, forget, cell, output
(i, f, g, o): column block k of the (·, 4H) weights and of the bias belongs to gate k. Our
weights are stored as (C_in, 4H) and (H, 4H) so that the forward reads ``x @ w_ih`` as the
linear layers do (``functional/linear.py``); PyTorch's ``weight_ih_l0`` (4H, C_in) and
``weight_hh_l0`` (4H, H) are their transposes, gate blocks in the same order, so the weights
exchange by a transposition and nothing else (``numpy_transformer.interop``).

PyTorch adds two bias vectors, ``bias_ih`` and ``bias_hh``; the cell only ever sees their sum,
which is the ``b`` here. ``nn.LSTM`` (the module) keeps both, as PyTorch does, and gives each
the gradient ``db``.

References
----------
Hochreiter & Schmidhuber, "Long Short-Term Memory", 1997.
Gers, Schmidhuber & Cummins, "Learning to Forget: Continual Prediction with LSTM", 2000
(the forget gate).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import check_float, check_shaped

# The operations of the backends (numpy_transformer.backend)
__all__ = ['lstm_forward', 'lstm_backward']


class LSTMCache(NamedTuple):
    x: np.ndarray  # (B, T, C) the layer's input
    h0: np.ndarray  # (B, H) initial hidden state
    c0: np.ndarray  # (B, H) initial cell state
    w_ih: np.ndarray  # (C, 4H)
    w_hh: np.ndarray  # (H, 4H)
    gates: np.ndarray  # (B, T, 4H) i, f, g, o after their nonlinearities, equation (2)
    c: np.ndarray  # (B, T, H) cell states c_1 .. c_T
    tanh_c: np.ndarray  # (B, T, H) tanh(c_t), equation (4)
    h: np.ndarray  # (B, T, H) hidden states h_1 .. h_T: the forward's output itself


def check_lstm_inputs(x, h0, c0, w_ih, w_hh, b) -> tuple[int, int, int, int]:
    """Validate the forward's arguments; returns ``(B, T, C, H)``.

    ``h0`` and ``c0`` may be ``None`` (a zero state). Raises ``ValueError`` naming the first
    argument of the wrong kind, dtype or shape, or an empty one.
    """
    check_float("x", x, ndim=3)  # also refuses an empty x, or an empty state in w_hh:
    bsz, t_len, c_in = x.shape
    check_float("w_hh", w_hh, ndim=2)
    hidden = w_hh.shape[0]
    expected = {"w_ih": (c_in, 4 * hidden), "w_hh": (hidden, 4 * hidden), "b": (4 * hidden,),
                "h0": (bsz, hidden), "c0": (bsz, hidden)}
    for name, a in (("w_ih", w_ih), ("w_hh", w_hh), ("b", b), ("h0", h0), ("c0", c0)):
        if a is None and name in ("h0", "c0"):
            continue
        check_float(name, a)
        if a.shape != expected[name]:
            raise ValueError(f"{name} must have shape {expected[name]} (x is {x.shape}, "
                             f"w_hh is {w_hh.shape}), got {a.shape}")
        if a.dtype != x.dtype:
            raise ValueError(f"{name} has dtype {a.dtype}, x has {x.dtype}: they must agree")
    return bsz, t_len, c_in, hidden


def check_lstm_cache(cache: object) -> LSTMCache:
    """``cache`` if it is the :class:`LSTMCache` of a forward, else ``ValueError`` naming what
    it is (a tuple of the wrong length would fail to unpack three frames deep)."""
    if not isinstance(cache, LSTMCache):
        raise ValueError(f"cache must be the LSTMCache of lstm_forward, got "
                         f"{type(cache).__name__}")
    return cache


def _sigmoid(z: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-z)), written as (1 + tanh(z / 2)) / 2: the same function, no overflow."""
    half = z.dtype.type(0.5)
    return half + half * np.tanh(half * z)


def lstm_forward(x: np.ndarray, h0: np.ndarray | None, c0: np.ndarray | None, w_ih: np.ndarray,
                 w_hh: np.ndarray, b: np.ndarray, *, keep: bool = True):
    """Run one LSTM layer over every time step of a batch of sequences.

    Parameters
    ----------
    x : ndarray of shape (B, T, C)
    h0, c0 : ndarray of shape (B, H), or None
        The state before the first step; ``None`` is a zero state (as PyTorch's ``hx=None``).
    w_ih, w_hh : ndarray of shape (C, 4H) and (H, 4H)
        Input and recurrent weights, gate blocks i, f, g, o (PyTorch's ``weight_ih_l0`` and
        ``weight_hh_l0`` transposed).
    b : ndarray of shape (4H,)
        The bias, PyTorch's ``bias_ih_l0 + bias_hh_l0``.
    keep : bool, default True
        Return the cache a backward needs; False (inference): None, and no copies.

    Returns
    -------
    out : ndarray of shape (B, T, H)
        h_1 .. h_T, kept by the cache: do not write into them before the backward.
    (h_T, c_T) : tuple of (B, H) copies, the state to carry into the next forward
    cache : LSTMCache or None
        It keeps copies of x, h0, c0, w_ih, w_hh: the caller may then write into its arrays.

    Raises
    ------
    ValueError
        For a non-float or empty input, or shapes or dtypes that do not fit together.

    Notes
    -----
    For t = 1 .. T, with h_0 = h0 and c_0 = c0 and σ the logistic sigmoid:

    (1) z_t = x_t W_ih + h_{t-1} W_hh + b   (B, 4H), split into z_i, z_f, z_g, z_o
    (2) i_t = σ(z_i),  f_t = σ(z_f),  g_t = tanh(z_g),  o_t = σ(z_o)
    (3) c_t = f_t ⊙ c_{t-1} + i_t ⊙ g_t   (4) h_t = o_t ⊙ tanh(c_t)

    The input part of (1), x_t W_ih + b, is one product for all T steps at once: only
    h_{t-1} W_hh waits for the previous step.
    """
    bsz, t_len, _, hidden = check_lstm_inputs(x, h0, c0, w_ih, w_hh, b)
    own = (lambda a: a.copy()) if keep else (lambda a: a)  # the cache's own: see Returns
    h0, c0 = (np.zeros((bsz, hidden), x.dtype) if s is None else own(s) for s in (h0, c0))
    x, w_ih, w_hh = own(x), own(w_ih), own(w_hh)
    z_in = x @ w_ih + b  # (1) the input part for every step at once: (B, T, 4H)
    gates, c, tanh_c, h = (np.empty((bsz, t_len, n), x.dtype)  # (B, T, 4H), then (B, T, H)
                           for n in (4 * hidden, hidden, hidden, hidden))
    h_prev, c_prev = h0, c0
    for t in range(t_len):
        z = z_in[:, t] + h_prev @ w_hh  # (1) (B, 4H)
        i, f, o = (_sigmoid(z[:, k * hidden:(k + 1) * hidden]) for k in (0, 1, 3))  # (2)
        g = np.tanh(z[:, 2 * hidden:3 * hidden])
        c[:, t] = f * c_prev + i * g  # (3)
        tanh_c[:, t] = np.tanh(c[:, t])
        h[:, t] = o * tanh_c[:, t]  # (4)
        gates[:, t] = np.concatenate([i, f, g, o], axis=1)
        h_prev, c_prev = h[:, t], c[:, t]
    cache = LSTMCache(x, h0, c0, w_ih, w_hh, gates, c, tanh_c, h) if keep else None
    return h, (h[:, -1].copy(), c[:, -1].copy()), cache


def lstm_backward(dout: np.ndarray, dh_T: np.ndarray | None, dc_T: np.ndarray | None,
                  cache: LSTMCache):
    """Backpropagation through time: the gradients of every input of :func:`lstm_forward`.

    Parameters
    ----------
    dout : ndarray of shape (B, T, H)
        dLoss/d out, the gradient reaching every hidden state from above.
    dh_T, dc_T : ndarray of shape (B, H), or None
        dLoss/d h_T and dLoss/d c_T through the final state (``None``: it was not used).
    cache : LSTMCache

    Returns
    -------
    dx : ndarray of shape (B, T, C)
    dh0, dc0 : ndarray of shape (B, H)
    dw_ih : ndarray of shape (C, 4H)
    dw_hh : ndarray of shape (H, 4H)
    db : ndarray of shape (4H,)
        Also the gradient of each of PyTorch's two biases.
    """
    x, h0, c0, w_ih, w_hh, gates, c, tanh_c, h = check_lstm_cache(cache)
    bsz, t_len, hidden = h.shape
    check_shaped("dout", dout, h.shape)
    for name, d in (("dh_T", dh_T), ("dc_T", dc_T)):
        if d is not None:
            check_shaped(name, d, (bsz, hidden))
    dz = np.empty_like(gates)  # (B, T, 4H) dLoss/d z_t, filled from the last step back
    dh_next = np.zeros((bsz, hidden), x.dtype) if dh_T is None else dh_T  # reaches h_t from t+1
    dc = np.zeros((bsz, hidden), x.dtype) if dc_T is None else dc_T  # reaches c_t from t+1
    one = x.dtype.type(1)
    for t in reversed(range(t_len)):
        i, f, g, o = (gates[:, t, k * hidden:(k + 1) * hidden] for k in range(4))  # (B, H)
        c_prev = c0 if t == 0 else c[:, t - 1]
        tc = tanh_c[:, t]
        dh = dout[:, t] + dh_next  # h_t feeds the output and step t+1's (1)
        # (4) h_t = o ⊙ tanh(c_t)   =>   do = dh ⊙ tanh(c_t),  dc_t += dh ⊙ o ⊙ (1 - tanh²(c_t))
        do = dh * tc
        dc = dc + dh * o * (one - tc * tc)
        # (3) c_t = f ⊙ c_{t-1} + i ⊙ g   =>   di = dc ⊙ g,  df = dc ⊙ c_{t-1},  dg = dc ⊙ i
        # (2) σ' = σ (1 - σ),  tanh' = 1 - tanh²   =>   dz_i = di ⊙ i (1 - i), ...
        dz[:, t, :hidden] = dc * g * i * (one - i)
        dz[:, t, hidden:2 * hidden] = dc * c_prev * f * (one - f)
        dz[:, t, 2 * hidden:3 * hidden] = dc * i * (one - g * g)
        dz[:, t, 3 * hidden:] = do * o * (one - o)
        # (3) c_t = f ⊙ c_{t-1} + ...   =>   dc_{t-1} = dc ⊙ f
        dc = dc * f
        # (1) z_t = ... + h_{t-1} W_hh   =>   dh_{t-1} = dz_t W_hh^T  (added to dout[t-1] above)
        dh_next = dz[:, t] @ w_hh.T
    # (1) z_t = x_t W_ih + h_{t-1} W_hh + b, summed over every step and sequence:
    #   dW_ih = sum_t x_t^T dz_t,  dW_hh = sum_t h_{t-1}^T dz_t,  db = sum dz,  dx_t = dz_t W_ih^T
    h_prev = np.concatenate([h0[:, None], h[:, :-1]], axis=1)  # (B, T, H): h_0 .. h_{T-1}
    dz2 = dz.reshape(-1, 4 * hidden)  # (B T, 4H)
    dw_ih = x.reshape(-1, x.shape[-1]).T @ dz2
    dw_hh = h_prev.reshape(-1, hidden).T @ dz2
    db = dz2.sum(axis=0)
    dx = dz @ w_ih.T
    return dx, dh_next, dc, dw_ih, dw_hh, db

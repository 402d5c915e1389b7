"""Absolute position modules that add one vector per position to the token stream.

RoPE and ALiBi act inside attention instead (``MultiHeadAttention(rope=True)`` /
``alibi=True``), because they change how queries and keys are compared, not the tokens.
"""

from __future__ import annotations

import numpy as np

from .._checks import check_float, check_positive
from ..functional.positional import sinusoidal_table
from .module import Module, drawn


def _check_rows(length: int, start: int, max_len: int) -> None:
    """The positions start .. start + length - 1 must be rows of the table."""
    if start == 0 and length > max_len:
        raise ValueError(f"sequence length {length} exceeds the position table's "
                         f"max_len {max_len}")
    if start < 0 or start + length > max_len:
        raise ValueError(f"positions {start} .. {start + length - 1} lie outside the "
                         f"position table's [0, {max_len})")


def _check_input(x: np.ndarray, start: int, max_len: int, width: int) -> None:
    check_float("x", x, ndim=3)
    _check_rows(x.shape[1], start, max_len)
    if x.shape[2] != width:
        raise ValueError(f"x has width {x.shape[2]} (shape {x.shape}), expected {width}")


class SinusoidalPositions(Module):
    """``out = x + PE[:T]`` with the fixed sinusoidal table of Vaswani et al.

    The table (max_len, C) is a buffer: it follows from a formula, so it is neither trained
    nor saved (the chapter's non-persistent ``position_table``).

    Parameters
    ----------
    max_len : int
        Rows of the table; longer inputs raise ``ValueError`` (the formula extends, but the
        model was never trained on the new rows).
    width : int
        C; must be even.
    dtype : dtype, default float64

    References
    ----------
    Vaswani et al., "Attention Is All You Need", 2017.
    """

    def __init__(self, max_len: int, width: int, *, dtype=np.float64) -> None:
        super().__init__()
        check_positive("max_len", max_len, integer=True)
        self.max_len, self.width = max_len, width
        self.buffers["table"] = sinusoidal_table(max_len, width, dtype=dtype)

    def forward(self, x: np.ndarray, start: int = 0) -> np.ndarray:
        """x : (B, T, C) at positions start .. start + T - 1 -> x + PE[start:start + T]."""
        _check_input(x, start, self.max_len, self.width)
        return self.expect_grad_like(x + self.addend(x.shape[1], start))

    def addend(self, length: int, start: int = 0) -> np.ndarray:
        """PE[start:start + length], (length, C): what :meth:`forward` adds; the backward
        then takes the gradient of a sum with these rows, (B, length, C)."""
        _check_rows(length, start, self.max_len)
        self.grad_like = (("B", length, self.width), self.buffers["table"].dtype)
        return self.buffers["table"][start:start + length]

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """The table is a constant: ``dx = dout``."""
        self.check_grad("dout", dout)
        return dout


class LearnedPositions(Module):
    """``out = x + table[:T]`` with a trained table (max_len, C), as BERT and GPT-2.

    Parameters
    ----------
    max_len, width : int
    std : float, default 0.02
        Initial values N(0, std^2) (GPT-2's choice).
    dtype : dtype, default float64
    rng : np.random.Generator, optional
    """

    def __init__(self, max_len: int, width: int, std: float = 0.02, *, dtype=np.float64,
                 rng: np.random.Generator | None = None) -> None:
        super().__init__()
        check_positive("max_len", max_len, integer=True)
        check_positive("width", width, integer=True)
        self.max_len, self.width = max_len, width
        rng = np.random.default_rng() if rng is None else rng
        self.add_param("table", drawn((max_len, width), dtype,
                                      lambda s: std * rng.standard_normal(s)))
        self.cache = None  # (start, T): the rows the last forward added

    def forward(self, x: np.ndarray, start: int = 0) -> np.ndarray:
        """x : (B, T, C) at positions start .. start + T - 1 -> x + table[start:start + T]."""
        _check_input(x, start, self.max_len, self.width)
        return self.expect_grad_like(x + self.addend(x.shape[1], start))

    def addend(self, length: int, start: int = 0) -> np.ndarray:
        """table[start:start + length], (length, C): what :meth:`forward` adds.

        Like :meth:`forward` it keeps the rows for :meth:`backward` (a caller that adds the
        rows itself, as the embeddings do, then calls ``backward`` as after forward).
        """
        _check_rows(length, start, self.max_len)
        self.cache = (start, length)
        self.grad_like = (("B", length, self.width), self.params["table"].dtype)
        return self.params["table"][start:start + length]

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """``dtable[rows] += sum_B dout`` (every sequence used the same rows); ``dx = dout``."""
        self.check_grad("dout", dout)
        start, length = self.cache
        self.add_grad("table", dout.sum(axis=0), np.s_[start:start + length])
        return dout

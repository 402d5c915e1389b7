"""Positional information: sinusoidal and RoPE tables, the rotation itself, and ALiBi's bias.

References
----------
Vaswani et al., "Attention Is All You Need", 2017 (sinusoidal positions).
Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", 2021 (RoPE).
Press, Smith & Lewis, "Train Short, Test Long: Attention with Linear Biases", 2022 (ALiBi).
"""

from __future__ import annotations

import math

import numpy as np

from .._checks import check_even, check_float

# The operations of the backends (numpy_transformer.backend)
__all__ = [
    'sinusoidal_table', 'rope_tables', 'rope_forward', 'rope_backward', 'alibi_slopes',
    'alibi_bias'
]


def _frequencies(width: int, base: float, what: str, name: str = "width") -> np.ndarray:
    """theta_i = base^(-2i/width) for i = 0 .. width/2 - 1; the width must be even."""
    check_even(what, name, width)
    return base ** (-np.arange(0, width, 2, dtype=np.float64) / width)  # (width/2,)


def sinusoidal_table(length: int, width: int, dtype=np.float64) -> np.ndarray:
    """The fixed table PE[p, 2i] = sin(p theta_i), PE[p, 2i+1] = cos(p theta_i).

    Parameters
    ----------
    length, width : int
        Positions and features; ``width`` must be even.

    Returns
    -------
    table : ndarray of shape (length, width)
        Every row has norm sqrt(width / 2).
    """
    angles = np.arange(length, dtype=np.float64)[:, None] * _frequencies(width, 1e4, "sinusoidal")
    table = np.empty((length, width))
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles)
    return table.astype(dtype)


def rope_tables(length: int, head_width: int, base: float = 10000.0, dtype=np.float64):
    """``(cos, sin)`` of the RoPE angles p * theta_i, each of shape (length, head_width / 2)."""
    theta = _frequencies(head_width, base, "RoPE", "head width")  # (D/2,)
    angles = np.arange(length, dtype=np.float64)[:, None] * theta
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def check_rotation(name: str, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> None:
    """Raise ``ValueError`` unless cos and sin are (T, D/2) and x is (..., T, D)."""
    check_float(name, x, ndim=(2, 3, 4))
    if np.ndim(cos) != 2 or np.shape(cos) != np.shape(sin):
        raise ValueError(f"cos and sin must be (T, D/2) tables of one shape, got "
                         f"{np.shape(cos)} and {np.shape(sin)}")
    rows = (np.shape(cos)[0], 2 * np.shape(cos)[1])
    if x.shape[-2:] != rows:
        raise ValueError(f"{name} must end in (T, D) = {rows} like the RoPE tables cos and sin "
                         f"(T, D/2), got shape {x.shape}")


def rope_forward(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate each feature pair (2i, 2i+1) of the token at position p by the angle p theta_i.

    Parameters
    ----------
    x : ndarray of shape (B, H, T, D)
    cos, sin : ndarray of shape (T, D/2)
        The rows of :func:`rope_tables` for the positions of ``x``.

    Returns
    -------
    out : ndarray of shape (B, H, T, D)

    Notes
    -----
    (1) out_2i = x_2i cos - x_2i+1 sin,  out_2i+1 = x_2i sin + x_2i+1 cos
    Since rotations compose, (R_p q) . (R_s k) = q . R_(s-p) k: the score sees only s - p.
    """
    check_rotation("x", x, cos, sin)
    even, odd = x[..., 0::2], x[..., 1::2]  # (B, H, T, D/2)
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin  # (1)
    out[..., 1::2] = even * sin + odd * cos
    return out


def rope_backward(dout: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """The rotation is orthogonal, so its backward is the inverse rotation: angle -p theta_i."""
    check_rotation("dout", dout, cos, sin)
    return rope_forward(dout, cos, -sin)  # (1) dx = R^T dout = R(-angle) dout


def alibi_slopes(heads: int) -> np.ndarray:
    """Head-specific slopes m_h: the geometric sequence 2^(-8/n), 2^(-16/n), ... of Press et al.

    For a head count that is not a power of two, the slopes of the next lower power of two are
    followed by every other slope of twice that power, as in the paper's reference code.
    """
    if heads < 1:
        raise ValueError(f"heads must be >= 1, got {heads}")

    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    low = 2 ** int(math.floor(math.log2(heads)))
    slopes = power_of_two(low) + power_of_two(2 * low)[0::2][: heads - low]
    return np.array(slopes)


def alibi_bias(heads: int, t_q: int, t_k: int, dtype=np.float64) -> np.ndarray:
    """ALiBi score bias ``-m_h |i' - j|``, where query i sits at position i' = i + t_k - t_q.

    Returns
    -------
    bias : ndarray of shape (1, H, T_q, T_k)
        Added to the scaled scores; combine with a causal mask for a decoder.
    """
    qpos = np.arange(t_q)[:, None] + (t_k - t_q)
    dist = np.abs(qpos - np.arange(t_k)[None, :])  # (T_q, T_k)
    return (-alibi_slopes(heads)[:, None, None] * dist)[None].astype(dtype)

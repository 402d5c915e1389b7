"""Elementwise activations and dropout, each forward beside its own derivative.

GELU comes in two distinct functions: the exact one, x Phi(x) with the normal CDF through
erf, and the tanh approximation. Each backward differentiates *its own* forward (mixing the
two is a classic silent bug that a finite-difference check catches).

References
----------
Hendrycks & Gimpel, "Gaussian Error Linear Units (GELUs)", 2016.
Shazeer, "GLU Variants Improve Transformer", 2020 (SwiGLU).
Srivastava et al., "Dropout", 2014.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._checks import check_shaped

# The operations of the backends (numpy_transformer.backend)
__all__ = [
    'relu_forward', 'relu_backward', 'gelu_forward', 'gelu_backward', 'gelu_tanh_forward',
    'gelu_tanh_backward', 'silu_forward', 'silu_backward', 'swiglu_forward', 'swiglu_backward',
    'dropout_forward', 'dropout_backward', 'dropout_mask', 'erf'
]

# NumPy has no erf: Python's math.erf (the C library's) entry by entry, in float64, rounded
# once to the input's dtype. Slow and obviously right; the compiled backend's GELU is checked
# against it.
_erf_float64 = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    """Elementwise error function ``erf(x) = 2/sqrt(pi) int_0^x exp(-t^2) dt``, in x's dtype."""
    return _erf_float64(x.astype(np.float64, copy=False)).astype(x.dtype)


# ----------------------------------------------------------------------------- ReLU
def relu_forward(x: np.ndarray, *, keep: bool = True):
    """``out = max(x, 0)``. Returns ``(out, cache)``; the cache is ``out`` itself, which is
    positive exactly where x is (do not write into it before the backward); None without
    ``keep`` (inference: no backward follows).

    Notes
    -----
    (1) out = max(x, 0)
    """
    out = np.maximum(x, 0)
    return out, out if keep else None


def relu_backward(dout: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``dx = dout * [x > 0] = dout * [out > 0]`` (the subgradient 0 is used at x = 0, as
    PyTorch does)."""
    check_shaped("dout", dout, out.shape)
    return dout * (out > 0)  # (1) out = max(x, 0)  =>  dx = dout [x > 0]


# ----------------------------------------------------------------------------- GELU (erf)
def gelu_forward(x: np.ndarray, *, keep: bool = True):
    """Exact GELU, ``out = x * Phi(x)`` with ``Phi(x) = (1 + erf(x / sqrt 2)) / 2``.

    Returns ``(out, cache)``; the cache is a copy of x (the caller may write into its own),
    None without ``keep`` (inference: no backward follows).

    Notes
    -----
    (1) out = x Phi(x),  Phi(x) = (1 + erf(x / sqrt(2))) / 2
    """
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0))), x.copy() if keep else None


def gelu_backward(dout: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``d/dx [x Phi(x)] = Phi(x) + x phi(x)``, phi the standard normal density."""
    check_shaped("dout", dout, x.shape)
    # (1) out = x Phi(x)   =>   dx = dout (Phi(x) + x phi(x))
    cdf = 0.5 * (1.0 + erf(x / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    return dout * (cdf + x * pdf)


# ----------------------------------------------------------------------------- GELU (tanh)
_K = math.sqrt(2.0 / math.pi)  # the constants of the tanh approximation
_A = 0.044715


def gelu_tanh_forward(x: np.ndarray, *, keep: bool = True):
    """Tanh-approximated GELU, ``out = x/2 (1 + th)`` with ``th = tanh(u)``,
    ``u = K (x + A x^3)``.

    Returns ``(out, cache)``; the cache is a copy of x, as the exact GELU's (the backward
    computes ``th`` again: one more tanh instead of a second array kept for every layer),
    None without ``keep``.

    Notes
    -----
    (1) u = K (x + A x^3),  K = sqrt(2 / pi),  A = 0.044715   (2) out = x/2 (1 + tanh(u))
    """
    return 0.5 * x * (1.0 + np.tanh(_K * (x + _A * x**3))), x.copy() if keep else None


def gelu_tanh_backward(dout: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``d out/dx = (1 + th)/2 + x/2 (1 - th^2) K (1 + 3 A x^2)``."""
    check_shaped("dout", dout, x.shape)
    # (2), (1) out = x/2 (1 + th), th = tanh(u)   =>   dx = dout d out/dx (the formula above)
    th = np.tanh(_K * (x + _A * x**3))  # the forward's tanh(u)
    return dout * (0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * _K * (1.0 + 3.0 * _A * x * x))


# ----------------------------------------------------------------------------- SiLU / SwiGLU
def silu_forward(x: np.ndarray, *, keep: bool = True):
    """``out = x * sigmoid(x)``. Returns ``(out, cache)`` with cache ``(x, sigmoid(x))``, x
    copied (None without ``keep``).

    Notes
    -----
    (1) s = sigmoid(x)   (2) out = x s
    """
    sig = 1.0 / (1.0 + np.exp(-x))
    return x * sig, (x.copy(), sig) if keep else None


def silu_backward(dout: np.ndarray, cache) -> np.ndarray:
    """``d/dx [x s(x)] = s (1 + x (1 - s))``."""
    x, sig = cache
    check_shaped("dout", dout, x.shape)
    return dout * sig * (1.0 + x * (1.0 - sig))  # (2), (1) with s' = s (1 - s)


class SwiGLUCache(NamedTuple):
    up: np.ndarray  # (..., F) a copy of the input up
    silu_gate: np.ndarray  # (..., F) silu(gate)
    silu_cache: tuple


def swiglu_forward(gate: np.ndarray, up: np.ndarray, *, keep: bool = True):
    """Gated unit ``out = silu(gate) * up`` (the gate of SwiGLU's feed-forward); the cache is
    None without ``keep``.

    Notes
    -----
    (1) a = silu(gate)   (2) out = a * up
    """
    check_shaped("up", up, np.shape(gate), what="gate")
    a, silu_cache = silu_forward(gate, keep=keep)  # (1)
    return a * up, SwiGLUCache(up.copy(), a, silu_cache) if keep else None  # (2)


def swiglu_backward(dout: np.ndarray, cache: SwiGLUCache):
    """Returns ``(dgate, dup)``."""
    up, a, silu_cache = cache
    check_shaped("dout", dout, up.shape)
    dup = dout * a  # (2) out = a * up  =>  dup = dout a,  da = dout up
    dgate = silu_backward(dout * up, silu_cache)  # (1) a = silu(gate)
    return dgate, dup


# ----------------------------------------------------------------------------- dropout
def dropout_forward(x: np.ndarray, p: float, rng: np.random.Generator, training: bool = True,
                    *, keep: bool = True):
    """Inverted dropout: zero each entry with probability ``p``, scale survivors by 1/(1-p).

    Returns ``(out, cache)``; the cache is the scaled keep-mask (``None`` when the call is an
    identity: evaluation mode or ``p == 0``; and without ``keep``), so backward reuses
    exactly the forward's mask.

    Notes
    -----
    (1) m = 0 with probability p, else 1 / (1 - p)   (2) out = x * m
    """
    _check_probability(p)
    if not training or p == 0.0:
        return x, None
    m = dropout_mask(x.shape, p, rng, x.dtype)  # (1) m
    return x * m, m if keep else None  # (2) out = x * m


def _check_probability(p: float) -> None:
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must lie in [0, 1), got {p!r}")


def dropout_mask(shape: tuple, p: float, rng: np.random.Generator, dtype) -> np.ndarray:
    """(1) The multipliers of inverted dropout: m = 0 with probability ``p``, else 1 / (1 - p).

    One uniform draw per entry, in C order: ``dropout_forward`` and the attention's dropout
    (``nn.MultiHeadAttention``) make their masks alike.

    Raises
    ------
    ValueError
        If ``p`` is not a probability in [0, 1).
    """
    _check_probability(p)
    dtype = np.dtype(dtype)
    return (rng.random(shape) >= p).astype(dtype) / dtype.type(1.0 - p)


def dropout_backward(dout: np.ndarray, keep: np.ndarray | None) -> np.ndarray:
    """``dx = dout * m`` with the forward's mask ``m`` (identity when the forward was)."""
    if keep is None:  # the forward was the identity, and kept nothing to check dout against
        return dout
    check_shaped("dout", dout, keep.shape)
    return dout * keep  # (2) out = x * m  =>  dx = dout * m

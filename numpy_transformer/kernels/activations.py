"""ReLU, exact GELU and tanh GELU in Numba: drop-ins for ``functional/activations.py``'s pairs.

Same contract as the readable reference (checked against it in ``tests/test_kernels_step.py``):
``out, cache = relu_forward(x)``, ``dx = relu_backward(dout, cache)``, and the same for
``gelu_forward`` / ``gelu_backward`` and ``gelu_tanh_forward`` / ``gelu_tanh_backward``; the
cache is, as in the reference, ReLU's output (positive exactly where x is) and a copy of either
GELU's input, written in the forward's own pass.

The reference GELU makes six whole-array passes forward (divide, erf, add, multiply, ...) and
about ten backward (erf and exp again); ReLU's backward builds a boolean mask and multiplies.
Each kernel here is one parallel pass over the flattened array. GELU in float64 uses
``math.erf`` (as exact as the reference); in float32 a vectorisable rational approximation of
erf, within a few float32 units in the last place (see the note above ``_erf_f32``). The tanh
GELU (GPT-2's) calls ``math.tanh`` in float64 and, in float32, tanh through the vectorised exp
(the note above ``_tanh_f32``).

References
----------
Hendrycks & Gimpel, "Gaussian Error Linear Units (GELUs)", 2016.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .._checks import check_shaped
from ..threads import alone_below
from ._jit import helper, jit_options
from ._validate import check_kernel_float
from .special import exp_clamped, exp_shifted

# The operations this module gives the numba backend (numpy_transformer.backend)
__all__ = ['relu_forward', 'relu_backward', 'gelu_forward', 'gelu_backward',
           'gelu_tanh_forward', 'gelu_tanh_backward']

# error_model="numpy": x / 0 gives inf or NaN as in NumPy instead of raising ZeroDivisionError;
# the check for that error kept the compiler from vectorising any loop with a division (5x).
_JIT = jit_options(error_model="numpy")
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _flat(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1)


def _rows(x: np.ndarray) -> int:
    """The rows of x (..., F), for ``threads.alone_below``."""
    return x.size // x.shape[-1] if x.ndim and x.shape[-1] else x.size


def _out_and_copy(x: np.ndarray, kernel_f32, kernel_f64, keep: bool):
    """``(out, copy of x)``, both written by the forward kernel of x's dtype in one pass;
    ``(out, None)`` without ``keep`` (the copy a scratch array then)."""
    check_kernel_float("x", x)
    out, x_own = np.empty(x.shape, dtype=x.dtype), np.empty(x.shape, dtype=x.dtype)
    kernel = kernel_f32 if x.dtype == np.float32 else kernel_f64
    with alone_below(_rows(x)):
        kernel(_flat(x), out.reshape(-1), x_own.reshape(-1))
    return out, x_own if keep else None


def _dx_of_x(dout: np.ndarray, x: np.ndarray, kernel_f32, kernel_f64) -> np.ndarray:
    """``dx`` from the backward kernel of x's dtype; dout must have x's shape and dtype."""
    check_kernel_float("x", x)
    check_shaped("dout", dout, x.shape, x.dtype)
    dx = np.empty(x.shape, dtype=x.dtype)
    kernel = kernel_f32 if x.dtype == np.float32 else kernel_f64
    with alone_below(_rows(x)):
        kernel(_flat(dout), _flat(x), dx.reshape(-1))
    return dx


# ----------------------------------------------------------------------------- ReLU
@njit(parallel=True, **_JIT)
def _relu_forward_kernel(x, out):  # pragma: no cover - compiled
    for i in prange(x.size):
        out[i] = 0 if x[i] <= 0 else x[i]  # out = max(x, 0); NaN stays NaN, as np.maximum


@njit(parallel=True, **_JIT)
def _relu_backward_kernel(dout, out, dx):  # pragma: no cover - compiled
    for i in prange(out.size):
        # dx = dout [x > 0] = dout [out > 0] (0 * NaN stays NaN)
        dx[i] = dout[i] if out[i] > 0 else 0.0 * dout[i]


def relu_forward(x: np.ndarray, *, keep: bool = True):
    """``out = max(x, 0)``; returns ``(out, out)`` (``(out, None)`` without ``keep``) as
    ``functional.activations.relu_forward``."""
    check_kernel_float("x", x)
    out = np.empty(x.shape, dtype=x.dtype)
    with alone_below(_rows(x)):
        _relu_forward_kernel(_flat(x), out.reshape(-1))
    return out, out if keep else None


def relu_backward(dout: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``dx = dout * [out > 0]``, ``out`` the forward's; dout must have its shape and dtype."""
    check_kernel_float("out", out)
    check_shaped("dout", dout, out.shape, out.dtype)
    dx = np.empty(out.shape, dtype=out.dtype)
    with alone_below(_rows(out)):
        _relu_backward_kernel(_flat(dout), _flat(out), dx.reshape(-1))
    return dx


# ----------------------------------------------------------------------------- GELU (erf)
# float64 (gradient checks) calls math.erf and math.exp, as exact as the reference. float32
# (training) would pay about 30 ns per entry for them here (libm, one entry at a time), more
# than all the rest of the step's elementwise work, so it uses a rational approximation of
# erf that the compiler vectorises (Eigen's ``generic_fast_erf_float``: odd degree-13 over even
# degree-8 polynomial on [-4, 4], where it is accurate to a few float32 units in the last
# place; outside, erf = +-1 in float32) and the attention kernel's vectorised exp.
_BLOCK = 512  # entries per work item (and per scratch row of the vectorised exp)


@helper(_JIT)
def _erf_f32(x):  # pragma: no cover - compiled
    # x: float32 scalar -> erf(x) in float32 arithmetic
    four = np.float32(4.0)
    x = four if x > four else (-four if x < -four else x)  # selects, not min/max: vectorises
    x2 = x * x
    p = x2 * np.float32(-2.72614225801306e-10) + np.float32(2.77068142495902e-08)
    p = x2 * p + np.float32(-2.10102402082508e-06)
    p = x2 * p + np.float32(-5.69250639462346e-05)
    p = x2 * p + np.float32(-7.34990630326855e-04)
    p = x2 * p + np.float32(-2.95459980854025e-03)
    p = x2 * p + np.float32(-1.60960333262415e-02)
    q = x2 * np.float32(-1.45660718464996e-05) + np.float32(-2.13374055278905e-04)
    q = x2 * q + np.float32(-1.68282697438203e-03)
    q = x2 * q + np.float32(-7.37332916720468e-03)
    q = x2 * q + np.float32(-1.42647390514189e-02)
    return x * p / q


def erf_f32(x: np.ndarray) -> np.ndarray:
    """The float32 approximation of erf used by the GELU kernels, for an array (tests)."""
    check_kernel_float("x", x)
    out = np.empty(x.shape, dtype=np.float32)
    _erf_f32_array(_flat(x.astype(np.float32)), out.reshape(-1))
    return out


@njit(**_JIT)
def _erf_f32_array(x, out):  # pragma: no cover - compiled
    for i in range(x.size):
        out[i] = _erf_f32(x[i])


@njit(parallel=True, **_JIT)
def _gelu_forward_f64(x, out, x_own):  # pragma: no cover - compiled
    for i in prange(x.size):
        out[i] = 0.5 * x[i] * (1.0 + math.erf(x[i] * _INV_SQRT2))  # x Phi(x)
        x_own[i] = x[i]  # the cache's copy


@njit(parallel=True, **_JIT)
def _gelu_backward_f64(dout, x, dx):  # pragma: no cover - compiled
    for i in prange(x.size):
        cdf = 0.5 * (1.0 + math.erf(x[i] * _INV_SQRT2))  # Phi(x)
        pdf = math.exp(-0.5 * x[i] * x[i]) * _INV_SQRT_2PI  # phi(x)
        dx[i] = dout[i] * (cdf + x[i] * pdf)  # d/dx [x Phi(x)] = Phi + x phi


@njit(parallel=True, **_JIT)
def _gelu_forward_f32(x, out, x_own):  # pragma: no cover - compiled
    half, one, c = np.float32(0.5), np.float32(1.0), np.float32(_INV_SQRT2)
    for i in prange(x.size):
        out[i] = half * x[i] * (one + _erf_f32(x[i] * c))  # x Phi(x)
        x_own[i] = x[i]  # the cache's copy


@njit(parallel=True, **_JIT)
def _gelu_backward_f32(dout, x, dx):  # pragma: no cover - compiled
    half, one = np.float32(0.5), np.float32(1.0)
    c, c_pdf = np.float32(_INV_SQRT2), np.float32(_INV_SQRT_2PI)
    n = x.size
    for blk in prange((n + _BLOCK - 1) // _BLOCK):
        lo, hi = blk * _BLOCK, min(n, (blk + 1) * _BLOCK)
        e = np.empty(hi - lo, np.float32)
        for j in range(lo, hi):
            e[j - lo] = -half * x[j] * x[j]
        exp_shifted(e, hi - lo, 0.0)  # e = exp(-x^2 / 2)
        for j in range(lo, hi):
            cdf = half * (one + _erf_f32(x[j] * c))  # Phi(x)
            dx[j] = dout[j] * (cdf + x[j] * e[j - lo] * c_pdf)  # Phi + x phi


def gelu_forward(x: np.ndarray, *, keep: bool = True):
    """Exact GELU ``x Phi(x)``; returns ``(out, copy of x)`` as
    ``functional.activations.gelu_forward``."""
    return _out_and_copy(x, _gelu_forward_f32, _gelu_forward_f64, keep)


def gelu_backward(dout: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``dx = dout (Phi(x) + x phi(x))``; dout must have x's shape and dtype."""
    return _dx_of_x(dout, x, _gelu_backward_f32, _gelu_backward_f64)


# ----------------------------------------------------------------------------- GELU (tanh)
# out = x/2 (1 + th), th = tanh(u), u = K (x + A x^3); the backward computes th again from the
# cached x, as the reference does. float32: libm's tanhf, one entry at a time, would not
# vectorise; tanh(u) = sign(u) (1 - e) / (1 + e) with e = exp(-2 |u|) in (0, 1] takes the
# vectorised exp. Near u = 0 the subtraction 1 - e loses relative accuracy, not absolute
# (th is off by a few float32 units of 1): what enters out and dx is 1 + th and 1 - th^2.
_K = math.sqrt(2.0 / math.pi)  # the reference's constants
_A = 0.044715


@helper(_JIT)
def _tanh_f32(u):  # pragma: no cover - compiled
    # u: float32 scalar -> tanh(u) in float32 arithmetic; NaN stays NaN
    one = np.float32(1.0)
    e = exp_clamped(np.float32(-2.0) * abs(u))
    t = (one - e) / (one + e)
    return -t if u < 0 else t


@njit(parallel=True, **_JIT)
def _gelu_tanh_forward_f64(x, out, x_own):  # pragma: no cover - compiled
    for i in prange(x.size):
        th = math.tanh(_K * (x[i] + _A * x[i] ** 3))  # tanh(u)
        out[i] = 0.5 * x[i] * (1.0 + th)  # x/2 (1 + th)
        x_own[i] = x[i]  # the cache's copy


@njit(parallel=True, **_JIT)
def _gelu_tanh_backward_f64(dout, x, dx):  # pragma: no cover - compiled
    for i in prange(x.size):
        th = math.tanh(_K * (x[i] + _A * x[i] ** 3))  # the forward's tanh(u)
        # d out/dx = (1 + th)/2 + x/2 (1 - th^2) K (1 + 3 A x^2)
        dx[i] = dout[i] * (0.5 * (1.0 + th) + 0.5 * x[i] * (1.0 - th * th) * _K
                           * (1.0 + 3.0 * _A * x[i] * x[i]))


@njit(parallel=True, **_JIT)
def _gelu_tanh_forward_f32(x, out, x_own):  # pragma: no cover - compiled
    half, one, k, a = np.float32(0.5), np.float32(1.0), np.float32(_K), np.float32(_A)
    for i in prange(x.size):
        th = _tanh_f32(k * (x[i] + a * x[i] * x[i] * x[i]))  # tanh(u)
        out[i] = half * x[i] * (one + th)  # x/2 (1 + th)
        x_own[i] = x[i]  # the cache's copy


@njit(parallel=True, **_JIT)
def _gelu_tanh_backward_f32(dout, x, dx):  # pragma: no cover - compiled
    half, one, k, a = np.float32(0.5), np.float32(1.0), np.float32(_K), np.float32(_A)
    three_a = np.float32(3.0 * _A)
    for i in prange(x.size):
        th = _tanh_f32(k * (x[i] + a * x[i] * x[i] * x[i]))  # the forward's tanh(u)
        # d out/dx = (1 + th)/2 + x/2 (1 - th^2) K (1 + 3 A x^2)
        dx[i] = dout[i] * (half * (one + th) + half * x[i] * (one - th * th) * k
                           * (one + three_a * x[i] * x[i]))


def gelu_tanh_forward(x: np.ndarray, *, keep: bool = True):
    """Tanh GELU ``x/2 (1 + tanh(K (x + A x^3)))``; returns ``(out, copy of x)`` as
    ``functional.activations.gelu_tanh_forward``."""
    return _out_and_copy(x, _gelu_tanh_forward_f32, _gelu_tanh_forward_f64, keep)


def gelu_tanh_backward(dout: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``dx = dout ((1 + th)/2 + x/2 (1 - th^2) K (1 + 3 A x^2))``; dout must have x's shape
    and dtype."""
    return _dx_of_x(dout, x, _gelu_tanh_backward_f32, _gelu_tanh_backward_f64)

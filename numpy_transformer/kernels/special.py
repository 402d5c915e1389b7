"""Special functions for the kernels: ``erf`` (NumPy has none) and a vectorised ``exp``.

* :func:`erf`, Python's ``math.erf`` compiled entry by entry. Its readable reference is
  :func:`erf_reference`; ``tests/test_functional.py`` checks the two agree to the last bit.
* :func:`exp_shifted`, ``x[:n] = exp(x[:n] - shift)`` in place, for compiled code: the
  softmax of the attention and cross-entropy kernels and the GELU backward. Its reference is
  the NumPy line in its body; ``tests/test_kernel_attention.py`` checks it within 4 units in
  the last place.

Numba's on-disk cache tracks each compiled function's own source file only. The attention,
softmax and activation kernels compile ``exp_shifted`` into themselves, so after editing this
file delete ``numpy_transformer/kernels/__pycache__/*.nb[ic]`` or they keep the old copy.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

# "contract" lets the compiler fuse a multiply and an add into one instruction (rounding
# once instead of twice): the polynomial below runs about 1.4x faster, and stays as accurate.
# Nothing is reordered (no "reassoc"), so the Cody-Waite split keeps its meaning.
_JIT = dict(cache=True, nogil=True, fastmath={"contract"}, error_model="numpy")


@numba.vectorize(["float32(float32)", "float64(float64)"], cache=True)
def erf(x):  # pragma: no cover - compiled
    """Elementwise ``erf(x)`` in the dtype of ``x``."""
    return math.erf(x)


def erf_reference(x: np.ndarray) -> np.ndarray:
    """Elementwise ``math.erf``: slow, obviously right."""
    return np.frompyfunc(math.erf, 1, 1)(x).astype(x.dtype)


def exp_shifted(x, n, shift):
    """``x[:n] = exp(x[:n] - shift)`` in place, for ``x <= shift``.

    ``-inf`` entries (masked scores) become exactly 0. NumPy reference, and what runs when
    this is called from plain Python: the line below. In compiled code the name resolves to
    ``_exp_shifted_f32`` or ``_exp_shifted_f64`` by x's dtype.
    """
    x[:n] = np.exp(x[:n] - shift)


# Why exp is written out: without Intel's SVML library Numba calls libm's scalar exp once per
# element, several times slower than the rest of a softmax row's work put together. The
# method: write y = x - shift = t ln2 + r with integer t and |r| <= ln2 / 2, so
# exp(y) = 2^t exp(r); exp(r) is a Taylor polynomial (error below one unit in the last place on
# that interval) and 2^t is assembled from its bit pattern, (t + exponent bias) << mantissa
# bits, reinterpreted as a float (``_bits_as_float``, a plain bit cast the compiler vectorises
# like any other instruction). ln2 is split in a short high part, so that t * ln2_hi is
# exact, and the rest (Cody & Waite). Arguments at or below -708 (float64) or -87 (float32),
# where exp(y) nears the smallest normal number, give 0, as do masked scores (-inf); such
# weights are below 1e-37 of the row's largest.

@intrinsic
def _bits_as_float(typingctx, bits):
    """The float whose bit pattern is ``bits``: int32 -> float32, int64 -> float64."""
    if bits == types.int32:
        sig, llvm_type = types.float32(types.int32), ir.FloatType()
    elif bits == types.int64:
        sig, llvm_type = types.float64(types.int64), ir.DoubleType()
    else:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], llvm_type)

    return sig, codegen


def exp_clamped(y):
    """``exp(y)`` of one number ``y <= 0``, exactly 0 at or below the floor (and for -inf).

    The floor is -708 in float64 and -87 in float32, where exp nears the smallest normal
    number. NumPy reference: ``np.exp(y)``. In compiled code the name resolves to
    ``_exp_f32`` or ``_exp_f64`` by y's dtype; loops that call it vectorise.
    """
    return np.exp(y)


@njit(**_JIT)
def _exp_f64(y):  # pragma: no cover - compiled
    y = max(y, -708.0)
    t = np.floor(y * 1.4426950408889634 + 0.5)  # t = round(y / ln2)
    r = (y - t * 6.93147180369123816490e-01) - t * 1.90821492927058770002e-10
    e_r = 1.0 + r * (1.0 + r * (1 / 2 + r * (1 / 6 + r * (1 / 24 + r * (1 / 120 + r * (
        1 / 720 + r * (1 / 5040 + r * (1 / 40320 + r * (1 / 362880 + r * (
            1 / 3628800 + r * (1 / 39916800 + r * (1 / 479001600 + r * (
                1 / 6227020800)))))))))))))  # exp(r)
    two_t = _bits_as_float(np.int64((np.int64(t) + 1023) << 52))  # 2^t
    return e_r * two_t if y > -708.0 else 0.0


@njit(**_JIT)
def _exp_f32(y):  # pragma: no cover - compiled
    # float32 arithmetic, so that 8 lanes fit one AVX register, and a polynomial of degree 7,
    # enough for a 24-bit mantissa
    lo = np.float32(-87.0)
    y = max(y, lo)
    t = np.floor(y * np.float32(1.4426950408889634) + np.float32(0.5))
    r = (y - t * np.float32(0.693359375)) - t * np.float32(-2.12194440e-4)
    e_r = np.float32(1.0) + r * (np.float32(1.0) + r * (np.float32(1 / 2) + r * (
        np.float32(1 / 6) + r * (np.float32(1 / 24) + r * (np.float32(1 / 120) + r * (
            np.float32(1 / 720) + r * np.float32(1 / 5040)))))))
    two_t = _bits_as_float(np.int32((np.int32(t) + 127) << 23))  # 2^t (int32 + int: int64)
    return e_r * two_t if y > lo else np.float32(0.0)


@overload(exp_clamped, jit_options=_JIT)
def _exp_clamped_numba(y):
    if y == types.float32:
        return lambda y: _exp_f32(y)
    return lambda y: _exp_f64(y)


@njit(**_JIT)
def _exp_shifted_f64(x, n, shift):  # pragma: no cover - compiled
    # e = exp(x - shift) in place.  x: (>= n,) float64
    for j in range(n):
        x[j] = _exp_f64(x[j] - shift)


@njit(**_JIT)
def _exp_shifted_f32(x, n, shift):  # pragma: no cover - compiled
    # e = exp(x - shift) in place.  x: (>= n,) float32
    shift_hi = np.float32(shift)  # shift = shift_hi + shift_lo keeps a float64 shift's
    shift_lo = np.float32(shift - shift_hi)  # precision in float32 arithmetic
    for j in range(n):
        x[j] = _exp_f32((x[j] - shift_hi) - shift_lo)


@overload(exp_shifted, jit_options=_JIT)
def _exp_shifted_numba(x, n, shift):
    if x.dtype == types.float32:
        return lambda x, n, shift: _exp_shifted_f32(x, n, shift)
    return lambda x, n, shift: _exp_shifted_f64(x, n, shift)

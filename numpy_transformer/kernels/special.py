"""A vectorised ``exp`` for the kernels' compiled loops.

* :func:`exp_clamped`, ``exp(y)`` of one number ``y <= 0`` for compiled loops (the attention
  kernel's softmax), and :func:`exp_shifted`, ``x[:n] = exp(x[:n] - shift)`` in place (the
  cross-entropy kernel's softmax and the GELU backward). Their references are the NumPy lines
  in their bodies; ``tests/test_kernel_attention.py`` checks them within 4 units in the last
  place (measured: 0.75 in float32).

The attention, softmax, activation and LSTM kernels compile these functions into themselves:
editing this file recompiles every kernel on the next run (``kernels/_jit.py``).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from ._jit import helper, jit_options

# "contract" lets the compiler fuse a multiply and an add into one instruction (rounding
# once instead of twice): the polynomial below runs about 1.4x faster, and stays as accurate.
# Nothing is reordered (no "reassoc"), so the Cody-Waite split keeps its meaning.
_JIT = jit_options(fastmath={"contract"}, error_model="numpy")


def exp_shifted(x, n, shift):
    """``x[:n] = exp(x[:n] - shift)`` in place, for ``x <= shift``.

    ``-inf`` entries (masked scores) become exactly 0. NumPy reference, and what runs when
    this is called from plain Python: the line below. In compiled code the name resolves to
    ``_exp_shifted_f32`` or ``_exp_shifted_f64`` by x's dtype.
    """
    x[:n] = np.exp(x[:n] - shift)


def exp_clamped(y):
    """``exp(y)`` of one number ``y <= 0``, exactly 0 at or below the floor (and for -inf),
    NaN for NaN.

    The floor is -708 in float64 and -87 in float32, where exp nears the smallest normal
    number. NumPy reference: ``np.exp(y)``. In compiled code the name resolves to
    ``_exp_f32`` or ``_exp_f64`` by y's dtype; loops that call it vectorise.
    """
    return np.exp(y)


# Why exp is written out: without Intel's SVML library Numba calls libm's scalar exp once per
# element, several times slower than the rest of a softmax row's work put together. The
# method: write y = t ln2 + r with integer t and |r| <= ln2 / 2, so exp(y) = 2^t exp(r).
# * t = round(y / ln2) by the "magic number" trick: adding M = 1.5 * 2^23 (float32; 2^52 in
#   float64) to y / ln2 leaves the rounded integer in the low mantissa bits of kf = y / ln2 + M
#   (the sum is rounded to a whole number), and t = kf - M is exact. No floor, no conversion.
# * 2^t is assembled from its bit pattern, (t + exponent bias) << mantissa bits: the bits of
#   kf are those of M plus t, and M's own bits are shifted out by the shift, so
#   (bits(kf) + bias) << mantissa bits is already 2^t (``_float_as_bits``, ``_bits_as_float``:
#   plain bit casts the compiler vectorises like any other instruction).
# * r = y - t ln2, with ln2 split in a short high part, so that t * ln2_hi is exact, and the
#   rest (Cody & Waite).
# * exp(r) is a polynomial: in float64 the Taylor series to degree 13, in float32 the degree-6
#   polynomial interpolating exp at the Chebyshev nodes of [-ln2/2, ln2/2] (relative error
#   2.5e-9, against 1.2e-7 for Taylor's degree 6; about 0.75 units in the last place with
#   the rounding).
# Arguments at or below -708 (float64) or -87 (float32), where exp(y) nears the smallest
# normal number, give 0, as do masked scores (-inf); such weights are below 1e-37 of the row's
# largest. A NaN argument gives NaN, as np.exp does: the test is written so that NaN fails it
# (a NaN logit or score then spreads through the row as it does in the NumPy reference, instead
# of being counted as a weight of 0).

def _bit_cast(typingctx, x, pairs):
    """(signature, codegen) of a bit cast from x's Numba type to its partner in ``pairs``."""
    if x not in pairs:
        return None
    target, llvm_type = pairs[x]

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], llvm_type)

    return target(x), codegen


@intrinsic
def _bits_as_float(typingctx, bits):
    """The float whose bit pattern is ``bits``: int32 -> float32, int64 -> float64."""
    return _bit_cast(typingctx, bits, {types.int32: (types.float32, ir.FloatType()),
                                       types.int64: (types.float64, ir.DoubleType())})


@intrinsic
def _float_as_bits(typingctx, x):
    """The bit pattern of the float ``x``: float32 -> int32, float64 -> int64."""
    return _bit_cast(typingctx, x, {types.float32: (types.int32, ir.IntType(32)),
                                    types.float64: (types.int64, ir.IntType(64))})


@helper(_JIT)
def _exp_f64(y):  # pragma: no cover - compiled
    magic = 6755399441055744.0  # 1.5 * 2^52
    kf = y * 1.4426950408889634 + magic  # round(y / ln2) + magic
    t = kf - magic
    r = (y - t * 6.93147180369123816490e-01) - t * 1.90821492927058770002e-10
    e_r = 1.0 + r * (1.0 + r * (1 / 2 + r * (1 / 6 + r * (1 / 24 + r * (1 / 120 + r * (
        1 / 720 + r * (1 / 5040 + r * (1 / 40320 + r * (1 / 362880 + r * (
            1 / 3628800 + r * (1 / 39916800 + r * (1 / 479001600 + r * (
                1 / 6227020800)))))))))))))  # exp(r)
    two_t = _bits_as_float((_float_as_bits(kf) + 1023) << 52)  # 2^t
    return 0.0 if y <= -708.0 else e_r * two_t  # a NaN y fails the test: NaN out


@helper(_JIT)
def _exp_f32(y):  # pragma: no cover - compiled
    # float32 arithmetic, so that 8 lanes fit one AVX register
    f32 = np.float32
    magic = f32(12582912.0)  # 1.5 * 2^23
    kf = y * f32(1.4426950408889634) + magic  # round(y / ln2) + magic
    t = kf - magic
    r = (y - t * f32(0.693359375)) - t * f32(-2.12194440e-4)
    e_r = f32(1.0) + r * (f32(1.0000000377162153) + r * (f32(0.5000000047117971) + r * (
        f32(0.16666415514649008) + r * (f32(0.041666352896198126) + r * (
            f32(0.008375126398416406) + r * f32(0.0013941108469347112))))))  # exp(r)
    # int32 + int gives int64 in Numba: the cast back keeps the low 32 bits, the pattern
    two_t = _bits_as_float(np.int32((_float_as_bits(kf) + 127) << 23))  # 2^t
    return f32(0.0) if y <= f32(-87.0) else e_r * two_t  # NaN in, NaN out


@overload(exp_clamped, jit_options=_JIT)
def _exp_clamped_numba(y):
    if y == types.float32:
        return lambda y: _exp_f32(y)
    return lambda y: _exp_f64(y)


@helper(_JIT)
def _exp_shifted_f64(x, n, shift):  # pragma: no cover - compiled
    # e = exp(x - shift) in place.  x: (>= n,) float64
    for j in range(n):
        x[j] = _exp_f64(x[j] - shift)


@helper(_JIT)
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

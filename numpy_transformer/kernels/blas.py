"""Matrix products inside Numba kernels through NumPy's own BLAS.

Numba's ``np.dot`` calls the BLAS of ``scipy.linalg.cython_blas``. The wheels of NumPy 2.4 and
SciPy 1.17 ship two different OpenBLAS builds (0.3.31 and 0.3.30), and the weight gradient of
a linear layer, ``x^T dout``, whose left operand is transposed, runs 15-20% faster in NumPy's:
measured single-threaded on (800, 84) x (800, 84 to 252) float32, about 130 GF/s against 110.
Their other products run at the same speed, and the two give bit-for-bit the same results on
these shapes. So the kernels make their products with :func:`gemm`, which calls NumPy's
``cblas_?gemm`` by its address. It also takes what ``np.dot`` in Numba does not: an output
that is a block of a larger array, and accumulation into it (the attention kernel multiplies
only the parts of a causal score block that are visible, ``kernels/attention.py``):

* ``gemm(a, b, out, fn, accumulate=False)``: ``out = a @ b`` (``out += a @ b`` with
  ``accumulate``). ``a`` and ``b`` are 2-D with unit stride along one axis (C-contiguous, a
  slice of such an array, or a transpose of either); ``out`` has contiguous rows (a slice of
  a C-contiguous array). ``fn`` is :func:`gemm_address` of the dtype, or 0 for Numba's
  ``np.dot`` (with a copy of each operand and of the result: correct, not fast).

The address is an argument, not a constant compiled into the kernel, so that kernels cached
on disk stay valid in the next process, where the library is loaded at another address. A
NumPy built on another BLAS (MKL, Accelerate, a 32-bit-integer OpenBLAS) gives address 0:
the kernels then use ``np.dot``, as before.

Numba's on-disk cache tracks each compiled function's own source file only, and the kernels
compile ``gemm`` into themselves: after editing this file delete
``numpy_transformer/kernels/__pycache__/*.nb[ic]`` (as for ``special.py``).
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from ..threads import numpy_extension_path

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112  # CBLAS's enums
_JIT = dict(cache=True, nogil=True)
# NumPy's wheels ship OpenBLAS with 64-bit integers (ILP64), its symbols suffixed "64_";
# the call below passes 64-bit integers, so only such symbols are accepted
_SYMBOLS = {np.dtype(np.float32): ("scipy_cblas_sgemm64_", "cblas_sgemm64_"),
            np.dtype(np.float64): ("scipy_cblas_dgemm64_", "cblas_dgemm64_")}


@functools.cache
def gemm_address(dtype) -> int:
    """Address of NumPy's 64-bit-integer ``cblas_sgemm`` (float32) or ``cblas_dgemm``
    (float64), or 0 when there is none (another BLAS, another dtype).

    Symbols are looked up through NumPy's extension module, whose dependencies include its
    BLAS (``dlsym`` semantics).
    """
    names = _SYMBOLS.get(np.dtype(dtype), ())
    try:
        lib = ctypes.CDLL(numpy_extension_path())
    except (AttributeError, OSError):
        return 0
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            return ctypes.cast(fn, ctypes.c_void_p).value
    return 0


@intrinsic
def _cblas_gemm(typingctx, fn, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    # cblas_?gemm(row major, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc),
    # the function at address fn; a, b and c are addresses too. Integers are passed as int64
    # (ILP64), the two scalars in the dtype of alpha, which must be the arrays' dtype.
    sig = types.void(types.int64, types.int64, types.int64, types.int64, types.int64, types.int64,
                     alpha, types.uintp, types.int64, types.uintp, types.int64, alpha,
                     types.uintp, types.int64)

    def codegen(context, builder, signature, args):
        i32, i64 = ir.IntType(32), ir.IntType(64)
        real = context.get_value_type(signature.args[6])
        ptr = real.as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, i64, i64, i64, real, ptr, i64,
                                               ptr, i64, real, ptr, i64])
        fn, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc = args
        builder.call(builder.inttoptr(fn, fnty.as_pointer()),
                     [ir.Constant(i32, _ROW_MAJOR), builder.trunc(trans_a, i32),
                      builder.trunc(trans_b, i32), m, n, k, alpha, builder.inttoptr(a, ptr),
                      lda, builder.inttoptr(b, ptr), ldb, beta, builder.inttoptr(c, ptr), ldc])
        return context.get_dummy_value()

    return sig, codegen


@njit(**_JIT)
def _layout(x):
    # (CBLAS transpose flag, leading dimension) of a 2-D operand whose rows (row major) or
    # columns (its transpose) are contiguous and do not overlap
    unit = x.itemsize
    if x.strides[1] == unit and (x.shape[0] <= 1 or x.strides[0] >= x.shape[1] * unit):
        return _NO_TRANS, max(x.strides[0] // unit, x.shape[1], 1)
    if x.strides[0] == unit and (x.shape[1] <= 1 or x.strides[1] >= x.shape[0] * unit):
        return _TRANS, max(x.strides[1] // unit, x.shape[0], 1)
    raise ValueError("gemm: an operand has neither contiguous rows nor contiguous columns")


@njit(**_JIT)
def _dot_fallback(a, b, out, accumulate):  # pragma: no cover - compiled
    # out = a b or out += a b by Numba's np.dot, for C-contiguous a and b only (one compiled
    # version per dtype, whatever layouts the callers of gemm pass)
    product = np.dot(a, b)
    if accumulate:
        out += product
    else:
        out[...] = product


@njit(**_JIT)
def gemm(a, b, out, fn, accumulate=False):  # pragma: no cover - compiled
    # out = a b, or out += a b with accumulate.  a: (M, K), b: (K, N), out: (M, N) with
    # contiguous rows (a row and column slice of a C array will do); fn: gemm_address of their
    # dtype, or 0 for Numba's np.dot, which needs a copy of each operand laid out as it wants
    if a.shape[1] != b.shape[0] or out.shape[0] != a.shape[0] or out.shape[1] != b.shape[1]:
        raise ValueError("gemm: shapes do not match")
    if fn == 0:
        _dot_fallback(np.ascontiguousarray(a), np.ascontiguousarray(b), out, accumulate)
        return
    trans_a, lda = _layout(a)
    trans_b, ldb = _layout(b)
    trans_out, ldc = _layout(out)
    if trans_out != _NO_TRANS:
        raise ValueError("gemm: out must have contiguous rows")
    _cblas_gemm(fn, trans_a, trans_b, out.shape[0], out.shape[1], a.shape[1],
                out.dtype.type(1), a.ctypes.data, lda, b.ctypes.data, ldb,
                out.dtype.type(1 if accumulate else 0), out.ctypes.data, ldc)

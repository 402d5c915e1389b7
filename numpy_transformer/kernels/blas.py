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
  a C-contiguous array). ``fn`` is :func:`gemm_address` of the dtype. Called from Python it
  checks all of this, and that ``fn`` is such an address, before it calls the BLAS;
  compiled kernels call the compiled version directly (their own wrappers checked).

The address is an argument, not a constant compiled into the kernel, so that kernels cached
on disk stay valid in the next process, where the library is loaded at another address. A
NumPy built on another BLAS (MKL, Accelerate, a 32-bit-integer OpenBLAS) has no such
function; ``gemm_address`` then gives minus the address of SciPy's Fortran ``?gemm`` (the
function behind Numba's ``np.dot``), which ``gemm`` calls instead. (A fallback through
``np.dot`` itself nearly doubled the kernels' first compilation: Numba compiled its whole
implementation into every product of the parallel kernels.)

The kernels compile ``gemm`` into themselves: editing this file recompiles every kernel on the
next run (``kernels/_jit.py``), as editing a kernel's own file does.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import get_cython_function_address, intrinsic, overload

from ..threads import numpy_extension_path
from ._jit import helper, jit_options
from ._validate import check_kernel_float

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112  # CBLAS's enums
_CHAR = (ord("N"), ord("T"))  # the Fortran interface's, for _NO_TRANS and _TRANS
_JIT = jit_options()
# NumPy's wheels ship OpenBLAS with 64-bit integers (ILP64), its symbols suffixed "64_";
# the call below passes 64-bit integers, so only such symbols are accepted
_SYMBOLS = {np.dtype(np.float32): ("scipy_cblas_sgemm64_", "cblas_sgemm64_"),
            np.dtype(np.float64): ("scipy_cblas_dgemm64_", "cblas_dgemm64_")}


def _numpy_cblas(dtype) -> int:
    """Address of NumPy's 64-bit-integer ``cblas_?gemm`` for dtype, or 0. Symbols are looked
    up through NumPy's extension module, whose dependencies include its BLAS (``dlsym``)."""
    try:
        lib = ctypes.CDLL(numpy_extension_path())
    except (AttributeError, OSError):
        return 0
    for name in _SYMBOLS.get(np.dtype(dtype), ()):
        fn = getattr(lib, name, None)
        if fn is not None:
            return ctypes.cast(fn, ctypes.c_void_p).value
    return 0


def _scipy_fortran(dtype) -> int:
    """Address of SciPy's Fortran ``?gemm`` (32-bit integers, the BLAS behind Numba's np.dot)
    for dtype, or 0."""
    name = {np.dtype(np.float32): "sgemm", np.dtype(np.float64): "dgemm"}.get(np.dtype(dtype))
    if name is None:
        return 0
    try:
        return get_cython_function_address("scipy.linalg.cython_blas", name)
    except (ImportError, ValueError):
        return 0


def gemm_address(dtype, numpys: bool = True) -> int:
    """What :func:`gemm` calls for arrays of ``dtype``: the address of NumPy's
    ``cblas_?gemm`` (positive), else minus that of SciPy's Fortran ``?gemm`` (negative), or 0
    for a dtype neither has. ``numpys=False`` skips NumPy's (for the tests of the other).

    Raises
    ------
    ValueError
        If ``dtype`` names no NumPy dtype.
    """
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"dtype must name a NumPy dtype, got {dtype!r}") from None
    return _gemm_address(dtype, bool(numpys))


@functools.cache
def _gemm_address(dtype: np.dtype, numpys: bool) -> int:
    fn = _numpy_cblas(dtype) if numpys else 0
    return fn if fn else -_scipy_fortran(dtype)


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


@intrinsic
def _fortran_gemm(typingctx, fn, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                  ldc):
    # ?gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) of the Fortran
    # interface (column major, every argument by reference, 32-bit integers, the transposes
    # as the characters "N" or "T"), the function at address fn; a, b, c are addresses
    sig = types.void(types.int64, types.int64, types.int64, types.int64, types.int64,
                     types.int64, alpha, types.uintp, types.int64, types.uintp, types.int64,
                     alpha, types.uintp, types.int64)

    def codegen(context, builder, signature, args):
        i8, i32 = ir.IntType(8), ir.IntType(32)
        real = context.get_value_type(signature.args[6])
        ptr = real.as_pointer()
        fn, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc = args

        def ref(value, kind):  # a stack slot holding value, for the by-reference call
            slot = cgutils.alloca_once(builder, kind)
            builder.store(value, slot)
            return slot

        chars = [ref(builder.trunc(t, i8), i8) for t in (trans_a, trans_b)]
        ints = [ref(builder.trunc(x, i32), i32) for x in (m, n, k, lda, ldb, ldc)]
        fnty = ir.FunctionType(ir.VoidType(), [i8.as_pointer()] * 2 + [i32.as_pointer()] * 3
                               + [ptr, ptr, i32.as_pointer(), ptr, i32.as_pointer(), ptr, ptr,
                                  i32.as_pointer()])
        builder.call(builder.inttoptr(fn, fnty.as_pointer()),
                     [*chars, *ints[:3], ref(alpha, real), builder.inttoptr(a, ptr), ints[3],
                      builder.inttoptr(b, ptr), ints[4], ref(beta, real),
                      builder.inttoptr(c, ptr), ints[5]])
        return context.get_dummy_value()

    return sig, codegen


@njit(**_JIT)
def _layout(rows, cols, row_stride, col_stride, unit):
    # (CBLAS transpose flag, leading dimension) of a 2-D operand (rows, cols), with these
    # strides in bytes and items of `unit` bytes, whose rows (row major) or columns (its
    # transpose) are contiguous and do not overlap
    if col_stride == unit and (rows <= 1 or row_stride >= cols * unit):
        return _NO_TRANS, max(row_stride // unit, cols, 1)
    if row_stride == unit and (cols <= 1 or col_stride >= rows * unit):
        return _TRANS, max(col_stride // unit, rows, 1)
    raise ValueError("gemm: an operand has neither contiguous rows nor contiguous columns")


def gemm(a: np.ndarray, b: np.ndarray, out: np.ndarray, fn: int, accumulate: bool = False) -> None:
    """``out = a @ b`` (``out += a @ b`` with ``accumulate``) by the BLAS at ``fn``; see the
    module docstring for the layouts taken. From Python every argument is checked first
    (``ValueError``); in compiled code the name is the overload below, which checks less.
    """
    for name, x in (("a", a), ("b", b), ("out", out)):
        check_kernel_float(name, x, ndim=2)
    if not a.dtype == b.dtype == out.dtype:
        raise ValueError(f"gemm: a, b and out must share one dtype, got {a.dtype}, {b.dtype}, "
                         f"{out.dtype}")
    if a.shape[1] != b.shape[0] or out.shape != (a.shape[0], b.shape[1]):
        raise ValueError(f"gemm: shapes do not match: {a.shape} @ {b.shape} -> {out.shape}")
    if not out.flags.writeable:
        raise ValueError("gemm: out must be writeable")
    if isinstance(fn, bool) or not isinstance(fn, (int, np.integer)) or fn == 0:
        raise ValueError(f"gemm: no BLAS for this dtype (fn = {fn!r})")
    if fn not in (gemm_address(out.dtype), gemm_address(out.dtype, False)):
        raise ValueError(f"gemm: fn must be gemm_address({out.dtype}), got {fn}")
    # the compiled test, on its own: ValueError for a layout BLAS cannot take
    layouts = [_layout(*x.shape, *x.strides, x.itemsize) for x in (a, b, out)]
    if layouts[2][0] != _NO_TRANS:
        raise ValueError("gemm: out must have contiguous rows")
    _gemm(a, b, out, fn, bool(accumulate))


# Compiled kernels call the overload's implementation below, compiled once per layout of the
# three arrays ("C", "F" or "A" each). It only takes the arrays apart into addresses, shapes
# and strides for `_gemm_strided`, which does the work and compiles once per dtype: the default
# run's products, of five layouts, compile in about half the time they took with the work in
# the implementation itself (`benchmarks/README.md`).
# ``_gemm`` is the entry from Python.
@overload(gemm, jit_options=_JIT)
def _gemm_in_compiled_code(a, b, out, fn, accumulate=False):
    def impl(a, b, out, fn, accumulate=False):  # pragma: no cover - compiled
        # out = a b, or out += a b with accumulate.  a: (M, K), b: (K, N), out: (M, N) with
        # contiguous rows (a row and column slice of a C array will do); fn: gemm_address
        # of their dtype
        if (a.shape[1] != b.shape[0] or out.shape[0] != a.shape[0]
                or out.shape[1] != b.shape[1]):
            raise ValueError("gemm: shapes do not match")
        _gemm_strided(fn, out.shape[0], out.shape[1], a.shape[1], out.dtype.type(1),
                      (a.ctypes.data, a.strides[0], a.strides[1]),
                      (b.ctypes.data, b.strides[0], b.strides[1]),
                      out.dtype.type(1 if accumulate else 0),
                      (out.ctypes.data, out.strides[0], out.strides[1]), out.itemsize)

    return impl


@helper(_JIT)
def _gemm_strided(fn, m, n, k, alpha, a, b, beta, c, unit):  # pragma: no cover - compiled
    # c = alpha a b + beta c, BLAS's own equation, for a (M, K), b (K, N), c (M, N), each
    # given as (address, row stride, column stride), strides in bytes of items of `unit`
    trans_a, lda = _layout(m, k, a[1], a[2], unit)
    trans_b, ldb = _layout(k, n, b[1], b[2], unit)
    trans_c, ldc = _layout(m, n, c[1], c[2], unit)
    if trans_c != _NO_TRANS:
        raise ValueError("gemm: out must have contiguous rows")
    if fn > 0:  # NumPy's CBLAS, row major
        _cblas_gemm(fn, trans_a, trans_b, m, n, k, alpha, a[0], lda, b[0], ldb, beta, c[0],
                    ldc)
    elif fn < 0:  # SciPy's Fortran gemm, column major: c^T = b^T a^T
        _fortran_gemm(-fn, _CHAR[trans_b - _NO_TRANS], _CHAR[trans_a - _NO_TRANS], n, m, k,
                      alpha, b[0], ldb, a[0], lda, beta, c[0], ldc)
    else:
        raise ValueError("gemm: no BLAS for this dtype")


@njit(**_JIT)
def _gemm(a, b, out, fn, accumulate=False):  # pragma: no cover - compiled
    gemm(a, b, out, fn, accumulate)

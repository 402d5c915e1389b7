"""``kernels/blas.py``: products through NumPy's BLAS inside Numba kernels, and the thread
setting that keeps each BLAS call on its calling thread (``threads.blas_on_calling_thread``).

``gemm`` is compared with NumPy's matmul for every operand layout the kernels pass (a
C-contiguous array, a row slice of one, the transpose of either), in float32 and float64, by
NumPy's CBLAS and by the fallback, SciPy's Fortran gemm. Shapes are non-square, so that a swapped
transposition flag or leading dimension changes the result or fails.
"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_transformer import threads
from numpy_transformer.kernels import linear as fast_linear
from numpy_transformer.kernels.blas import gemm, gemm_address

TOL = {np.float64: 1e-12, np.float32: 1e-5}


def _numpy_has_ilp64_openblas() -> bool:
    """Whether NumPy says it was built on an OpenBLAS with 64-bit integers (its wheels are)."""
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    return "openblas" in blas.get("name", "") and "64BITINT" in blas.get(
        "openblas configuration", "")


def _operand(rng, shape, dtype, layout):
    """A (rows, cols) operand laid out as: "C", "T" (transpose of a C array), "rows" (a row
    slice of a wider C array: leading dimension > cols), "T-rows" (transpose of such a slice)."""
    rows, cols = shape
    if layout == "C":
        return rng.standard_normal(shape).astype(dtype)
    if layout == "T":
        return rng.standard_normal((cols, rows)).astype(dtype).T
    if layout == "rows":
        return rng.standard_normal((rows + 5, cols + 3)).astype(dtype)[2:2 + rows, 1:1 + cols]
    return rng.standard_normal((cols + 5, rows + 3)).astype(dtype)[2:2 + cols, 1:1 + rows].T


_LAYOUTS = ["C", "T", "rows", "T-rows"]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("a_layout", _LAYOUTS)
@pytest.mark.parametrize("b_layout", _LAYOUTS)
@pytest.mark.parametrize("numpys_blas", [True, False])  # NumPy's CBLAS, SciPy's Fortran gemm
def test_gemm_matches_matmul(dtype, a_layout, b_layout, numpys_blas):
    rng = np.random.default_rng(0)
    a = _operand(rng, (37, 11), dtype, a_layout)
    b = _operand(rng, (11, 23), dtype, b_layout)
    fn = gemm_address(dtype, numpys_blas)
    assert (fn > 0) == numpys_blas or not _numpy_has_ilp64_openblas()
    out = np.full((37, 23), np.nan, dtype=dtype)
    gemm(a, b, out, fn)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(out - want).max() <= TOL[dtype] * np.abs(want).max()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gemm_writes_a_row_slice_of_its_output_only(dtype):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((9, 4)).astype(dtype), rng.standard_normal((4, 6)).astype(dtype)
    out = np.full((20, 6), 7.0, dtype=dtype)
    gemm(a, b, out[5:14], gemm_address(dtype))
    assert np.abs(out[5:14] - a @ b).max() <= TOL[dtype] * np.abs(a @ b).max()
    assert (out[:5] == 7.0).all() and (out[14:] == 7.0).all()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("numpys_blas", [True, False])
def test_gemm_accumulates_into_a_block_of_its_output(dtype, numpys_blas):
    """``accumulate=True`` adds into ``out``; ``out`` may be a block of a wider array (as the
    attention kernel's score blocks are); the entries around it stay untouched."""
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((9, 4)).astype(dtype), rng.standard_normal((6, 4)).astype(dtype)
    fn = gemm_address(dtype, numpys_blas)
    out = rng.standard_normal((20, 12)).astype(dtype)
    before = out.copy()
    gemm(a, b.T, out[5:14, 3:9], fn, True)
    want = before.copy()
    want[5:14, 3:9] += a @ b.T
    assert np.abs(out - want).max() <= TOL[dtype] * np.abs(want).max()
    outside = np.ones(out.shape, bool)
    outside[5:14, 3:9] = False
    np.testing.assert_array_equal(out[outside], before[outside])


def test_numpys_blas_is_found_on_the_wheels():
    if _numpy_has_ilp64_openblas():
        assert gemm_address(np.float32) > 0 and gemm_address(np.float64) > 0
    # SciPy's, the fallback, is always there (SciPy is a dependency)
    assert gemm_address(np.float32, False) < 0 and gemm_address(np.float64, False) < 0
    assert gemm_address(np.int64) == 0  # no integer gemm


def test_gemm_without_a_blas_raises():
    a = np.ones((2, 2))
    with pytest.raises(ValueError, match="no BLAS"):
        gemm(a, a, np.empty((2, 2)), 0)


def test_gemm_rejects_bad_operands():
    fn = gemm_address(np.float64)
    a, b = np.ones((4, 3)), np.ones((3, 5))
    with pytest.raises(ValueError, match="shapes"):
        gemm(a, b, np.empty((4, 4)), fn)
    with pytest.raises(ValueError, match="contiguous"):  # strided both ways
        gemm(np.ones((8, 6))[::2, ::2], b, np.empty((4, 5)), fn)
    with pytest.raises(ValueError, match="contiguous rows"):  # a transposed output
        gemm(a, b, np.empty((5, 4)).T, fn)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_linear_kernel_without_numpys_blas_gives_the_same_result(dtype, monkeypatch):
    # the fallback (SciPy's Fortran gemm) against the default path: same products
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 300, 12)).astype(dtype)
    w, b = rng.standard_normal((12, 7)).astype(dtype), rng.standard_normal(7).astype(dtype)
    g = rng.standard_normal((3, 300, 7)).astype(dtype)
    out, cache = fast_linear.linear_forward(x, w, b)
    grads = fast_linear.linear_backward(g, cache)
    monkeypatch.setattr(fast_linear, "gemm_address", lambda dtype: gemm_address(dtype, False))
    out0, cache0 = fast_linear.linear_forward(x, w, b)
    grads0 = fast_linear.linear_backward(g, cache0)
    for got, want in zip((out0, *grads0), (out, *grads), strict=True):
        assert np.abs(got - want).max() <= TOL[dtype] * np.abs(want).max()


def test_blas_runs_on_the_calling_thread_inside_the_block_only():
    pairs = threads._BLAS_THREADS()
    if _numpy_has_ilp64_openblas():
        assert len(pairs) == 2  # SciPy's (Numba's np.dot) and NumPy's
    before = [get() for get, _ in pairs]
    try:
        for _, set_ in pairs:
            set_(2)
        with threads.blas_on_calling_thread():
            assert [get() for get, _ in pairs] == [1] * len(pairs)
        assert [get() for get, _ in pairs] == [2] * len(pairs)
    finally:
        for (_, set_), n in zip(pairs, before, strict=True):
            set_(n)

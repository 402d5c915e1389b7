"""``kernels/linear.py`` (rows split over Numba's threads) against ``functional/linear.py``.

The kernel cuts the rows into chunks and adds per-chunk weight gradients at the end (a layer
at least ``_WIDE_COLUMNS`` wide makes them by blocks of columns instead), so the
tests use enough rows for several chunks (at least ``_MIN_ROWS``, below which the kernel hands
over to the reference), random upstream gradients, float64 (1e-12) and float32 (1e-5). The
chunks depend on the number of rows only: one thread and two give the same bits.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from _kernel_helpers import TOL, assert_gradients_match, multi_thread, rel_err
from _nn_helpers import assert_gradcheck

from numpy_transformer.backend import Backend
from numpy_transformer.functional import linear as ref
from numpy_transformer.gradcheck import check_module
from numpy_transformer.kernels import linear as fast
from numpy_transformer.nn import Linear, MultiHeadAttention


def _problem(shape, c_out, dtype, seed=0, weight_order="C"):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(dtype)
    w = np.asarray(rng.standard_normal((shape[-1], c_out)), dtype=dtype, order=weight_order)
    b = rng.standard_normal(c_out).astype(dtype)
    g = rng.standard_normal(shape[:-1] + (c_out,)).astype(dtype)
    return x, w, b, g


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape, c_out", [((4, 100, 12), 7), ((1301, 5), 9), ((2, 3, 50, 8), 3),
                                          ((300, 6), fast._WIDE_COLUMNS + 37)])  # dW by columns
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("weight_order", ["C", "F"])  # "F": a tied output's table.T
def test_linear_kernel_matches_reference(shape, c_out, dtype, bias, weight_order):
    x, w, b, g = _problem(shape, c_out, dtype, weight_order=weight_order)
    b = b if bias else None
    assert x.reshape(-1, shape[-1]).shape[0] >= fast._MIN_ROWS  # the kernel, not the fallback
    out_r, cache_r = ref.linear_forward(x, w, b)
    out_f, cache_f = fast.linear_forward(x, w, b)
    assert type(cache_f) is type(cache_r) and out_f.dtype == dtype
    assert rel_err(out_f, out_r) <= TOL[dtype]
    grads_r = ref.linear_backward(g, cache_r)
    grads_f = fast.linear_backward(g, cache_f)
    assert_gradients_match(grads_f, grads_r, dtype)


def test_few_rows_take_the_reference_path_bit_for_bit():
    x, w, b, g = _problem((3, 7, 6), 4, np.float64)  # 21 rows: one BLAS call beats threads
    out_r, cache_r = ref.linear_forward(x, w, b)
    out_f, cache_f = fast.linear_forward(x, w, b)
    np.testing.assert_array_equal(out_f, out_r)
    for got, want in zip(fast.linear_backward(g, cache_f), ref.linear_backward(g, cache_r),
                         strict=True):
        np.testing.assert_array_equal(got, want)


@multi_thread
@pytest.mark.parametrize("c_out, backward", [(24, "_backward_kernel"),
                                             (fast._WIDE_COLUMNS + 37, "_backward_wide_kernel")])
def test_one_thread_and_two_give_the_same_bits(monkeypatch, c_out, backward):
    x, w, b, g = _problem((8, 200, 16), c_out, np.float32)  # 1600 rows: 4 chunks
    calls = []

    def spy(name):  # the kernel ``name``, noting each call
        kernel = getattr(fast, name)

        def call(*args):
            calls.append(name)
            return kernel(*args)
        return call

    for name in ("_forward_kernel", backward):
        monkeypatch.setattr(fast, name, spy(name))
    results = []
    before = numba.get_num_threads()
    try:
        for threads in (1, 2):
            numba.set_num_threads(threads)
            out, cache = fast.linear_forward(x, w, b)
            results.append((out, *fast.linear_backward(g, cache)))
    finally:
        numba.set_num_threads(before)
    assert calls == ["_forward_kernel", backward] * 2
    for one, two in zip(*results, strict=True):
        np.testing.assert_array_equal(one, two)
    out_r, cache_r = ref.linear_forward(x, w, b)
    for got, want in zip(results[0], (out_r, *ref.linear_backward(g, cache_r)), strict=True):
        assert rel_err(got, want) <= TOL[np.float32]


def test_mixed_dtypes_promote_as_the_reference():
    x, w, b, g = _problem((300, 6), 4, np.float32)
    w64 = w.astype(np.float64)
    out_r, cache_r = ref.linear_forward(x, w64, b)
    out_f, cache_f = fast.linear_forward(x, w64, b)
    assert out_f.dtype == out_r.dtype == np.float64
    assert rel_err(out_f, out_r) <= 1e-12
    dx_r, dw_r, db_r = ref.linear_backward(g.astype(np.float64), cache_r)
    dx_f, dw_f, db_f = fast.linear_backward(g.astype(np.float64), cache_f)
    for got, want in ((dx_f, dx_r), (dw_f, dw_r), (db_f, db_r)):
        assert got.dtype == want.dtype == np.float64 and rel_err(got, want) <= 1e-12


def test_linear_kernel_rejects_bad_input_as_the_reference():
    x, w, b, _ = _problem((300, 6), 4, np.float64)
    with pytest.raises(ValueError, match="last"):
        fast.linear_forward(x[:, :5], w, b)
    with pytest.raises(ValueError):
        fast.linear_forward(x.astype(np.int64), w, b)


@pytest.mark.parametrize("wide", [False, True])
def test_linear_module_on_the_kernel_passes_gradcheck(monkeypatch, wide):
    """Both backward kernels against central differences; ``wide`` lowers the width from
    which dW is made by column blocks (a vocabulary head's path) to this layer's 5."""
    calls = []
    kernel = fast._backward_wide_kernel
    monkeypatch.setattr(fast, "_backward_wide_kernel", lambda *a: calls.append(1) or kernel(*a))
    if wide:
        monkeypatch.setattr(fast, "_WIDE_COLUMNS", 5)
    rng = np.random.default_rng(3)
    layer = Linear(6, 5, dtype=np.float64, rng=rng, backend="numba")
    x = rng.standard_normal((2, 150, 6))  # 300 rows: several chunks
    assert_gradcheck(check_module(layer, {"x": x}), layer)
    assert bool(calls) == wide


def test_gradcheck_catches_a_wrong_last_chunk(monkeypatch):
    """Negative control: a backward that gets only the last chunk's rows wrong must fail."""
    rng = np.random.default_rng(3)
    layer = Linear(6, 5, dtype=np.float64, rng=rng, backend="numba")
    right = layer.ops.linear_backward

    def wrong(dout, cache):
        dx, dw, db = right(dout, cache)
        dx = dx.copy()
        dx[-1, -1] *= 1.01  # the last row belongs to the last chunk
        return dx, dw, db

    monkeypatch.setattr(layer, "ops", Backend(**{**vars(layer.ops), "linear_backward": wrong}))
    x = rng.standard_normal((2, 150, 6))
    assert not check_module(layer, {"x": x}).ok(1e-6)


@pytest.mark.parametrize("cross", [False, True])
def test_attention_projections_on_the_kernel_equal_the_reference(cross):
    """Stacked q/k/v (or k/v) products through the kernel: same outputs and gradients.

    ``bk`` has a true gradient of exactly zero (see ``zero_gradient_names``): both sides are
    rounding noise there, judged by absolute error."""
    rng = np.random.default_rng(5)
    x, ctx, g = (rng.standard_normal((2, 150, 16)) for _ in range(3))
    results = []
    for backend in ("numpy", "numba"):
        attn = MultiHeadAttention(16, 4, backend=backend, rng=np.random.default_rng(9))
        out = attn.forward(x, ctx if cross else None)
        dins = attn.backward(g)
        dins = dins if cross else (dins,)
        results.append({"out": out, **dict(enumerate(dins)), **attn.grads})
    for name, want in results[0].items():
        got = results[1][name]
        if name == "bk":
            assert np.abs(got - want).max() <= 1e-12
        else:
            assert rel_err(got, want) <= 1e-12, name


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batch, t", [(13, 100), (2, 7)])  # chunks that split sequences; few rows
def test_heads_kernel_matches_the_reference(dtype, bias, batch, t):
    """Three projections of one source by head, (B, H, T, D) each, and their backward: the
    kernel (one product of the weights side by side) gives the reference's numbers, and its
    own heads are C-contiguous."""
    heads, d = 4, 5
    rng = np.random.default_rng(2)
    x = rng.standard_normal((batch, t, 16)).astype(dtype)
    ws = tuple(rng.standard_normal((16, heads * d)).astype(dtype) for _ in range(3))
    bs = tuple(rng.standard_normal(heads * d).astype(dtype) for _ in range(3)) if bias else None
    ys_r, cache_r = ref.linear_heads_forward(x, ws, bs, heads)
    ys_f, cache_f = fast.linear_heads_forward(x, ws, bs, heads)
    flat = ref.linear_forward(x, ws[1], None if bs is None else bs[1])[0]  # (B, T, H*D)
    np.testing.assert_array_equal(ys_r[1][0, 2, 3], flat[0, 3, 2 * d:3 * d])
    for y_r, y_f in zip(ys_r, ys_f, strict=True):
        assert y_r.shape == y_f.shape == (batch, heads, t, d) and y_f.dtype == dtype
        assert rel_err(y_f, y_r) <= TOL[dtype]
        assert y_f.flags.c_contiguous or batch * t < fast._MIN_ROWS  # few rows: the reference
    dys = tuple(rng.standard_normal(y.shape).astype(dtype) for y in ys_r)
    got, want = fast.linear_heads_backward(dys, cache_f), ref.linear_heads_backward(dys, cache_r)
    assert rel_err(got[0], want[0]) <= TOL[dtype]
    for name, i in (("dws", 1), ("dbs", 2)):
        if want[i] is None:
            assert got[i] is None and not bias
            continue
        for g, w in zip(got[i], want[i], strict=True):
            assert g.dtype == dtype and rel_err(g, w) <= TOL[dtype], name


def test_heads_backward_sums_the_paths_of_one_source():
    """dx of two projections of one x is the sum of each projection's linear_backward."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 150, 6))
    ws = (rng.standard_normal((6, 8)), rng.standard_normal((6, 8)))
    dys = tuple(rng.standard_normal((2, 2, 150, 4)) for _ in ws)
    for impl in (ref, fast):
        _, cache = impl.linear_heads_forward(x, ws, None, 2)
        dx, dws, dbs = impl.linear_heads_backward(dys, cache)
        parts = [ref.linear_backward(ref.merge_heads(dy), ref.linear_forward(x, w)[1])
                 for w, dy in zip(ws, dys, strict=True)]
        assert dbs is None and rel_err(dx, parts[0][0] + parts[1][0]) <= 1e-12
        for dw, part in zip(dws, parts, strict=True):
            assert rel_err(dw, part[1]) <= 1e-12


def test_heads_layout_rejects_bad_input():
    x, w, b, _ = _problem((300, 6), 12, np.float64)
    for impl in (ref, fast):
        with pytest.raises(ValueError, match="dimensions"):
            impl.linear_heads_forward(x, (w, w), (b, b), 2)  # (N, C): not (B, T, C)
        with pytest.raises(ValueError, match="last"):
            impl.linear_heads_forward(x[None, :, :5], (w, w), (b, b), 2)
        with pytest.raises(ValueError, match="tuple"):
            impl.linear_heads_forward(x[None], w, b, 2)  # one array, not a tuple of them
        with pytest.raises(ValueError, match="heads"):
            impl.linear_heads_forward(x[None], (w,), (b,), 5)

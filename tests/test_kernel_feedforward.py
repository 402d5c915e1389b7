"""``kernels/feedforward.py`` (the ReLU network as one kernel over chunks of rows) and its
reference composition in ``functional/fused.py`` against the readable pieces they stand for:
``functional`` linear, ReLU, linear.

The kernel runs only on two threads or more and with at least ``_MIN_ROWS`` rows (otherwise
the reference composition runs, also tested here). Float64 to 1e-12 and float32 to 1e-5,
relative to the largest entry; the ReLU's exact zeros must fall on the same entries; random
upstream gradients; a gradcheck of the module on the kernel and a negative control.
"""

from __future__ import annotations

import numpy as np
import pytest
from _kernel_helpers import TOL, rel_err
from _nn_helpers import assert_gradcheck

from numpy_transformer.functional import fused as ref_fused
from numpy_transformer.functional import linear as ref
from numpy_transformer.functional.activations import relu_backward, relu_forward
from numpy_transformer.gradcheck import check_module
from numpy_transformer.kernels import feedforward as fused
from numpy_transformer.nn import FeedForward


def _problem(shape, f, dtype, seed=0):
    rng = np.random.default_rng(seed)
    c = shape[-1]
    x, g = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    w1, w2 = rng.standard_normal((c, f)).astype(dtype), rng.standard_normal((f, c)).astype(dtype)
    b1, b2 = rng.standard_normal(f).astype(dtype), rng.standard_normal(c).astype(dtype)
    return x, w1, b1, w2, b2, g


@pytest.mark.parametrize("module", [fused, ref_fused], ids=["kernel", "composition"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(21, 6), (1301, 6), (3, 150, 6)])  # reference path; chunks
def test_fused_ffn_matches_the_pieces(dtype, shape, module):
    """Forward and all five gradients against linear -> ReLU -> linear of ``functional``.

    The ReLU cuts about half of h to exact zeros: they must be the same entries, +0 as from
    np.maximum, and the gradient through them exactly zero."""
    x, w1, b1, w2, b2, g = _problem(shape, 9, dtype)
    a, cache1 = ref.linear_forward(x, w1, b1)
    h, relu_cache = relu_forward(a)
    out_r, cache2 = ref.linear_forward(h, w2, b2)
    dh, dw2_r, db2_r = ref.linear_backward(g, cache2)
    dx_r, dw1_r, db1_r = ref.linear_backward(relu_backward(dh, relu_cache), cache1)

    out, cache = module.relu_ffn_forward(x, w1, b1, w2, b2)
    got = (out, *module.relu_ffn_backward(g, cache))
    want = (out_r, dx_r, dw1_r, db1_r, dw2_r, db2_r)
    for name, a_got, a_want in zip(("out", "dx", "dw1", "db1", "dw2", "db2"), got, want,
                                   strict=True):
        assert a_got.dtype == dtype and a_got.shape == a_want.shape, name
        assert rel_err(a_got, a_want) <= TOL[dtype], name
    h_got = cache.h.reshape(h.shape)
    assert 0.3 < (h_got == 0).mean() < 0.7 and np.array_equal(h_got == 0, h == 0)
    assert not np.signbit(h_got).any()


@pytest.mark.parametrize("shape", [(21, 6), (1301, 6)])
def test_fused_ffn_keeps_nan(shape):
    x, w1, b1, w2, b2, g = _problem(shape, 9, np.float64)
    x[4, 0] = np.nan
    out, cache = fused.relu_ffn_forward(x, w1, b1, w2, b2)
    assert np.isnan(out[4]).all() and not np.isnan(np.delete(out, 4, axis=0)).any()
    assert np.isnan(cache.h[4]).all()


def test_feedforward_on_the_kernel_passes_gradcheck_and_matches_numpy():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 150, 6))  # 300 rows: the kernel's chunks
    ffns = [FeedForward(6, 10, "relu", rng=np.random.default_rng(8), backend=backend)
            for backend in ("numpy", "numba")]
    assert ffns[0].ops.relu_ffn_forward is ref_fused.relu_ffn_forward
    assert ffns[1].ops.relu_ffn_forward is fused.relu_ffn_forward
    g = rng.standard_normal(x.shape)
    outs = [f.forward(x) for f in ffns]
    dxs = [f.backward(g) for f in ffns]
    assert rel_err(outs[1], outs[0]) <= 1e-12 and rel_err(dxs[1], dxs[0]) <= 1e-12
    for name, want in ffns[0].grads.items():
        assert rel_err(ffns[1].grads[name], want) <= 1e-12, name
    fresh = FeedForward(6, 10, "relu", rng=np.random.default_rng(8), backend="numba")
    assert_gradcheck(check_module(fresh, {"x": x}), fresh)


def test_gradcheck_catches_a_backward_that_forgets_the_relu(monkeypatch):
    """Negative control: the reference composition with the ReLU's backward left out must
    fail."""
    rng = np.random.default_rng(4)
    ffn = FeedForward(6, 10, "relu", rng=rng, backend="numpy")
    x = rng.standard_normal((2, 150, 6))
    assert check_module(ffn, {"x": x}).ok(1e-6)  # the composition itself is right
    monkeypatch.setattr(ref_fused, "relu_backward", lambda dout, x: dout)
    assert not check_module(ffn, {"x": x}).ok(1e-6)


def test_fused_ffn_rejects_bad_input():
    x, w1, b1, w2, b2, g = _problem((300, 6), 9, np.float64)
    with pytest.raises(ValueError, match="last"):
        fused.relu_ffn_forward(x[:, :5], w1, b1, w2, b2)
    with pytest.raises(ValueError, match="weights"):
        fused.relu_ffn_forward(x, w1, b1, w2.T, b2)
    with pytest.raises(ValueError, match="weights"):
        fused.relu_ffn_forward(x, w1, b1.astype(np.float32), w2, b2)
    with pytest.raises(ValueError):
        fused.relu_ffn_forward(x.astype(int), w1, b1, w2, b2)
    _, cache = fused.relu_ffn_forward(x, w1, b1, w2, b2)
    with pytest.raises(ValueError, match="dout"):
        fused.relu_ffn_backward(g[:10], cache)

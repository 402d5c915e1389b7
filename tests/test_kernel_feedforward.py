"""``kernels/feedforward.py`` (the ReLU network as one kernel over chunks of rows, the numba
pieces composed for every other activation) and its reference ``functional/feedforward.py``
against the readable pieces they stand for: ``functional`` linear, activation, linear.

The one-pass kernel runs only with at least ``_MIN_ROWS`` rows (otherwise the reference
runs, also tested here). Float64 to 1e-12 and float32 to 1e-5, relative to the largest entry;
the ReLU's exact zeros must fall on the same entries; random upstream gradients; a gradcheck
of the module on the kernel and a negative control.
"""

from __future__ import annotations

import numpy as np
import pytest
from _kernel_helpers import TOL, rel_err
from _nn_helpers import assert_gradcheck

from numpy_transformer import config
from numpy_transformer.functional import activations as ref_act
from numpy_transformer.functional import feedforward as ref_ffn
from numpy_transformer.functional import linear as ref
from numpy_transformer.gradcheck import check_module
from numpy_transformer.kernels import feedforward as fast_ffn
from numpy_transformer.nn import FeedForward


def _problem(shape, f, dtype, activation="relu", bias=True, seed=0):
    """x, weights {name: (w, b)} and a random upstream gradient g."""
    rng = np.random.default_rng(seed)
    c = shape[-1]

    def normal(*s):
        return rng.standard_normal(s).astype(dtype)

    x, g = normal(*shape), normal(*shape)
    weights = {name: (normal(f, c) if name == "down" else normal(c, f),
                      (normal(c) if name == "down" else normal(f)) if bias else None)
               for name in ref_ffn.feed_forward_weight_names(activation)}
    return x, weights, g


def _pieces(x, weights, activation, g):
    """out and (dx, grads) by the functional pieces, one by one."""
    act_forward = getattr(ref_act, f"{activation}_forward")
    act_backward = getattr(ref_act, f"{activation}_backward")
    h, up = ref.linear_forward(x, *weights["up"])
    if activation in config.GATED_ACTIVATIONS:
        gl, gate = ref.linear_forward(x, *weights["gate"])
        a, act = act_forward(gl, h)
    else:
        a, act = act_forward(h)
    out, down = ref.linear_forward(a, *weights["down"])
    da, *grads_down = ref.linear_backward(g, down)
    grads = {"down": grads_down}
    if activation in config.GATED_ACTIVATIONS:
        dg, du = act_backward(da, act)
        dx_g, *grads["gate"] = ref.linear_backward(dg, gate)
        dx_u, *grads["up"] = ref.linear_backward(du, up)
        return out, dx_g + dx_u, grads
    dx, *grads["up"] = ref.linear_backward(act_backward(da, act), up)
    return out, dx, grads


def _compare(got, want, dtype):
    (out, dx, grads), (out_r, dx_r, grads_r) = got, want
    for name, a, b in (("out", out, out_r), ("dx", dx, dx_r)):
        assert a.dtype == dtype and a.shape == b.shape, name
        assert rel_err(a, b) <= TOL[dtype], name
    assert set(grads) == set(grads_r)
    for name, (dw, db) in grads.items():
        assert rel_err(dw, grads_r[name][0]) <= TOL[dtype], f"{name} dw"
        assert (db is None) == (grads_r[name][1] is None), f"{name} db"
        if db is not None:
            assert db.dtype == dtype and rel_err(db, grads_r[name][1]) <= TOL[dtype], name


@pytest.mark.parametrize("module", [fast_ffn, ref_ffn], ids=["kernel", "reference"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(21, 6), (1301, 6), (3, 150, 6)])  # reference path; chunks
def test_relu_ffn_matches_the_pieces(dtype, shape, module):
    """Forward and all four gradients against linear -> ReLU -> linear of ``functional``.

    The ReLU cuts about half of h to exact zeros: they must be the same entries, +0 as from
    np.maximum, and the gradient through them exactly zero."""
    x, weights, g = _problem(shape, 9, dtype)
    out, cache = module.feed_forward_forward(x, weights, "relu")
    _compare((out, *module.feed_forward_backward(g, cache)), _pieces(x, weights, "relu", g),
             dtype)
    h_want = np.maximum(ref.linear_forward(x, *weights["up"])[0], 0)
    assert cache.act.shape == h_want.shape
    assert 0.3 < (cache.act == 0).mean() < 0.7 and np.array_equal(cache.act == 0, h_want == 0)
    assert not np.signbit(cache.act).any()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("activation", config.ACTIVATIONS)
@pytest.mark.parametrize("module", [fast_ffn, ref_ffn], ids=["kernel", "reference"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_every_activation_matches_the_pieces(dtype, module, activation, bias):
    x, weights, g = _problem((2, 150, 6), 9, dtype, activation, bias)  # 300 rows: chunks
    out, cache = module.feed_forward_forward(x, weights, activation)
    assert type(cache) is ref_ffn.FeedForwardCache and cache.activation == activation
    _compare((out, *module.feed_forward_backward(g, cache)),
             _pieces(x, weights, activation, g), dtype)


def test_the_one_pass_kernel_is_bit_for_bit_the_numba_pieces():
    """With ReLU and biases the kernel gives the very numbers of the linear and ReLU kernels
    composed (what the network without the one pass runs)."""
    x, weights, g = _problem((2, 150, 6), 9, np.float32)
    out, cache = fast_ffn.feed_forward_forward(x, weights, "relu")
    dx, grads = fast_ffn.feed_forward_backward(g, cache)
    pair = fast_ffn._activation_pair("relu")
    out_c, cache_c = ref_ffn.compose_forward(x, weights, "relu",
                                             fast_ffn.fast_linear.linear_forward, pair)
    dx_c, grads_c = ref_ffn.compose_backward(g, cache_c, fast_ffn.fast_linear.linear_backward,
                                             pair)
    np.testing.assert_array_equal(out, out_c)
    np.testing.assert_array_equal(dx, dx_c)
    for name in grads:
        for a, b in zip(grads[name], grads_c[name], strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("activation", fast_ffn._MADE_AGAIN)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_gelu_network_makes_its_activation_again_with_the_same_bits(activation, dtype):
    """The cache leaves out a = gelu(h) (``down.x``), a third of what the network keeps; the
    backward makes it again: the very numbers of the pieces composed with a kept."""
    x, weights, g = _problem((2, 150, 6), 9, dtype, activation)
    out, cache = fast_ffn.feed_forward_forward(x, weights, activation)
    assert cache.down.x is None and cache.act.shape == (2, 150, 9)
    dx, grads = fast_ffn.feed_forward_backward(g, cache)
    pair = fast_ffn._activation_pair(activation)
    out_c, cache_c = ref_ffn.compose_forward(x, weights, activation,
                                             fast_ffn.fast_linear.linear_forward, pair)
    assert cache_c.down.x is not None  # the control: composed as the reference, a is kept
    dx_c, grads_c = fast_ffn.feed_forward_backward(g, cache_c)  # a reference-shaped cache
    np.testing.assert_array_equal(out, out_c)
    np.testing.assert_array_equal(dx, dx_c)
    for name in grads:
        for a, b in zip(grads[name], grads_c[name], strict=True):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="got x NoneType"):  # not the reference's cache
        ref_ffn.feed_forward_backward(g, cache)


@pytest.mark.parametrize("shape", [(21, 6), (1301, 6)])
def test_relu_ffn_keeps_nan(shape):
    x, weights, _ = _problem(shape, 9, np.float64)
    x[4, 0] = np.nan
    out, cache = fast_ffn.feed_forward_forward(x, weights, "relu")
    assert np.isnan(out[4]).all() and not np.isnan(np.delete(out, 4, axis=0)).any()
    assert np.isnan(cache.act[4]).all()


@pytest.mark.parametrize("activation", ["relu", *fast_ffn._MADE_AGAIN])  # one pass; made again
def test_feedforward_on_the_kernel_passes_gradcheck_and_matches_numpy(activation):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 150, 6))  # 300 rows: the kernel's chunks
    ffns = [FeedForward(6, 10, activation, rng=np.random.default_rng(8), backend=backend)
            for backend in ("numpy", "numba")]
    assert ffns[0].ops.feed_forward_forward is ref_ffn.feed_forward_forward
    assert ffns[1].ops.feed_forward_forward is fast_ffn.feed_forward_forward
    g = rng.standard_normal(x.shape)
    outs = [f.forward(x) for f in ffns]
    dxs = [f.backward(g) for f in ffns]
    assert rel_err(outs[1], outs[0]) <= 1e-12 and rel_err(dxs[1], dxs[0]) <= 1e-12
    for name, want in ffns[0].grads.items():
        assert rel_err(ffns[1].grads[name], want) <= 1e-12, name
    fresh = FeedForward(6, 10, activation, rng=np.random.default_rng(8), backend="numba")
    assert_gradcheck(check_module(fresh, {"x": x}), fresh)


def test_gradcheck_catches_a_backward_that_forgets_the_relu(monkeypatch):
    """Negative control: the reference composition with the ReLU's backward left out must
    fail."""
    rng = np.random.default_rng(4)
    ffn = FeedForward(6, 10, "relu", rng=rng, backend="numpy")
    x = rng.standard_normal((2, 150, 6))
    assert check_module(ffn, {"x": x}).ok(1e-6)  # the composition itself is right
    monkeypatch.setattr(ref_act, "relu_backward", lambda dout, x: dout)
    assert not check_module(ffn, {"x": x}).ok(1e-6)


@pytest.mark.parametrize("module", [fast_ffn, ref_ffn], ids=["kernel", "reference"])
def test_feed_forward_rejects_bad_input(module):
    x, weights, g = _problem((300, 6), 9, np.float64)
    with pytest.raises(ValueError, match="last"):
        module.feed_forward_forward(x[:, :5], weights, "relu")
    with pytest.raises(ValueError, match="weights"):
        module.feed_forward_forward(x, {**weights, "down": (weights["down"][0].T, None)},
                                    "relu")
    with pytest.raises(ValueError, match="weights must be a dict"):
        module.feed_forward_forward(x, weights, "swiglu")  # no gate
    with pytest.raises(ValueError, match="activation"):
        module.feed_forward_forward(x, weights, "tanh")
    with pytest.raises(ValueError):
        module.feed_forward_forward(x.astype(int), weights, "relu")
    _, cache = module.feed_forward_forward(x, weights, "relu")
    with pytest.raises(ValueError, match="dout"):
        module.feed_forward_backward(g[:10], cache)

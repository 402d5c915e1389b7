"""Every functional forward/backward pair against central differences (float64, random G)."""

import math

import numpy as np
import pytest

from numpy_transformer import functional as F
from numpy_transformer.config import ELEMENTWISE_ACTIVATIONS
from numpy_transformer.gradcheck import check_op

TOL = 1e-6


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def test_linear(rng):
    x, w, b = rng.normal(size=(2, 3, 5)), rng.normal(size=(5, 4)), rng.normal(size=4)
    assert check_op(F.linear_forward, F.linear_backward, {"x": x, "w": w, "b": b}).ok(TOL)


def test_linear_without_bias(rng):
    x, w = rng.normal(size=(2, 3, 5)), rng.normal(size=(5, 4))
    report = check_op(lambda x, w: F.linear_forward(x, w),
                      lambda d, c: F.linear_backward(d, c)[:2], {"x": x, "w": w})
    assert report.ok(TOL)


@pytest.mark.parametrize("bias", [True, False])
def test_linear_heads(rng, bias):
    """Two projections of one x, two heads each: dx sums both paths."""
    inputs = {"x": rng.normal(size=(2, 3, 5)), "wq": rng.normal(size=(5, 4)),
              "wk": rng.normal(size=(5, 4))}
    if bias:
        inputs |= {"bq": rng.normal(size=4), "bk": rng.normal(size=4)}

    def forward(x, wq, wk, *bs):
        return F.linear_heads_forward(x, (wq, wk), bs or None, 2)

    def backward(dys, cache):
        dx, dws, dbs = F.linear_heads_backward(dys, cache)
        return (dx, *dws, *(dbs or ()))

    assert check_op(forward, backward, inputs).ok(TOL)


def test_embedding_accumulates_repeated_ids(rng):
    table = rng.normal(size=(6, 4))
    ids = np.array([[1, 1, 3], [5, 1, 0]])
    report = check_op(lambda t: F.embedding_forward(ids, t), F.embedding_backward, {"t": table})
    assert report.ok(TOL)
    g = rng.normal(size=(2, 3, 4))
    dtable = F.embedding_backward(g, F.embedding_forward(ids, table)[1])
    np.testing.assert_allclose(dtable[1], g[0, 0] + g[0, 1] + g[1, 1])
    assert not dtable[2].any()


@pytest.mark.parametrize("name", ELEMENTWISE_ACTIVATIONS)
def test_activation(rng, name):
    x = rng.normal(size=(3, 4, 5)) * 2
    fwd, bwd = getattr(F, f"{name}_forward"), getattr(F, f"{name}_backward")
    assert check_op(fwd, bwd, {"x": x}).ok(TOL)


def test_two_gelus_are_different_functions(rng):
    x = rng.normal(size=1000) * 3
    exact, approx = F.gelu_forward(x)[0], F.gelu_tanh_forward(x)[0]
    assert 1e-5 < np.abs(exact - approx).max() < 1e-2
    # the exact derivative must not be the tanh one (the bug of mixing them up)
    g = rng.normal(size=x.shape)
    d_exact = F.gelu_backward(g, F.gelu_forward(x)[1])
    d_tanh = F.gelu_tanh_backward(g, F.gelu_tanh_forward(x)[1])
    assert np.abs(d_exact - d_tanh).max() > 1e-5


def test_erf_is_math_erf_rounded_once(rng):
    """The reference's erf: Python's math.erf of each entry in float64, rounded to x's dtype;
    known values, odd symmetry and the limits."""
    for dtype in (np.float32, np.float64):
        x = (rng.normal(size=500) * 3).astype(dtype)
        got = F.erf(x)
        assert got.dtype == dtype
        want = np.array([math.erf(float(v)) for v in x]).astype(dtype)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(F.erf(-x), -got)
    np.testing.assert_allclose(F.erf(np.array([0.0, 0.5, 1.0, 2.0, 40.0, -40.0])),
                               [0.0, 0.5204998778130465, 0.8427007929497149,
                                0.9953222650189527, 1.0, -1.0], rtol=1e-15, atol=0)


def test_swiglu(rng):
    gate, up = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 3, 4))
    assert check_op(F.swiglu_forward, F.swiglu_backward, {"gate": gate, "up": up}).ok(TOL)


def test_dropout_reuses_its_mask_and_is_identity_in_eval(rng):
    x = rng.normal(size=(4, 50))
    out, keep = F.dropout_forward(x, 0.3, np.random.default_rng(0))
    assert 0.2 < (out == 0).mean() < 0.4
    np.testing.assert_allclose(out[out != 0], x[out != 0] / 0.7)
    g = rng.normal(size=x.shape)
    np.testing.assert_array_equal(F.dropout_backward(g, keep), g * keep)
    # with the mask frozen, dropout is linear: the gradcheck must pass
    report = check_op(lambda x: F.dropout_forward(x, 0.3, np.random.default_rng(0)),
                      F.dropout_backward, {"x": x.copy()})
    assert report.ok(TOL)
    out_eval, cache = F.dropout_forward(x, 0.3, np.random.default_rng(0), training=False)
    assert out_eval is x and cache is None
    with pytest.raises(ValueError, match="1.5"):
        F.dropout_forward(x, 1.5, np.random.default_rng(0))


def test_softmax(rng):
    x = rng.normal(size=(2, 3, 7))
    assert check_op(F.softmax_forward, F.softmax_backward, {"x": x}).ok(TOL)
    np.testing.assert_allclose(F.softmax_forward(x)[0].sum(-1), 1.0, rtol=0, atol=1e-15)


def test_softmax_is_stable_for_huge_logits():
    y = F.softmax_forward(np.array([[1000.0, 1000.0, -1000.0]]))[0]
    np.testing.assert_allclose(y, [[0.5, 0.5, 0.0]])


def _ce(targets, **kw):
    def forward(logits):
        loss, cache = F.cross_entropy_forward(logits, targets, **kw)
        return np.array(loss), cache
    return forward


@pytest.mark.parametrize("kind", ["plain", "ignore_index", "mask"])
def test_cross_entropy(rng, kind):
    logits = rng.normal(size=(2, 4, 6))
    targets = rng.integers(0, 6, size=(2, 4))
    kw = {}
    if kind == "ignore_index":
        targets[0, 1] = targets[1, 3] = -100
    if kind == "mask":
        kw["mask"] = rng.random((2, 4)) < 0.6
        kw["mask"][0, 0] = True
    report = check_op(_ce(targets, **kw), F.cross_entropy_backward, {"logits": logits})
    assert report.ok(TOL)
    # the value: mean of -log p(target) over the counted targets, computed independently
    counted = (targets != -100) & kw.get("mask", True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, np.where(counted, targets, 0)[..., None], -1)[..., 0]
    loss, _ = F.cross_entropy_forward(logits, targets, **kw)
    assert loss == pytest.approx(-picked[counted].mean(), rel=1e-12)


def test_cross_entropy_bad_input(rng):
    logits = rng.normal(size=(2, 3, 5))
    with pytest.raises(ValueError, match="7"):
        F.cross_entropy_forward(logits, np.full((2, 3), 7))
    with pytest.raises(ValueError, match="float64"):
        F.cross_entropy_forward(logits, np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"\(2, 2\)"):
        F.cross_entropy_forward(logits, np.zeros((2, 2), dtype=int))
    with pytest.raises(ValueError, match="no counted target"):
        F.cross_entropy_forward(logits, np.full((2, 3), -100))


def test_layer_norm(rng):
    x, w, b = rng.normal(size=(2, 3, 6)) * 3 + 1, rng.normal(size=6), rng.normal(size=6)
    assert check_op(F.layer_norm_forward, F.layer_norm_backward, {"x": x, "w": w, "b": b}).ok(TOL)


def test_rms_norm(rng):
    x, w = rng.normal(size=(2, 3, 6)), rng.normal(size=6)
    assert check_op(F.rms_norm_forward, F.rms_norm_backward, {"x": x, "w": w}).ok(TOL)


def test_layer_norm_token_does_not_depend_on_batchmates(rng):
    x = rng.normal(size=(3, 4, 8))
    w, b = rng.normal(size=8), rng.normal(size=8)
    out = F.layer_norm_forward(x, w, b)[0]
    x2 = x.copy()
    x2[1:] *= 7.0  # every other batch element changes
    x2[0, 1:] += 3.0  # and so do the token's neighbours in its own sequence
    np.testing.assert_array_equal(F.layer_norm_forward(x2, w, b)[0][0, 0], out[0, 0])
    # the normalised token has zero mean and (almost) unit variance, before the affine
    xh = F.layer_norm_forward(x, np.ones(8), np.zeros(8))[0]
    np.testing.assert_allclose(xh.mean(-1), 0, atol=1e-15)
    np.testing.assert_allclose(xh.var(-1), 1, atol=1e-4)


def test_rope_is_a_rotation_and_backward_is_its_inverse(rng):
    x = rng.normal(size=(2, 2, 5, 6))
    cos, sin = F.rope_tables(5, 6)
    report = check_op(lambda x: (F.rope_forward(x, cos, sin), None),
                      lambda d, _: F.rope_backward(d, cos, sin), {"x": x})
    assert report.ok(TOL)
    y = F.rope_forward(x, cos, sin)
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1))
    np.testing.assert_allclose(F.rope_backward(y, cos, sin), x, atol=1e-14)


def test_rope_score_depends_only_on_offset(rng):
    q, k = rng.normal(size=8), rng.normal(size=8)
    cos, sin = F.rope_tables(64, 8)

    def score(p, s):
        rq = F.rope_forward(q[None, None, None], cos[p:p + 1], sin[p:p + 1])
        rk = F.rope_forward(k[None, None, None], cos[s:s + 1], sin[s:s + 1])
        return float((rq * rk).sum())

    for offset in (0, 3, 17):
        scores = [score(p, p + offset) for p in (0, 5, 20, 40)]
        np.testing.assert_allclose(scores, scores[0], rtol=1e-12)
    assert abs(score(0, 3) - score(0, 4)) > 1e-6


def test_sinusoidal_table_norm_and_rotation_identity():
    d = 32
    table = F.sinusoidal_table(100, d)
    np.testing.assert_allclose(np.linalg.norm(table, axis=1), np.sqrt(d / 2), rtol=1e-12)
    assert table[3, 4] == pytest.approx(np.sin(3 * 10000 ** (-4 / d)))
    assert table[3, 5] == pytest.approx(np.cos(3 * 10000 ** (-4 / d)))
    # PE(p + k) = R_k PE(p): each (sin, cos) pair rotates by k theta_i, whatever p is
    theta = 10000 ** (-np.arange(0, d, 2) / d)
    for p, k in ((0, 1), (10, 7), (50, 30)):
        c, s = np.cos(k * theta), np.sin(k * theta)
        sin_p, cos_p = table[p, 0::2], table[p, 1::2]
        np.testing.assert_allclose(table[p + k, 0::2], sin_p * c + cos_p * s, atol=1e-12)
        np.testing.assert_allclose(table[p + k, 1::2], cos_p * c - sin_p * s, atol=1e-12)


def test_odd_widths_are_refused():
    with pytest.raises(ValueError, match="7"):
        F.sinusoidal_table(10, 7)
    with pytest.raises(ValueError, match="5"):
        F.rope_tables(10, 5)


def test_alibi_bias():
    slopes = F.alibi_slopes(8)
    np.testing.assert_allclose(slopes, 2.0 ** (-np.arange(1, 9)))
    assert F.alibi_slopes(6).shape == (6,)
    bias = F.alibi_bias(8, 4, 4)
    assert bias.shape == (1, 8, 4, 4)
    np.testing.assert_allclose(bias[0, 0, 3], -0.5 * np.array([3, 2, 1, 0]))
    # decoding: the single query is the last position
    np.testing.assert_allclose(F.alibi_bias(8, 1, 4)[0, :, 0], bias[0, :, 3])


def test_dtypes_follow_the_input(rng):
    x32 = rng.normal(size=(2, 3, 4)).astype(np.float32)
    w, b = np.ones(4, np.float32), np.zeros(4, np.float32)
    assert F.layer_norm_forward(x32, w, b)[0].dtype == np.float32
    assert F.rms_norm_forward(x32, w)[0].dtype == np.float32
    assert F.gelu_forward(x32)[0].dtype == np.float32
    assert F.gelu_tanh_forward(x32)[0].dtype == np.float32
    assert F.softmax_forward(x32)[0].dtype == np.float32
    assert F.linear_forward(x32, np.ones((4, 2), np.float32))[0].dtype == np.float32


def test_bad_input_names_the_value(rng):
    x = rng.normal(size=(2, 3, 4))
    with pytest.raises(ValueError, match=r"last dimension 4"):
        F.linear_forward(x, rng.normal(size=(5, 2)))
    with pytest.raises(ValueError, match="int64"):
        F.linear_forward(np.ones((2, 4), dtype=np.int64), rng.normal(size=(4, 2)))
    with pytest.raises(ValueError, match="id 9"):
        F.embedding_forward(np.array([[1, 9]]), rng.normal(size=(5, 3)))
    with pytest.raises(ValueError, match="float64"):
        F.embedding_forward(np.array([[1.0, 2.0]]), rng.normal(size=(5, 3)))
    with pytest.raises(ValueError, match="last dimension"):
        F.layer_norm_forward(x, np.ones(5), np.zeros(5))

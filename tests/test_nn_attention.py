"""MultiHeadAttention: gradients for every mask kind, RoPE, ALiBi, self and cross; invariants."""

import numpy as np
import pytest
from _nn_helpers import assert_gradcheck

from numpy_transformer import functional as F
from numpy_transformer.gradcheck import check_direction, check_module
from numpy_transformer.nn import MultiHeadAttention, SinusoidalPositions

B, T, C, H = 2, 5, 8, 2
T_CTX = 4  # cross-attention: the context is shorter than the queries' sequence
MASK_KINDS = ["none", "causal", "padding", "causal+padding", "arbitrary"]


@pytest.fixture
def rng():
    return np.random.default_rng(99)


def self_masks(rng, t=T):
    causal = F.causal_mask(t)
    padding = F.key_padding_mask(np.array([t, 3]), t)
    arbitrary = rng.random((B, 1, t, t)) < 0.6
    arbitrary[1, 0, 2] = False  # a query that may attend nothing
    return {"none": None, "causal": causal, "padding": padding,
            "causal+padding": F.combine_masks(causal, padding), "arbitrary": arbitrary}


def cross_masks(rng, t_q=T, t_k=T_CTX):
    padding = F.key_padding_mask(np.array([t_k, 2]), t_k)
    arbitrary = rng.random((B, H, t_q, t_k)) < 0.6
    arbitrary[0, 1, 3] = False
    # "causal" for cross-attention with T_q <= T_k: query i is one of the last T_q positions
    causal = F.causal_mask(t_k - 1, t_k)
    return {"none": None, "padding": padding, "arbitrary": arbitrary, "causal": causal,
            "causal+padding": F.combine_masks(causal, padding)}


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("positions", ["none", "rope", "alibi"])
def test_self_attention_gradients(rng, kind, positions):
    attn = MultiHeadAttention(C, H, rope=positions == "rope", alibi=positions == "alibi",
                              max_len=T, rng=rng)
    x = rng.normal(size=(B, T, C))
    report = check_module(attn, {"x": x}, mask=self_masks(rng)[kind])
    assert_gradcheck(report, attn)


@pytest.mark.parametrize("kind", MASK_KINDS)
def test_cross_attention_gradients(rng, kind):
    attn = MultiHeadAttention(C, H, rng=rng)
    mask = cross_masks(rng)[kind]
    t_q = T_CTX - 1 if kind.startswith("causal") else T
    x, context = rng.normal(size=(B, t_q, C)), rng.normal(size=(B, T_CTX, C))
    report = check_module(attn, {"x": x, "context": context}, mask=mask)
    assert_gradcheck(report, attn)


def test_cross_attention_returns_both_gradients(rng):
    attn = MultiHeadAttention(C, H, rng=rng)
    x, context = rng.normal(size=(B, T, C)), rng.normal(size=(B, T_CTX, C))
    out = attn.forward(x, context)
    dx, dcontext = attn.backward(rng.normal(size=out.shape))
    assert out.shape == dx.shape == x.shape and dcontext.shape == context.shape


def test_random_direction_check(rng):
    attn = MultiHeadAttention(C, H, rope=True, max_len=T, rng=rng)
    report = check_direction(attn, {"x": rng.normal(size=(B, T, C))}, mask=F.causal_mask(T))
    assert report.ok(1e-6), str(report)


def test_fully_masked_query_gives_bias_output_and_no_gradient_but_bo(rng):
    attn = MultiHeadAttention(C, H, rng=rng)
    x = rng.normal(size=(B, T, C))
    mask = np.ones((B, 1, T, T), dtype=bool)
    mask[1, 0, 2] = False  # query 2 of sequence 1 may attend nothing, in every head
    out = attn.forward(x, mask=mask)
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out[1, 2], attn.params["bo"])  # zero attention, then + bo
    dout = np.zeros_like(out)
    dout[1, 2] = rng.normal(size=C)  # gradient only from the fully masked query
    dx = attn.backward(dout)
    assert np.isfinite(dx).all() and not dx.any()
    for name, grad in attn.grads.items():
        if name == "bo":
            np.testing.assert_array_equal(grad, dout[1, 2])
        else:
            assert not grad.any(), name


def test_keep_weights_for_plotting(rng):
    attn = MultiHeadAttention(C, H, keep_weights=True, rng=rng)
    attn.forward(rng.normal(size=(B, T, C)), mask=F.causal_mask(T))
    w = attn.weights
    assert w.shape == (B, H, T, T)
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-15)
    assert not w[:, :, ~F.causal_mask(T)].any()  # nothing above the diagonal
    assert MultiHeadAttention(C, H).weights is None  # off by default


def test_head_count_does_not_change_the_parameter_count():
    assert {MultiHeadAttention(C, h).num_parameters() for h in (1, 2, 4, 8)} == {4 * C * C + 4 * C}


@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
def test_without_biases(rng, cross):
    attn = MultiHeadAttention(C, H, rope=not cross, max_len=T, bias=False, rng=rng)
    assert set(attn.params) == {"wq", "wk", "wv", "wo"}
    assert attn.num_parameters() == 4 * C * C
    inputs = {"x": rng.normal(size=(B, T, C))}
    if cross:
        inputs["context"] = rng.normal(size=(B, T_CTX, C))
    mask = None if cross else F.causal_mask(T)
    assert_gradcheck(check_module(attn, inputs, mask=mask), attn)


def test_bare_self_attention_is_permutation_equivariant_and_positions_break_it(rng):
    attn = MultiHeadAttention(C, H, rng=rng)
    x = rng.normal(size=(1, T, C))
    perm = rng.permutation(T)
    out, out_p = attn.forward(x), attn.forward(x[:, perm])
    assert np.abs(out_p - out[:, perm]).max() < 1e-14
    # with sinusoidal positions added to the tokens, a reordering changes the answer
    pos = SinusoidalPositions(T, C)
    out, out_p = attn.forward(pos.forward(x)), attn.forward(pos.forward(x[:, perm]))
    assert np.abs(out_p - out[:, perm]).max() > 1e-3
    # and RoPE breaks it from inside the attention
    rope = MultiHeadAttention(C, H, rope=True, max_len=T, rng=np.random.default_rng(0))
    out, out_p = rope.forward(x), rope.forward(x[:, perm])
    assert np.abs(out_p - out[:, perm]).max() > 1e-3


@pytest.mark.parametrize("kind", MASK_KINDS)
def test_numba_backend_matches_numpy(rng, kind):
    pytest.importorskip("numba")
    x = rng.normal(size=(B, T, C))
    mask = self_masks(rng)[kind]
    g = rng.normal(size=(B, T, C))
    results = []
    for backend in ("numpy", "numba"):
        attn = MultiHeadAttention(C, H, alibi=True, bias=kind != "causal", backend=backend,
                                  rng=np.random.default_rng(5))
        out = attn.forward(x, mask=mask)
        dx = attn.backward(g)
        results.append((out, dx, attn.grads))
    (out0, dx0, g0), (out1, dx1, g1) = results
    np.testing.assert_allclose(out1, out0, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(dx1, dx0, rtol=1e-11, atol=1e-12)
    for name in g0:
        np.testing.assert_allclose(g1[name], g0[name], rtol=1e-11, atol=1e-12, err_msg=name)


def test_float32_in_float32_out(rng):
    attn = MultiHeadAttention(C, H, rope=True, max_len=T, dtype=np.float32, rng=rng)
    x = rng.normal(size=(B, T, C)).astype(np.float32)
    out = attn.forward(x, mask=F.causal_mask(T))
    assert out.dtype == np.float32 and attn.backward(out).dtype == np.float32
    assert all(g.dtype == np.float32 for g in attn.grads.values())


def test_bad_construction():
    with pytest.raises(ValueError, match="heads=3 does not divide width=8"):
        MultiHeadAttention(8, 3)
    with pytest.raises(ValueError, match="even head width"):
        MultiHeadAttention(6, 2, rope=True, max_len=4)  # head width 3
    with pytest.raises(ValueError, match="max_len"):
        MultiHeadAttention(8, 2, rope=True)
    with pytest.raises(ValueError, match="backend"):
        MultiHeadAttention(8, 2, backend="cuda")


def test_bad_inputs(rng):
    attn = MultiHeadAttention(C, H, rng=rng)
    x = rng.normal(size=(B, T, C))
    with pytest.raises(ValueError, match="context has last dimension 6"):
        attn.forward(x, rng.normal(size=(B, T_CTX, 6)))
    with pytest.raises(ValueError, match="context batch"):
        attn.forward(x, rng.normal(size=(B + 1, T_CTX, C)))
    with pytest.raises(ValueError, match="x has last dimension"):
        attn.forward(rng.normal(size=(B, T, C + 1)))
    with pytest.raises(ValueError, match="does not broadcast"):
        attn.forward(x, mask=np.ones((T, T + 1), dtype=bool))
    for flag in ("rope", "alibi"):
        positional = MultiHeadAttention(C, H, max_len=T, rng=rng, **{flag: True})
        with pytest.raises(ValueError, match="cross-attention"):
            positional.forward(x, rng.normal(size=(B, T_CTX, C)))
    rope = MultiHeadAttention(C, H, rope=True, max_len=T - 1, rng=rng)
    with pytest.raises(ValueError, match="exceeds max_len"):
        rope.forward(x)

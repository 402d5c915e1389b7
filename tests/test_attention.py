"""The NumPy reference attention: gradients, masks, fully masked rows and the chapters' audits."""

import numpy as np
import pytest

from numpy_transformer import functional as F
from numpy_transformer.gradcheck import check_op

TOL = 1e-6
B, H, TQ, TK, D = 2, 3, 5, 6, 4


def qkv(rng, tq=TQ, tk=TK):
    return (rng.normal(size=(B, H, tq, D)), rng.normal(size=(B, H, tk, D)),
            rng.normal(size=(B, H, tk, D)))


def masks(rng):
    causal = F.causal_mask(TQ, TK)
    padding = F.key_padding_mask(np.array([TK, 3]), TK)
    arbitrary = rng.random((B, 1, TQ, TK)) < 0.7
    arbitrary[1, 0, 2] = False  # a fully masked query row
    return {"none": None, "causal": causal, "padding": padding,
            "causal+padding": F.combine_masks(causal, padding), "arbitrary": arbitrary}


@pytest.mark.parametrize("kind", ["none", "causal", "padding", "causal+padding", "arbitrary"])
@pytest.mark.parametrize("alibi", [False, True])
def test_sdpa_gradients(kind, alibi):
    rng = np.random.default_rng(7)
    q, k, v = qkv(rng)
    mask = masks(rng)[kind]
    bias = F.alibi_bias(H, TQ, TK) if alibi else None
    report = check_op(lambda q, k, v: F.sdpa_forward(q, k, v, mask, bias), F.sdpa_backward,
                      {"q": q, "k": k, "v": v})
    assert report.ok(TOL), str(report)


def test_fully_masked_row_gives_zero_output_and_zero_gradient():
    rng = np.random.default_rng(0)
    q, k, v = qkv(rng)
    mask = masks(rng)["arbitrary"]
    out, cache = F.sdpa_forward(q, k, v, mask)
    assert np.isfinite(out).all()
    assert not out[1, :, 2].any()
    dq, dk, dv = F.sdpa_backward(rng.normal(size=out.shape), cache)
    assert np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()
    assert not dq[1, :, 2].any()


def test_masked_keys_get_zero_gradient():
    rng = np.random.default_rng(1)
    q, k, v = qkv(rng)
    mask = F.key_padding_mask(np.array([TK, 3]), TK)
    out, cache = F.sdpa_forward(q, k, v, mask)
    _, dk, dv = F.sdpa_backward(rng.normal(size=out.shape), cache)
    assert not dk[1, :, 3:].any() and not dv[1, :, 3:].any()


def test_rows_sum_to_one_and_causal_triangle():
    rng = np.random.default_rng(2)
    q, k, _ = qkv(rng, TQ, TQ)
    p = F.attention_weights(q, k, F.causal_mask(TQ))
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-15)
    assert not np.triu(np.ones((TQ, TQ)), 1)[None, None].astype(bool).__and__(p > 0).any()


def test_causal_outputs_ignore_the_future():
    rng = np.random.default_rng(3)
    q, k, v = qkv(rng, TQ, TQ)
    mask = F.causal_mask(TQ)
    out = F.sdpa_forward(q, k, v, mask)[0]
    t = 3
    q2, k2, v2 = q.copy(), k.copy(), v.copy()
    for x in (q2, k2, v2):
        x[:, :, t:] = rng.normal(size=x[:, :, t:].shape)
    out2 = F.sdpa_forward(q2, k2, v2, mask)[0]
    np.testing.assert_array_equal(out2[:, :, :t], out[:, :, :t])  # bit-identical
    assert np.abs(out2[:, :, t:] - out[:, :, t:]).max() > 1e-3


def test_bare_self_attention_is_permutation_equivariant():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(1, 1, 7, D))
    perm = rng.permutation(7)
    out = F.sdpa_forward(x, x, x)[0]
    out_p = F.sdpa_forward(x[:, :, perm], x[:, :, perm], x[:, :, perm])[0]
    assert np.abs(out_p - out[:, :, perm]).max() < 1e-14


def test_cross_attention_shapes_and_default_scale():
    rng = np.random.default_rng(5)
    q, k, v = qkv(rng, 2, 9)
    out, cache = F.sdpa_forward(q, k, v)
    assert out.shape == (B, H, 2, D) and cache.scale == pytest.approx(1 / np.sqrt(D))


def test_float32_in_float32_out():
    rng = np.random.default_rng(6)
    q, k, v = (x.astype(np.float32) for x in qkv(rng))
    out, cache = F.sdpa_forward(q, k, v, F.causal_mask(TQ, TK))
    assert out.dtype == np.float32
    assert all(g.dtype == np.float32 for g in F.sdpa_backward(out, cache))


def test_bad_input():
    rng = np.random.default_rng(8)
    q, k, v = qkv(rng)
    with pytest.raises(ValueError, match="does not broadcast"):
        F.sdpa_forward(q, k, v, np.ones((TQ, TQ), dtype=bool))
    with pytest.raises(ValueError, match="boolean"):
        F.sdpa_forward(q, k, v, np.ones((TQ, TK)))
    with pytest.raises(ValueError, match="same shape"):
        F.sdpa_forward(q, k, v[:, :, :2])
    with pytest.raises(ValueError, match="head width"):
        F.sdpa_forward(q, k[..., :2], v[..., :2])
    with pytest.raises(ValueError, match="int64"):
        F.sdpa_forward(q.astype(np.int64), k, v)


def test_mask_conventions():
    torch_ignore = np.array([[False, True, True]])  # nn.MultiheadAttention: True = masked out
    np.testing.assert_array_equal(F.from_torch_ignore_mask(torch_ignore), [[True, False, False]])
    np.testing.assert_array_equal(F.causal_mask(2, 3), [[True, True, False], [True, True, True]])

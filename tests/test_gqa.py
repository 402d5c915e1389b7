"""Grouped-query attention: k and v with H_kv heads, each read by G = H / H_kv query heads.

The reference pair by finite differences (random upstream gradients, every mask kind), with a
negative control: a backward that does not sum each kv head's group fails the check. The numba
kernel against the reference; the module, the blocks and a model on both backends; cached
decoding; the config's refusals; and that GQA is exactly multi-head attention with every kv
head's weights repeated for its group.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _run_helpers import TINY, run_cli, small_text

from numpy_transformer import functional as F
from numpy_transformer import nn
from numpy_transformer.checkpoint import load_checkpoint
from numpy_transformer.functional import attention as ref
from numpy_transformer.gradcheck import check_module, check_op
from numpy_transformer.kernels import attention as ker
from numpy_transformer.memory import parameter_count
from numpy_transformer.nn.decoding import new_cache

TOL = 1e-6  # finite differences, float64
KERNEL_TOL = {np.float64: 1e-12, np.float32: 1e-5}  # kernel against reference, relative
B, H, T, D = 2, 4, 6, 3


def grouped_qkv(rng, kv_heads: int, t_q: int = T, t_k: int = T, dtype=np.float64):
    return (rng.normal(size=(B, H, t_q, D)).astype(dtype),
            rng.normal(size=(B, kv_heads, t_k, D)).astype(dtype),
            rng.normal(size=(B, kv_heads, t_k, D)).astype(dtype))


def mask_kinds(rng, t_q: int = T, t_k: int = T) -> dict:
    causal = F.causal_mask(t_q, t_k)
    padding = F.key_padding_mask(np.array([t_k, 3]), t_k)
    arbitrary = rng.random((B, H, t_q, t_k)) < 0.6
    arbitrary[1, 3, 2] = False  # a fully masked query row
    return {"none": None, "causal": causal, "padding": padding,
            "causal+padding": F.combine_masks(causal, padding), "arbitrary": arbitrary}


KINDS = ["none", "causal", "padding", "causal+padding", "arbitrary"]


@pytest.mark.parametrize("kv_heads", [2, 1])
@pytest.mark.parametrize("kind", KINDS)
def test_grouped_query_gradients(kind, kv_heads):
    rng = np.random.default_rng(3)
    q, k, v = grouped_qkv(rng, kv_heads)
    mask, bias = mask_kinds(rng)[kind], F.alibi_bias(H, T, T)
    report = check_op(lambda q, k, v: F.sdpa_forward(q, k, v, mask, bias), F.sdpa_backward,
                      {"q": q, "k": k, "v": v})
    assert report.ok(TOL), str(report)


def test_a_backward_that_does_not_sum_the_group_fails_the_check():
    """Negative control: dk, dv of each kv head taken from its first query head only."""
    rng = np.random.default_rng(4)
    q, k, v = grouped_qkv(rng, 2)

    def first_of_group(dout, cache):
        heads = cache.q.shape[1]
        repeated = cache._replace(k=ref.repeat_kv(cache.k, heads),
                                  v=ref.repeat_kv(cache.v, heads))
        dq, dk, dv = F.sdpa_backward(dout, repeated)  # (B, H, T, D) each
        group = heads // cache.k.shape[1]
        return dq, dk[:, ::group], dv[:, ::group]

    forward = lambda q, k, v: F.sdpa_forward(q, k, v, F.causal_mask(T))  # noqa: E731
    assert check_op(forward, F.sdpa_backward, {"q": q, "k": k, "v": v}).ok(TOL)
    wrong = check_op(forward, first_of_group, {"q": q, "k": k, "v": v})
    assert not wrong.ok(TOL), str(wrong)


def test_grouped_query_is_multi_head_with_repeated_keys_and_values():
    """Query head h reads kv head h // G: the order of ``torch.repeat_interleave``."""
    rng = np.random.default_rng(5)
    q, k, v = grouped_qkv(rng, 2)
    out, cache = F.sdpa_forward(q, k, v, F.causal_mask(T))
    k4, v4 = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)
    out4, cache4 = F.sdpa_forward(q, k4, v4, F.causal_mask(T))
    np.testing.assert_array_equal(out, out4)
    g = rng.normal(size=out.shape)
    (dq, dk, dv), (dq4, dk4, dv4) = F.sdpa_backward(g, cache), F.sdpa_backward(g, cache4)
    np.testing.assert_array_equal(dq, dq4)
    np.testing.assert_allclose(dk, dk4.reshape(B, 2, 2, T, D).sum(axis=2), rtol=1e-14)
    np.testing.assert_allclose(dv, dv4.reshape(B, 2, 2, T, D).sum(axis=2), rtol=1e-14)


def test_heads_that_do_not_divide_are_refused():
    rng = np.random.default_rng(0)
    q, k, v = grouped_qkv(rng, 3)
    with pytest.raises(ValueError, match="k's 3 heads must divide q's 4 heads"):
        F.sdpa_forward(q, k, v)
    with pytest.raises(ValueError, match="k's 3 heads must divide q's 4 heads"):
        ker.sdpa_forward(q, k, v)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), np.finfo(np.float64).tiny))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kv_heads", [2, 1])
@pytest.mark.parametrize("kind", KINDS + ["alibi+causal", "cross, fewer queries"])
def test_the_kernel_matches_the_reference(kind, kv_heads, dtype):
    """Output and the three gradients; masked keys get exactly zero gradient."""
    rng = np.random.default_rng(6)
    t_q = 4 if kind == "cross, fewer queries" else T
    q, k, v = grouped_qkv(rng, kv_heads, t_q, T, dtype)
    mask = {**mask_kinds(rng, t_q, T), "alibi+causal": F.causal_mask(T),
            "cross, fewer queries": F.causal_mask(t_q, T)}[kind]
    bias = F.alibi_bias(H, T, T, dtype=dtype) if kind == "alibi+causal" else None
    g = rng.normal(size=(B, H, t_q, D)).astype(dtype)
    out_r, cache_r = ref.sdpa_forward(q, k, v, mask, bias)
    out_k, cache_k = ker.sdpa_forward(q, k, v, mask, bias)
    grads_r, grads_k = ref.sdpa_backward(g, cache_r), ker.sdpa_backward(g, cache_k)
    for name, a, b in zip(("out", "dq", "dk", "dv"), (out_k, *grads_k), (out_r, *grads_r),
                          strict=True):
        assert a.shape == b.shape and a.dtype == dtype, name
        assert rel_err(a, b) <= KERNEL_TOL[dtype], f"{name}: {rel_err(a, b):.2e}"
    if kind == "padding":  # keys 3.. of the second sequence: no query may attend them
        assert not grads_k[1][1, :, 3:].any() and not grads_k[2][1, :, 3:].any()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_kernel_matches_over_several_query_blocks(dtype):
    """Three query blocks of the kernel and one batch entry of two heads: the backward then
    splits each head's keys into chunks (with two threads or more) before the group sum."""
    rng = np.random.default_rng(9)
    t = 2 * 128 + 3
    q = rng.normal(size=(1, 2, t, D)).astype(dtype)
    k, v = (rng.normal(size=(1, 1, t, D)).astype(dtype) for _ in range(2))
    g = rng.normal(size=q.shape).astype(dtype)
    mask = F.causal_mask(t)
    (out_r, cache_r), (out_k, cache_k) = (m.sdpa_forward(q, k, v, mask) for m in (ref, ker))
    for name, a, b in zip(("out", "dq", "dk", "dv"),
                          (out_k, *ker.sdpa_backward(g, cache_k)),
                          (out_r, *ref.sdpa_backward(g, cache_r)), strict=True):
        assert rel_err(a, b) <= KERNEL_TOL[dtype], f"{name}: {rel_err(a, b):.2e}"


def _gqa_model(backend: str, dtype: str = "float64", **kw) -> nn.DecoderLM:
    return nn.DecoderLM(nn.TransformerConfig(**{
        **dict(vocab=7, width=8, heads=4, kv_heads=2, layers=2, ffn_width=16, max_len=6,
               positions="rope", norm="rmsnorm", activation="swiglu", bias=False,
               backend=backend, dtype=dtype), **kw}))


def test_a_grouped_query_model_agrees_on_both_backends():
    tokens = np.random.default_rng(1).integers(0, 7, size=(2, 6))
    models = [_gqa_model(b) for b in ("numpy", "numba")]
    logits = [m.forward(tokens) for m in models]
    g = np.random.default_rng(2).normal(size=logits[0].shape)
    for m in models:
        m.backward(g)
    assert rel_err(logits[1], logits[0]) <= 1e-12
    grads = [dict((n, d) for n, _, d in m.named_parameters()) for m in models]
    for name, d in grads[0].items():
        assert rel_err(grads[1][name], d) <= 1e-12, name
    assert grads[0]["decoder.blocks.0.attn.wk"].shape == (8, 4)  # (C, H_kv D)


@pytest.mark.parametrize("cross", [False, True])
def test_grouped_query_modules_by_finite_differences(cross):
    rng = np.random.default_rng(8)
    x, memory = rng.normal(size=(2, 4, 8)), rng.normal(size=(2, 3, 8))
    block = nn.DecoderBlock(8, 4, 16, kv_heads=1 if cross else 2, cross=cross, rng=rng,
                            backend="numpy")
    inputs = {"x": x, "memory": memory} if cross else {"x": x}
    report = check_module(block, inputs, mask=F.causal_mask(4))
    assert report.ok(TOL), str(report)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_cached_decoding_keeps_the_kv_heads_and_matches_the_full_forward(backend):
    model = _gqa_model(backend).eval()
    tokens = np.random.default_rng(3).integers(0, 7, size=(2, 6))
    full = model.forward(tokens)
    cache = new_cache(model, 2)
    steps = [model.forward(tokens[:, :3], cache=cache)]
    steps += [model.forward(tokens[:, t:t + 1], cache=cache) for t in range(3, 6)]
    assert rel_err(np.concatenate(steps, axis=1), full) <= 1e-12
    assert cache.blocks[0].attn.k.shape == (2, 2, 6, 2)  # (B, H_kv, T_max, D)


def test_parameter_count_and_init_of_multi_head_unchanged():
    for kv_heads in (None, 4, 2, 1):
        config = nn.TransformerConfig(vocab=7, width=8, heads=4, kv_heads=kv_heads, layers=2,
                                      ffn_width=16, max_len=6)
        assert parameter_count(config) == nn.DecoderLM(config).num_parameters(), kv_heads
    a = nn.MultiHeadAttention(8, 4, rng=np.random.default_rng(0))
    b = nn.MultiHeadAttention(8, 4, kv_heads=4, rng=np.random.default_rng(0))
    assert all(np.array_equal(a.params[n], b.params[n]) for n in a.params)


@pytest.mark.parametrize("kv_heads, message", [
    (3, "kv_heads=3 does not divide heads=4"), (0, "kv_heads"), (8, "kv_heads=8 does not"),
    (2.0, "kv_heads"), (True, "kv_heads")])
def test_the_config_refuses_kv_heads_that_do_not_divide_the_heads(kv_heads, message):
    with pytest.raises(ValueError, match=message):
        nn.TransformerConfig(vocab=7, width=8, heads=4, kv_heads=kv_heads, layers=1,
                             ffn_width=16, max_len=6).validate()
    with pytest.raises(ValueError, match=message):
        nn.MultiHeadAttention(8, 4, kv_heads=kv_heads)


def test_a_command_line_run_trains_samples_and_resumes_with_kv_heads(tmp_path):
    run = tmp_path / "run"
    flags = [*TINY, "--heads", "4", "--kv-heads", "2", "--text", small_text(tmp_path)]
    code, _, err = run_cli(["train", *flags, "--steps", "2", "--out", run, "--quiet"])
    assert code == 0, err
    assert json.loads((run / "config.json").read_text())["config"]["kv_heads"] == 2
    params = load_checkpoint(run / "checkpoint.npz").params
    assert params["decoder.blocks.0.attn.wk"].shape == (16, 8)  # (C, H_kv D), D = 16 / 4
    code, out, err = run_cli(["sample", run, "--length", "20"])  # cached decoding
    assert code == 0 and out, err
    code, _, err = run_cli(["train", "--resume", run, "--steps", "3", "--quiet"])
    assert code == 0, err
    assert load_checkpoint(run / "checkpoint.npz").step == 3

"""Property tests: random shapes, head counts, masks (fully masked rows included), dtypes and
positional schemes through attention, blocks and whole models.

Each example draws its sizes and options from hypothesis and its numbers from a seeded NumPy
generator (hypothesis shrinks the seed and sizes; the arrays stay cheap to make). Checked:
outputs and gradients are finite; attention rows sum to 1 wherever a key is visible and are
zero (with zero output and gradient) where none is; the numba kernel, when present, equals
the NumPy reference. ``derandomize=True`` makes the examples the same on every run.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numpy_transformer import config
from numpy_transformer.functional import attention as ref
from numpy_transformer.functional.masks import causal_mask, combine_masks, key_padding_mask
from numpy_transformer.functional.positional import alibi_bias
from numpy_transformer.functional.softmax import cross_entropy_backward, cross_entropy_forward
from numpy_transformer.nn import (
    DecoderBlock,
    DecoderLM,
    EncoderBlock,
    EncoderClassifier,
    EncoderDecoder,
    MultiHeadAttention,
    TransformerConfig,
)

# a long property suite (hypothesis): pytest -m slow (CI runs it too)
pytestmark = pytest.mark.slow

HAS_KERNEL = importlib.util.find_spec("numpy_transformer.kernels.attention") is not None
BACKENDS = config.BACKENDS if HAS_KERNEL else ("numpy",)
PROPS = settings(deadline=None, max_examples=25, derandomize=True)
DTYPES = st.sampled_from([getattr(np, name) for name in config.DTYPES])
SEEDS = st.integers(0, 2**32 - 1)


def tol(dtype) -> dict:
    return dict(rtol=2e-4, atol=2e-5) if dtype == np.float32 else dict(rtol=1e-9, atol=1e-11)


@st.composite
def attention_inputs(draw):
    """q, k, v, mask (kind drawn, fully masked rows forced in), bias, upstream gradient."""
    b, h = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    t_q, t_k, d = draw(st.integers(1, 6)), draw(st.integers(1, 6)), draw(st.integers(1, 5))
    dtype, kind = draw(DTYPES), draw(st.sampled_from(["none", "causal", "padding", "causal+pad",
                                                      "random", "per-head"]))
    if kind.startswith("causal"):
        t_k = max(t_k, t_q)  # causal: the queries are the last t_q of the t_k positions
    rng = np.random.default_rng(draw(SEEDS))
    q, k, v = (rng.standard_normal((b, h, t, d)).astype(dtype) for t in (t_q, t_k, t_k))
    lengths = rng.integers(0, t_k + 1, size=b)  # 0 = a sequence with no visible key at all
    if kind == "none":
        mask = None
    elif kind == "causal":
        mask = causal_mask(t_q, t_k)
    elif kind == "padding":
        mask = key_padding_mask(lengths, t_k)
    elif kind == "causal+pad":
        mask = combine_masks(causal_mask(t_q, t_k), key_padding_mask(lengths, t_k))
    elif kind == "random":
        mask = rng.random((b, 1, t_q, t_k)) < 0.6
        mask[:, :, rng.integers(t_q)] = False  # a fully masked query row
    else:  # per-head
        mask = rng.random((b, h, t_q, t_k)) < 0.5
    bias = alibi_bias(h, t_q, t_k, dtype=dtype) if draw(st.booleans()) else None
    g = rng.standard_normal((b, h, t_q, d)).astype(dtype)
    return q, k, v, mask, bias, g


def visible(mask, shape) -> np.ndarray:
    """(B, H, T_q, T_k) bool: which keys each query may attend."""
    return np.ones(shape, bool) if mask is None else np.broadcast_to(mask, shape)


@PROPS
@given(attention_inputs())
def test_attention_rows_sum_to_one_and_masked_rows_are_zero(case):
    q, k, v, mask, bias, g = case
    out, cache = ref.sdpa_forward(q, k, v, mask=mask, bias=bias)
    w = ref.attention_weights(q, k, mask=mask, bias=bias)
    seen = visible(mask, w.shape)
    any_key = seen.any(-1)  # (B, H, T_q)
    assert out.dtype == q.dtype and np.isfinite(out).all() and np.isfinite(w).all()
    np.testing.assert_allclose(w.sum(-1)[any_key], 1.0, **tol(q.dtype))
    assert (w[~seen] == 0).all()  # masked pairs get exactly zero weight
    assert (out[~any_key] == 0).all()  # nothing visible: zero output
    dq, dk, dv = ref.sdpa_backward(g, cache)
    for grad in (dq, dk, dv):
        assert grad.dtype == q.dtype and np.isfinite(grad).all()
    assert (dq[~any_key] == 0).all()  # and zero gradient
    unseen_key = ~seen.any(-2)  # (B, H, T_k): a key no query may attend
    assert (dk[unseen_key] == 0).all() and (dv[unseen_key] == 0).all()


@pytest.mark.skipif(not HAS_KERNEL, reason="no numba attention kernel")
@PROPS
@given(attention_inputs())
def test_numba_kernel_equals_numpy_reference(case):
    from numpy_transformer.kernels import attention as kernel

    q, k, v, mask, bias, g = case
    out_ref, cache_ref = ref.sdpa_forward(q, k, v, mask=mask, bias=bias)
    out, cache = kernel.sdpa_forward(q, k, v, mask=mask, bias=bias)
    assert out.dtype == q.dtype
    np.testing.assert_allclose(out, out_ref, **tol(q.dtype))
    for name, a, b in zip("qkv", kernel.sdpa_backward(g, cache),
                          ref.sdpa_backward(g, cache_ref), strict=True):
        assert a.dtype == q.dtype, name
        np.testing.assert_allclose(a, b, **tol(q.dtype), err_msg=f"d{name}")


@st.composite
def module_options(draw):
    """Width from heads x head width, a positional scheme that fits, norm, activation, dtype."""
    heads, positions = draw(st.integers(1, 3)), draw(st.sampled_from(["none", "rope", "alibi"]))
    head_width = 2 * draw(st.integers(1, 3)) if positions == "rope" else draw(st.integers(1, 5))
    return dict(width=heads * head_width, heads=heads, positions=positions, dtype=draw(DTYPES),
                norm=draw(st.sampled_from(config.NORMS)),
                activation=draw(st.sampled_from(config.ACTIVATIONS)),
                norm_first=draw(st.booleans()), backend=draw(st.sampled_from(BACKENDS)),
                b=draw(st.integers(1, 3)), t=draw(st.integers(1, 7)), seed=draw(SEEDS))


def assert_finite_grads(module) -> None:
    for name, p, grad in module.named_parameters():
        assert grad.dtype == p.dtype and np.isfinite(grad).all(), name


@PROPS
@given(module_options())
def test_attention_module_with_positions_and_padding(o):
    rng = np.random.default_rng(o["seed"])
    attn = MultiHeadAttention(o["width"], o["heads"], rope=o["positions"] == "rope",
                              alibi=o["positions"] == "alibi", max_len=8, backend=o["backend"],
                              keep_weights=True, dtype=o["dtype"], rng=rng)
    x = rng.standard_normal((o["b"], o["t"], o["width"])).astype(o["dtype"])
    lengths = rng.integers(0, o["t"] + 1, size=o["b"])
    mask = combine_masks(causal_mask(o["t"]), key_padding_mask(lengths, o["t"]))
    out = attn.forward(x, mask=mask)
    assert out.dtype == x.dtype and np.isfinite(out).all()
    w = attn.weights  # (B, H, T, T)
    any_key = visible(mask, w.shape).any(-1)
    np.testing.assert_allclose(w.sum(-1)[any_key], 1.0, **tol(x.dtype))
    assert (w.sum(-1)[~any_key] == 0).all()
    dx = attn.backward(rng.standard_normal(out.shape).astype(o["dtype"]))
    assert dx.dtype == x.dtype and np.isfinite(dx).all()
    assert_finite_grads(attn)


@PROPS
@given(module_options(), st.booleans())
def test_blocks_finite_forward_and_backward(o, cross):
    rng = np.random.default_rng(o["seed"])
    kw = dict(norm=o["norm"], activation=o["activation"], norm_first=o["norm_first"],
              rope=o["positions"] == "rope", alibi=o["positions"] == "alibi", max_len=8,
              backend=o["backend"], dtype=o["dtype"], rng=rng)
    x = rng.standard_normal((o["b"], o["t"], o["width"])).astype(o["dtype"])
    g = rng.standard_normal(x.shape).astype(o["dtype"])
    lengths = rng.integers(0, o["t"] + 1, size=o["b"])
    enc = EncoderBlock(o["width"], o["heads"], 2 * o["width"], **kw)
    out = enc.forward(x, key_padding_mask(lengths, o["t"]))
    assert out.dtype == x.dtype and np.isfinite(out).all()
    assert np.isfinite(enc.backward(g)).all()
    assert_finite_grads(enc)
    if cross:  # cross-attention takes no rope/alibi: positions live in the self-attention
        kw.update(rope=False, alibi=False)
    dec = DecoderBlock(o["width"], o["heads"], 2 * o["width"], cross=cross, **kw)
    memory = rng.standard_normal((o["b"], 3, o["width"])).astype(o["dtype"]) if cross else None
    memory_mask = key_padding_mask(rng.integers(0, 4, size=o["b"]), 3) if cross else None
    out = dec.forward(x, memory, memory_mask)
    assert out.dtype == x.dtype and np.isfinite(out).all()
    grads = dec.backward(g)
    for grad in grads if cross else (grads,):
        assert np.isfinite(grad).all()
    assert_finite_grads(dec)


@st.composite
def model_configs(draw):
    o = draw(module_options())
    positions = draw(st.sampled_from(config.POSITIONS))
    if positions == "sinusoidal" and o["width"] % 2:
        positions = "learned"
    if positions == "rope" and (o["width"] // o["heads"]) % 2:
        positions = "alibi"
    cfg = TransformerConfig(vocab=draw(st.integers(2, 9)), width=o["width"],
                            heads=o["heads"], layers=draw(st.integers(1, 2)),
                            ffn_width=draw(st.integers(1, 12)), max_len=8, norm=o["norm"],
                            activation=o["activation"], positions=positions,
                            norm_first=o["norm_first"], embed_scale=draw(st.booleans()),
                            tie_embeddings=draw(st.booleans()), backend=o["backend"],
                            dtype=np.dtype(o["dtype"]).name, seed=o["seed"] % 1000)
    return cfg, o["b"], o["t"], o["seed"]


def train_step_is_finite(model, inputs, targets) -> None:
    logits = model.forward(*inputs)
    assert logits.dtype == np.dtype(model.config.dtype) and np.isfinite(logits).all()
    loss, cache = cross_entropy_forward(logits, targets)
    assert np.isfinite(loss)
    model.zero_grad()
    model.backward(cross_entropy_backward(1.0, cache))
    assert_finite_grads(model)


@PROPS
@given(model_configs(), st.sampled_from(["decoder", "classifier", "encoder-decoder"]))
def test_models_finite_forward_and_backward(case, family):
    config, b, t, seed = case
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, config.vocab, size=(b, t))
    lengths = rng.integers(1, t + 1, size=b)  # classifiers need one real token per row
    if family == "decoder":
        train_step_is_finite(DecoderLM(config), (tokens,), tokens)
    elif family == "classifier":
        config.tie_embeddings, config.num_classes = False, 3
        targets = rng.integers(0, 3, size=(b, t))
        train_step_is_finite(EncoderClassifier(config), (tokens, lengths), targets)
    else:
        src = rng.integers(0, config.vocab, size=(b, t + 1 if t < 8 else t))
        train_step_is_finite(EncoderDecoder(config), (src, tokens, lengths), tokens)

"""Every layer, block and model family against its twin: output, input gradients and the
gradient of every parameter, by name, in float32 and float64."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from numpy_transformer import config, nn  # noqa: E402
from numpy_transformer.functional import causal_mask, key_padding_mask  # noqa: E402
from numpy_transformer.nn.layers import make_norm  # noqa: E402
from reference_checks.compare import check_module  # noqa: E402

DTYPES = [getattr(np, name) for name in config.DTYPES]
B, T, C, H, F = 2, 5, 8, 2, 12


def x_of(dtype, t=T, seed=0):
    return np.random.default_rng(seed).standard_normal((B, t, C)).astype(dtype)


REF = "numpy"  # the modules on the readable references (tests/ hold the kernels to them)


def rng():
    return np.random.default_rng(42)


# ----------------------------------------------------------------------------- layers
LAYERS = {
    "Linear": lambda d: nn.Linear(C, F, dtype=d, rng=rng(), backend=REF),
    "Linear(bias=False)": lambda d: nn.Linear(C, F, bias=False, dtype=d, rng=rng(), backend=REF),
    **{f"norm {n}": (lambda d, n=n: make_norm(n, C, dtype=d, backend=REF))
       for n in config.NORMS},
    "SinusoidalPositions": lambda d: nn.SinusoidalPositions(7, C, dtype=d),
    "LearnedPositions": lambda d: nn.LearnedPositions(7, C, dtype=d, rng=rng()),
    **{f"FeedForward({a})": (lambda d, a=a: nn.FeedForward(C, F, a, dtype=d, rng=rng(),
                                                           backend=REF))
       for a in config.ACTIVATIONS},
    **{f"FeedForward({a}, bias=False)": (lambda d, a=a: nn.FeedForward(
        C, F, a, bias=False, dtype=d, rng=rng(), backend=REF)) for a in ("relu", "swiglu")},
}


def _randomise_gains(module, seed=3, spread=0.3):
    """Norm gains start at ones and shifts at zeros, which would hide a bug that swaps or
    drops them: move every 1-D parameter by ``spread * N(0, 1)``.

    Gains of order one, as after training. Fully random gains (some near zero, some negative)
    make a whole float32 model ill-conditioned: torch's own float32 gradients then differ
    from the float64 truth by 1e-4, as much as ours do, and a 1e-5 comparison of the two
    measures that noise, not a bug. float64 is checked with the same weights to 1e-10.
    """
    r = np.random.default_rng(seed)
    for _, p, _ in module.named_parameters():
        if p.ndim == 1:
            p += spread * r.standard_normal(p.shape).astype(p.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer(name, dtype):
    layer = LAYERS[name](dtype)
    _randomise_gains(layer)
    check_module("layers", layer, (x_of(dtype),), grad_args=("x",))


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_layer(dtype):
    table = nn.Embedding(11, C, dtype=dtype, rng=rng(), backend=REF)
    ids = np.random.default_rng(0).integers(0, 11, (B, T))
    check_module("layers", table, (ids,))


# ----------------------------------------------------------------------------- attention
ATTENTION = {
    "self": dict(),
    "self causal": dict(mask="causal"),
    "self padded": dict(mask="padding"),
    "rope causal": dict(rope=True, mask="causal"),
    "alibi causal": dict(alibi=True, mask="causal"),
    "cross": dict(cross=True),
    "cross padded": dict(cross=True, mask="padding"),
    "rope causal, no bias": dict(rope=True, mask="causal", bias=False),
    "cross, no bias": dict(cross=True, bias=False),
    # grouped-query: 4 query heads read 2 kv heads (two groups, so the order h // G counts)
    "grouped-query rope causal": dict(heads=4, kv_heads=2, rope=True, mask="causal"),
    "grouped-query cross padded": dict(heads=4, kv_heads=2, cross=True, mask="padding"),
    "multi-query alibi causal": dict(heads=4, kv_heads=1, alibi=True, mask="causal"),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(ATTENTION))
def test_attention(case, dtype):
    opts = ATTENTION[case]
    attn = nn.MultiHeadAttention(C, opts.get("heads", H), kv_heads=opts.get("kv_heads"),
                                 rope=opts.get("rope", False),
                                 alibi=opts.get("alibi", False), max_len=9,
                                 bias=opts.get("bias", True), dtype=dtype, rng=rng(),
                                 backend=REF)
    t_k = 7 if opts.get("cross") else T
    mask = {None: None, "causal": causal_mask(T),
            "padding": key_padding_mask(np.array([t_k, 3]), t_k)}[opts.get("mask")]
    if opts.get("cross"):
        args, names = (x_of(dtype), x_of(dtype, t_k, seed=1)), ("x", "context")
    else:
        args, names = (x_of(dtype),), ("x",)
    check_module("attention module", attn, args, {"mask": mask}, grad_args=names)


# ----------------------------------------------------------------------------- blocks
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["encoder", "decoder", "decoder cross"])
@pytest.mark.parametrize("norm_first", [True, False], ids=["pre-LN", "post-LN"])
def test_block(kind, norm_first, dtype):
    opts = dict(norm_first=norm_first, max_len=9, dtype=dtype, rng=rng(), backend=REF)
    if kind == "encoder":
        block = nn.EncoderBlock(C, H, F, norm="rmsnorm", activation="swiglu", **opts)
        args, kwargs, names = (x_of(dtype),), {"mask": key_padding_mask(np.array([5, 2]), T)}, \
            ("x",)
    else:
        cross = kind == "decoder cross"
        block = nn.DecoderBlock(C, H, F, cross=cross, activation="gelu_tanh", rope=True, **opts)
        args, kwargs, names = (x_of(dtype),), {}, ("x",)
        if cross:
            args, names = (x_of(dtype), x_of(dtype, 6, seed=1)), ("x", "memory")
            kwargs = {"memory_mask": key_padding_mask(np.array([6, 4]), 6)}
    _randomise_gains(block)
    check_module("blocks", block, args, kwargs, grad_args=names)


# ----------------------------------------------------------------------------- models
VARIANTS = {
    "preLN-layernorm-gelu-sinusoidal": dict(),
    "postLN-rmsnorm-relu-learned": dict(norm_first=False, norm="rmsnorm", activation="relu",
                                        positions="learned"),
    "preLN-rmsnorm-swiglu-rope-tied-scaled": dict(norm="rmsnorm", activation="swiglu",
                                                  positions="rope", tie_embeddings=True,
                                                  embed_scale=True),
    "postLN-layernorm-gelu_tanh-alibi": dict(norm_first=False, activation="gelu_tanh",
                                             positions="alibi"),
    "preLN-layernorm-relu-none-tied": dict(activation="relu", positions="none",
                                           tie_embeddings=True),
    "preLN-rmsnorm-swiglu-rope-nobias": dict(norm="rmsnorm", activation="swiglu",
                                             positions="rope", bias=False),
    "postLN-layernorm-relu-learned-nobias-tied": dict(norm_first=False, activation="relu",
                                                      positions="learned", bias=False,
                                                      tie_embeddings=True),
    "preLN-rmsnorm-swiglu-rope-nobias-gqa": dict(norm="rmsnorm", activation="swiglu",
                                                 positions="rope", bias=False, heads=4,
                                                 kv_heads=2),
}
V = 13


def model_inputs(family, seed=0):
    r = np.random.default_rng(seed)
    if family == "EncoderClassifier":
        return (r.integers(0, V, (B, T)),), {"lengths": np.array([T, 3])}
    if family == "DecoderLM":
        return (r.integers(0, V, (B, T)),), {}
    return (r.integers(0, V, (B, 6)), r.integers(0, V, (B, T))), {"src_lengths": np.array([4, 6])}


# every family with every variant, but a classifier with a tied head: it has no vocabulary
# output to tie
FAMILY_VARIANTS = [(family, variant) for family in ("EncoderClassifier", "DecoderLM",
                                                    "EncoderDecoder")
                   for variant in VARIANTS
                   if not (family == "EncoderClassifier" and VARIANTS[variant].get(
                       "tie_embeddings"))]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("family, variant", FAMILY_VARIANTS)
def test_model(family, variant, dtype):
    opts = {"heads": H, **VARIANTS[variant]}
    if family == "EncoderClassifier":
        opts["num_classes"] = 4
    cfg = nn.TransformerConfig(vocab=V, width=C, layers=2, ffn_width=F, max_len=9,
                               dtype=dtype, seed=1, **opts)
    model = getattr(nn, family)(cfg)
    _randomise_gains(model)
    args, kwargs = model_inputs(family)
    check_module(family, model, args, kwargs)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("positions", config.POSITIONS)
def test_decoder_lm_with_each_positional_scheme(positions, dtype):
    cfg = nn.TransformerConfig(vocab=V, width=C, heads=H, layers=1, ffn_width=F, max_len=9,
                               positions=positions, dtype=dtype, seed=1)
    model = nn.DecoderLM(cfg)
    _randomise_gains(model)
    args, kwargs = model_inputs("DecoderLM")
    check_module("DecoderLM", model, args, kwargs)


def test_negative_control_catches_the_mixed_gelu_bug(monkeypatch):
    """A backward that differentiates a different function than its forward (erf GELU forward,
    tanh-GELU derivative: numpy-ml's bug) must fail the comparison."""
    from numpy_transformer.functional import activations, gelu_tanh_backward, gelu_tanh_forward

    ffn = nn.FeedForward(C, F, "gelu", rng=rng(), backend=REF)
    monkeypatch.setattr(activations, "gelu_backward",
                        lambda da, x: gelu_tanh_backward(da, gelu_tanh_forward(x)[1]))
    with pytest.raises(AssertionError, match="relative error"):
        check_module("negative control (must fail)", ffn, (x_of(np.float64),),
                     grad_args=("x",))


def test_negative_control_float32_floor_still_catches_a_small_tensors_bug():
    """The float32 floor at the module's scale (``compare.FLOW_UNITS``) must not hide a bug in a
    module's smallest gradient: in the model where the query projection's gradient is 1/200 of
    its module's largest, the same gradient 1% off must fail."""
    cfg = nn.TransformerConfig(vocab=V, width=C, heads=H, layers=2, ffn_width=F, max_len=9,
                               dtype="float32", seed=1,
                               **VARIANTS["preLN-layernorm-relu-none-tied"])
    model = nn.DecoderLM(cfg)
    _randomise_gains(model)
    attn = model.decoder.blocks[1].attn
    backward = model.backward

    def wrong_backward(dlogits):
        backward(dlogits)
        attn.grads["wq"] *= np.float32(1.01)

    model.backward = wrong_backward
    args, kwargs = model_inputs("DecoderLM")
    with pytest.raises(AssertionError, match="blocks.1.attn.wq: relative error"):
        check_module("negative control (must fail)", model, args, kwargs)

"""The three models x every positional scheme against finite differences; tied embeddings;
causality, padding and permutation invariants; float32; bad input."""

import numpy as np
import pytest
from _nn_helpers import assert_gradcheck

from numpy_transformer.config import POSITIONS
from numpy_transformer.gradcheck import check_direction, check_module
from numpy_transformer.nn import DecoderLM, EncoderClassifier, EncoderDecoder, TransformerConfig

V, B, T, T_SRC = 7, 2, 5, 4


def config(**overrides) -> TransformerConfig:
    options = dict(vocab=V, width=8, heads=2, layers=1, ffn_width=12, max_len=6, num_classes=3)
    options.update(overrides)
    return TransformerConfig(**options)


def tokens(rng, t=T):
    return rng.integers(0, V, size=(B, t))


def perturb(model, rng):
    """Move the norms off their ones/zeros init so every parameter shapes the output."""
    for name, param, _ in model.named_parameters():
        if "norm" in name:
            param += 0.3 * rng.normal(size=param.shape)
    return model


# ----------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("positions", POSITIONS)
def test_encoder_classifier(positions):
    rng = np.random.default_rng(21)
    model = perturb(EncoderClassifier(config(positions=positions)), rng)
    report = check_module(model, {"tokens": tokens(rng)}, lengths=np.array([T, 3]))
    assert_gradcheck(report, model)


@pytest.mark.parametrize("positions", POSITIONS)
def test_decoder_lm(positions):
    rng = np.random.default_rng(22)
    model = perturb(DecoderLM(config(positions=positions, embed_scale=True)), rng)
    assert_gradcheck(check_module(model, {"tokens": tokens(rng)}), model)


@pytest.mark.parametrize("positions", POSITIONS)
def test_encoder_decoder(positions):
    rng = np.random.default_rng(23)
    model = perturb(EncoderDecoder(config(positions=positions)), rng)
    report = check_module(model, {"src": tokens(rng, T_SRC), "tgt": tokens(rng)},
                          src_lengths=np.array([T_SRC, 2]))
    assert_gradcheck(report, model)


@pytest.mark.parametrize("cls", [DecoderLM, EncoderDecoder])
def test_tied_embeddings(cls):
    rng = np.random.default_rng(24)
    model = perturb(cls(config(tie_embeddings=True, norm="rmsnorm", activation="swiglu")), rng)
    untied = cls(config(norm="rmsnorm", activation="swiglu"))
    assert untied.num_parameters() - model.num_parameters() == 8 * V + V  # head w and b
    names = [name for name, _, _ in model.named_parameters()]
    assert not any(name.startswith("head.") for name in names)
    inputs = {"tokens": tokens(rng)} if cls is DecoderLM else {"src": tokens(rng, T_SRC),
                                                               "tgt": tokens(rng)}
    # the table's gradient is the sum of its two uses; the check perturbs both at once
    assert_gradcheck(check_module(model, inputs), model)


@pytest.mark.parametrize("cls", [EncoderClassifier, DecoderLM, EncoderDecoder])
@pytest.mark.parametrize("norm_first", [True, False], ids=["preLN", "postLN"])
def test_two_layers_random_direction(cls, norm_first):
    rng = np.random.default_rng(25)
    model = perturb(cls(config(layers=2, norm_first=norm_first, positions="learned",
                               activation="gelu_tanh")), rng)
    inputs = {"tokens": tokens(rng)} if cls is not EncoderDecoder else {
        "src": tokens(rng, T_SRC), "tgt": tokens(rng)}
    assert check_direction(model, inputs).ok(1e-6)


def test_two_layer_post_ln_decoder_lm_full_check():
    rng = np.random.default_rng(26)
    model = perturb(DecoderLM(config(layers=2, norm_first=False, activation="relu")), rng)
    assert not any("final_norm" in name for name, _, _ in model.named_parameters())
    assert_gradcheck(check_module(model, {"tokens": tokens(rng)}), model)


@pytest.mark.parametrize("activation", ["relu", "swiglu"])
@pytest.mark.parametrize("cls", [EncoderClassifier, DecoderLM, EncoderDecoder])
def test_without_biases(cls, activation):
    """``bias=False`` drops every linear layer's bias (attention, FFN, head), keeps the norms'
    shifts, and leaves the gradient of every other parameter exact (ReLU then runs unfused)."""
    rng = np.random.default_rng(27)
    opts = dict(bias=False, activation=activation, positions="rope")
    model = perturb(cls(config(**opts)), rng)
    with_bias = cls(config(**{**opts, "bias": True}))
    names = {name for name, _, _ in model.named_parameters()}
    dropped = {name for name, _, _ in with_bias.named_parameters()} - names
    assert names < {name for name, _, _ in with_bias.named_parameters()}
    assert dropped and all(n.rsplit(".", 1)[1] in ("b", "bq", "bk", "bv", "bo") and
                           "norm" not in n for n in dropped)
    assert any(n.endswith("norm1.b") for n in names)  # LayerNorm keeps its shift
    inputs = {"tokens": tokens(rng)} if cls is not EncoderDecoder else {
        "src": tokens(rng, T_SRC), "tgt": tokens(rng)}
    kwargs = {"lengths": np.array([T, 3])} if cls is EncoderClassifier else {}
    assert_gradcheck(check_module(model, inputs, **kwargs), model)


def test_without_biases_random_direction_two_layers():
    rng = np.random.default_rng(28)
    model = perturb(DecoderLM(config(layers=2, bias=False, norm="rmsnorm", activation="swiglu",
                                     positions="rope")), rng)
    assert check_direction(model, {"tokens": tokens(rng)}).ok(1e-6)


# ----------------------------------------------------------------------------- invariants
@pytest.mark.parametrize("positions", POSITIONS)
def test_decoder_lm_future_tokens_do_not_change_the_past(positions):
    rng = np.random.default_rng(27)
    model = DecoderLM(config(layers=2, positions=positions))
    ids = tokens(rng)
    logits = model.forward(ids)
    changed = ids.copy()
    changed[:, 3] = (changed[:, 3] + 1) % V
    logits2 = model.forward(changed)
    np.testing.assert_array_equal(logits2[:, :3], logits[:, :3])  # bit-identical
    assert np.abs(logits2[:, 3:] - logits[:, 3:]).max() > 1e-6


def test_encoder_decoder_is_causal_in_the_target_only():
    rng = np.random.default_rng(28)
    model = EncoderDecoder(config(layers=2))
    src, tgt = tokens(rng, T_SRC), tokens(rng)
    logits = model.forward(src, tgt)
    tgt2 = tgt.copy()
    tgt2[:, -1] = (tgt2[:, -1] + 1) % V
    np.testing.assert_array_equal(model.forward(src, tgt2)[:, :-1], logits[:, :-1])
    src2 = src.copy()
    src2[:, -1] = (src2[:, -1] + 1) % V  # the source is seen by every target position
    assert np.abs(model.forward(src2, tgt)[:, 0] - logits[:, 0]).max() > 1e-6


def test_padding_is_invisible():
    rng = np.random.default_rng(29)
    lengths = np.array([T, 3])
    classifier = EncoderClassifier(config(layers=2))
    ids = tokens(rng)
    changed = ids.copy()
    changed[1, 3:] = (changed[1, 3:] + 1) % V  # only padding positions of sequence 1
    out, out2 = classifier.forward(ids, lengths), classifier.forward(changed, lengths)
    np.testing.assert_array_equal(out2[0], out[0])
    np.testing.assert_array_equal(out2[1, :3], out[1, :3])
    seq2seq = EncoderDecoder(config(layers=2))
    src = tokens(rng, T_SRC)
    src2 = src.copy()
    src2[1, 2:] = (src2[1, 2:] + 1) % V
    tgt, src_lengths = tokens(rng), np.array([T_SRC, 2])
    np.testing.assert_array_equal(seq2seq.forward(src2, tgt, src_lengths),
                                  seq2seq.forward(src, tgt, src_lengths))


def test_permutation_equivariance_without_positions_only():
    rng = np.random.default_rng(30)
    ids, perm = tokens(rng), rng.permutation(T)
    bare = EncoderClassifier(config(positions="none", layers=2))
    out, out_p = bare.forward(ids), bare.forward(ids[:, perm])
    assert np.abs(out_p - out[:, perm]).max() < 1e-14
    positioned = EncoderClassifier(config(positions="sinusoidal", layers=2))
    out, out_p = positioned.forward(ids), positioned.forward(ids[:, perm])
    assert np.abs(out_p - out[:, perm]).max() > 1e-3


def test_same_seed_same_model_and_dropout_only_in_training():
    a, b = DecoderLM(config(seed=3, dropout=0.2)), DecoderLM(config(seed=3, dropout=0.2))
    for (name, p, _), (_, q, _) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        np.testing.assert_array_equal(p, q, err_msg=name)
    ids = tokens(np.random.default_rng(0))
    np.testing.assert_array_equal(a.forward(ids), b.forward(ids))  # same dropout masks too
    assert not np.array_equal(a.forward(ids), a.forward(ids))
    a.eval()
    np.testing.assert_array_equal(a.forward(ids), a.forward(ids))
    assert not np.array_equal(DecoderLM(config(seed=4)).state_dict()["head.w"],
                              DecoderLM(config(seed=3)).state_dict()["head.w"])


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_numba_backend_matches_numpy(bias):
    rng = np.random.default_rng(31)
    ids = tokens(rng)
    g = rng.normal(size=(B, T, V))
    runs = []
    for backend in ("numpy", "numba"):
        model = DecoderLM(config(layers=2, positions="rope", activation="relu", bias=bias,
                                 backend=backend))
        logits = model.forward(ids)
        model.backward(g)
        runs.append((logits, {name: grad.copy() for name, _, grad in model.named_parameters()}))
    (l0, g0), (l1, g1) = runs
    np.testing.assert_allclose(l1, l0, rtol=1e-12, atol=1e-12)
    for name in g0:
        np.testing.assert_allclose(g1[name], g0[name], rtol=1e-10, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("cls", [EncoderClassifier, DecoderLM, EncoderDecoder])
def test_float32_models(cls):
    rng = np.random.default_rng(32)
    model = cls(config(dtype="float32", positions="rope", dropout=0.1))
    args = (tokens(rng),) if cls is not EncoderDecoder else (tokens(rng, T_SRC), tokens(rng))
    logits = model.forward(*args)
    assert logits.dtype == np.float32
    model.backward(rng.normal(size=logits.shape).astype(np.float32))
    for name, param, grad in model.named_parameters():
        assert param.dtype == grad.dtype == np.float32, name
        assert np.isfinite(grad).all(), name


# ----------------------------------------------------------------------------- bad input
def test_bad_tokens():
    rng = np.random.default_rng(33)
    model = DecoderLM(config(positions="learned"))
    with pytest.raises(ValueError, match="holds id 7, outside the vocabulary"):
        model.forward(np.array([[0, 7]]))
    with pytest.raises(ValueError, match="integer token ids"):
        model.forward(np.array([[0.0, 1.0]]))
    with pytest.raises(ValueError, match=r"shape \(B, T\)"):
        model.forward(np.array([0, 1]))
    for positions in ("sinusoidal", "learned", "rope"):
        with pytest.raises(ValueError, match="exceeds"):
            DecoderLM(config(positions=positions)).forward(tokens(rng, 7))  # max_len 6
    with pytest.raises(ValueError, match="context batch"):
        EncoderDecoder(config()).forward(tokens(rng, T_SRC)[:1], tokens(rng))


@pytest.mark.parametrize("overrides, message", [
    (dict(heads=3), "heads=3 does not divide width=8"),
    (dict(width=0), "width must be a positive integer"),
    (dict(layers=1.5), "layers must be a positive integer"),
    (dict(norm="batchnorm"), "norm must be one of"),
    (dict(activation="tanh"), "activation must be one of"),
    (dict(positions="relative"), "positions must be one of"),
    (dict(width=6, heads=2, positions="sinusoidal"), None),  # even width: fine
    (dict(width=9, heads=3, positions="sinusoidal"), "sinusoidal table needs an even width"),
    (dict(width=6, heads=2, positions="rope"), "rope needs an even head width"),
    (dict(dropout=1.0), "dropout must lie in"),
    (dict(embed_std=-1.0), "embed_std must be a positive finite number"),
    (dict(embed_std=float("inf")), "embed_std must be a positive finite number"),
    (dict(norm_eps=0.0), "norm_eps must be a positive finite number"),
    (dict(norm_eps=1e-6, norm="rmsnorm"), None),
    (dict(num_classes=0), "num_classes must be a positive integer"),
    (dict(backend="cuda"), "backend must be one of"),
    (dict(dtype="float16"), "dtype must be one of"),
    (dict(bias="no"), "bias must be True or False"),
])
def test_config_validation(overrides, message):
    cfg = config(**overrides)
    if message is None:
        assert cfg.validate() is cfg
    else:
        with pytest.raises(ValueError, match=message):
            DecoderLM(cfg)


@pytest.mark.parametrize("width, heads", [(84, 4), (6, 2), (30, 2), (3, 1), (100, 20)])
def test_rope_with_an_odd_head_width_says_which_shapes_would_work(width, heads):
    # the chapter's width 84 over 4 heads is 21 per head: the refusal names heads and widths
    # that fit, and each of them validates
    with pytest.raises(ValueError, match="rope needs an even head width") as caught:
        config(width=width, heads=heads, positions="rope").validate()
    suggestion = str(caught.value).split(": use ")[1]
    shapes = []
    for part in suggestion.split(", or "):
        name, values = part.split(" ", 1)
        shapes += [{name: int(v)} for v in values.split(" or ")]
    assert shapes and any("width" in s for s in shapes)
    for shape in shapes:
        cfg = config(**{"width": width, "heads": heads, **shape}, positions="rope")
        assert cfg.validate() is cfg, shape


def test_model_specific_config_errors():
    with pytest.raises(ValueError, match="num_classes"):
        EncoderClassifier(config(num_classes=None))
    with pytest.raises(ValueError, match="tie_embeddings"):
        EncoderClassifier(config(tie_embeddings=True))

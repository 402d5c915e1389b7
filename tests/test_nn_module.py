"""The Module contract: params and grads, dotted names, accumulation, one cache, saving, modes,
dtype, and the parameter counts of the two chapters."""

import numpy as np
import pytest

from numpy_transformer.nn import (
    LSTMLM,
    DecoderLM,
    Dropout,
    EncoderBlock,
    Linear,
    LSTMConfig,
    MultiHeadAttention,
    TransformerConfig,
)


def small_lm(**overrides):
    options = dict(vocab=11, width=8, heads=2, layers=2, ffn_width=12, max_len=6, dropout=0.1)
    options.update(overrides)
    return DecoderLM(TransformerConfig(**options))


def test_grads_mirror_params():
    model = small_lm()
    block = model.decoder.blocks[0]
    for module in (model.head, block.attn, block.norm1, block.ffn.up):
        assert module.params.keys() == module.grads.keys()
    for name, param, grad in model.named_parameters():
        assert grad.shape == param.shape and grad.dtype == param.dtype, name
        assert not grad.any(), name


def test_dotted_names_follow_the_architecture():
    names = [name for name, _, _ in small_lm().named_parameters()]
    assert names[0] == "decoder.embed.tokens.table"
    assert "decoder.blocks.0.attn.wq" in names and "decoder.blocks.1.ffn.down.b" in names
    assert names[-4:] == ["decoder.final_norm.w", "decoder.final_norm.b", "head.w", "head.b"]
    assert len(names) == len(set(names))


def test_parameters_and_count():
    model = small_lm()
    pairs = list(model.parameters())
    assert len(pairs) == len(list(model.named_parameters()))
    assert model.num_parameters() == sum(p.size for p, _ in pairs)


def test_backward_accumulates_and_zero_grad_is_explicit():
    rng = np.random.default_rng(0)
    layer = Linear(3, 4, rng=rng)
    x, g = rng.normal(size=(2, 3)), rng.normal(size=(2, 4))
    layer.forward(x)
    layer.backward(g)
    once = {k: v.copy() for k, v in layer.grads.items()}
    layer.backward(g)
    for k in once:
        np.testing.assert_allclose(layer.grads[k], 2 * once[k])
    w_grad = layer.grads["w"]
    layer.zero_grad()
    assert not layer.grads["w"].any() and layer.grads["w"] is w_grad  # zeroed in place
    _garbage_grads(layer, 6)  # inside replacing_grads the first backward replaces, then adds
    with layer.replacing_grads():
        layer.backward(g)
        layer.backward(g)
    for k in once:
        np.testing.assert_allclose(layer.grads[k], 2 * once[k])
    assert layer.grads["w"] is w_grad


def _garbage_grads(model, seed):
    """Random numbers in every gradient: what a previous step would have left."""
    rng = np.random.default_rng(seed)
    for _, grad in model.parameters():
        grad[...] = rng.normal(size=grad.shape)


def _grads(model):
    return {name: grad.copy() for name, _, grad in model.named_parameters()}


LMS = {  # a tied table (two gradients into one array), learned positions longer than the
    # batch (a gradient into some rows only), both backends; an LSTM
    "tied, numpy": lambda: small_lm(tie_embeddings=True, positions="learned", max_len=9,
                                    bias=False, backend="numpy", dtype="float64"),
    "tied, numba": lambda: small_lm(tie_embeddings=True, positions="learned", max_len=9,
                                    backend="numba", dtype="float32"),
    "lstm": lambda: LSTMLM(LSTMConfig(vocab=11, hidden=8, embed=6, max_len=9)),
}


@pytest.mark.parametrize("name", LMS)
def test_replacing_grads_leaves_the_bits_of_zero_grad_then_backward(name):
    tokens = np.random.default_rng(1).integers(0, 11, size=(3, 7))
    want, got = LMS[name](), LMS[name]()
    _garbage_grads(want, 2)
    want.zero_grad()
    want.loss_and_backward(tokens[:, :-1], targets=tokens[:, 1:])
    _garbage_grads(got, 3)
    with got.replacing_grads():
        got.loss_and_backward(tokens[:, :-1], targets=tokens[:, 1:])
    expected, actual = _grads(want), _grads(got)
    for key, grad in expected.items():
        assert grad.any(), key  # every parameter has a gradient here
        np.testing.assert_array_equal(actual[key], grad, err_msg=key)
    # negative control: the same backward adding into the old numbers does not match
    _garbage_grads(got, 3)
    got.loss_and_backward(tokens[:, :-1], targets=tokens[:, 1:])
    assert any(not np.array_equal(g, expected[k]) for k, g in _grads(got).items())


def test_replacing_grads_zeroes_what_no_backward_wrote_and_keeps_the_arrays():
    model = small_lm()
    _garbage_grads(model, 4)
    arrays = [grad for _, grad in model.parameters()]
    with model.replacing_grads():
        pass
    assert all(not grad.any() for grad in arrays)
    assert all(a is b for a, (_, b) in zip(arrays, model.parameters(), strict=True))


def test_second_forward_overwrites_the_cache():
    rng = np.random.default_rng(1)
    layer = Linear(3, 4, rng=rng)
    x1, x2, g = rng.normal(size=(2, 3)), rng.normal(size=(5, 3)), rng.normal(size=(5, 4))
    layer.forward(x1)
    layer.forward(x2)
    dx = layer.backward(g)  # belongs to the second forward
    assert dx.shape == x2.shape
    np.testing.assert_allclose(layer.grads["w"], x2.T @ g)


def test_state_dict_copies_and_round_trips():
    model, other = small_lm(seed=1), small_lm(seed=2)
    state = model.state_dict()
    name = "decoder.blocks.0.attn.wq"
    state[name][...] = 0.0
    assert model.state_dict()[name].any()  # a copy, not a view
    other.load_state_dict(model.state_dict())
    pairs = zip(model.named_parameters(), other.named_parameters(), strict=True)
    for (n, p, _), (_, q, _) in pairs:
        np.testing.assert_array_equal(p, q, err_msg=n)


def test_load_state_dict_keeps_the_same_arrays():
    model = small_lm()
    before = model.decoder.blocks[0].attn.params["wq"]
    model.load_state_dict(small_lm(seed=5).state_dict())
    assert model.decoder.blocks[0].attn.params["wq"] is before  # optimizers keep working


def test_load_state_dict_names_the_bad_keys():
    model = small_lm()
    state = model.state_dict()
    missing = dict(state)
    del missing["head.b"]
    with pytest.raises(ValueError, match=r"missing keys \['head.b'\]"):
        model.load_state_dict(missing)
    with pytest.raises(ValueError, match=r"unexpected keys \['extra'\]"):
        model.load_state_dict({**state, "extra": np.zeros(1)})
    with pytest.raises(ValueError, match="head.w: expected"):
        model.load_state_dict({**state, "head.w": np.zeros((3, 3))})
    model.load_state_dict({**missing, "extra": np.zeros(1)}, strict=False)  # lenient
    with pytest.raises(ValueError, match="misshapen"):
        model.load_state_dict({"head.w": np.zeros((3, 3))}, strict=False)  # never lenient on shape


def test_train_and_eval_reach_every_child():
    model = small_lm()
    model.eval()
    dropouts = [m for block in model.decoder.blocks for m in block.children.values()
                if isinstance(m, Dropout)]
    assert len(dropouts) == 4 and not any(d.training for d in dropouts)
    assert not model.decoder.embed.drop.training
    model.train()
    assert all(d.training for d in dropouts)


def test_astype_converts_params_grads_and_buffers():
    model = small_lm(positions="sinusoidal").astype(np.float32)
    for name, param, grad in model.named_parameters():
        assert param.dtype == grad.dtype == np.float32, name
    assert model.decoder.embed.positions.buffers["table"].dtype == np.float32
    logits = model.forward(np.zeros((2, 4), dtype=int))
    assert logits.dtype == np.float32


def test_parameter_counts_of_the_chapters():
    # course chapter: MHA 4d^2 + 4d, pre-LN block 12d^2 + 13d
    assert MultiHeadAttention(32, 4).num_parameters() == 4_224
    assert MultiHeadAttention(32, 1).num_parameters() == 4_224  # whatever the head count
    assert EncoderBlock(64, 4, 256).num_parameters() == 49_984 == 12 * 64**2 + 13 * 64
    assert EncoderBlock(768, 12, 3072).num_parameters() == 7_087_872
    # textbook chapter: the character model
    char_model = DecoderLM(TransformerConfig(vocab=104, width=84, heads=4, layers=2,
                                             ffn_width=168, max_len=100, activation="relu",
                                             embed_scale=True))
    assert char_model.num_parameters() == 132_488

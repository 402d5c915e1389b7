"""Encoder and decoder blocks: pre/post-LN x every activation x both norms, against finite
differences; the decoder's causality and its cross-attention gradient to the memory."""

import numpy as np
import pytest
from _nn_helpers import assert_gradcheck

from numpy_transformer import config
from numpy_transformer import functional as F
from numpy_transformer.gradcheck import check_direction, check_module
from numpy_transformer.nn import DecoderBlock, EncoderBlock

B, T, T_SRC, C, H, FFN = 2, 4, 5, 8, 2, 12
GRID = pytest.mark.parametrize("norm_first", [True, False], ids=["preLN", "postLN"])
ACTS = pytest.mark.parametrize("activation", config.ACTIVATIONS)
NORMS = pytest.mark.parametrize("norm", config.NORMS)


def perturb(module, rng):
    """Move the norms off their ones/zeros init so every parameter shapes the output."""
    for name, param, _ in module.named_parameters():
        if "norm" in name:
            param += 0.3 * rng.normal(size=param.shape)
    return module


@GRID
@ACTS
@NORMS
def test_encoder_block(norm_first, activation, norm):
    rng = np.random.default_rng(11)
    block = perturb(EncoderBlock(C, H, FFN, norm=norm, activation=activation,
                                 norm_first=norm_first, rng=rng), rng)
    mask = F.key_padding_mask(np.array([T, 2]), T)
    assert_gradcheck(check_module(block, {"x": rng.normal(size=(B, T, C))}, mask=mask), block)


@GRID
@ACTS
@NORMS
def test_decoder_block_with_cross_attention(norm_first, activation, norm):
    rng = np.random.default_rng(12)
    block = perturb(DecoderBlock(C, H, FFN, cross=True, norm=norm, activation=activation,
                                 norm_first=norm_first, rng=rng), rng)
    inputs = {"x": rng.normal(size=(B, T, C)), "memory": rng.normal(size=(B, T_SRC, C))}
    memory_mask = F.key_padding_mask(np.array([T_SRC, 3]), T_SRC)
    report = check_module(block, inputs, memory_mask=memory_mask)
    assert [row.name for row in report.rows[:2]] == ["input x", "input memory"]
    assert_gradcheck(report, block)


@GRID
@pytest.mark.parametrize("positions", ["rope", "alibi"])
def test_decoder_block_self_attention_only(norm_first, positions):
    rng = np.random.default_rng(13)
    block = perturb(DecoderBlock(C, H, FFN, norm_first=norm_first, max_len=T,
                                 rope=positions == "rope", alibi=positions == "alibi",
                                 rng=rng), rng)
    assert_gradcheck(check_module(block, {"x": rng.normal(size=(B, T, C))}), block)


def test_random_direction_check_of_a_block():
    rng = np.random.default_rng(14)
    block = DecoderBlock(C, H, FFN, cross=True, activation="swiglu", rng=rng)
    inputs = {"x": rng.normal(size=(B, T, C)), "memory": rng.normal(size=(B, T_SRC, C))}
    assert check_direction(block, inputs).ok(1e-6)


def test_decoder_block_is_causal():
    rng = np.random.default_rng(15)
    block = DecoderBlock(C, H, FFN, rng=rng)
    x = rng.normal(size=(B, T, C))
    out = block.forward(x)
    x2 = x.copy()
    x2[:, -1] = rng.normal(size=(B, C))  # change the last token only
    out2 = block.forward(x2)
    np.testing.assert_array_equal(out2[:, :-1], out[:, :-1])  # bit-identical
    assert np.abs(out2[:, -1] - out[:, -1]).max() > 1e-3


def test_encoder_block_is_not_causal():
    rng = np.random.default_rng(16)
    block = EncoderBlock(C, H, FFN, rng=rng)
    x = rng.normal(size=(B, T, C))
    x2 = x.copy()
    x2[:, -1] = rng.normal(size=(B, C))  # (a constant shift would vanish in the LayerNorm)
    assert np.abs(block.forward(x2)[:, 0] - block.forward(x)[:, 0]).max() > 1e-3


def test_dropout_in_training_and_eval():
    rng = np.random.default_rng(17)
    block = EncoderBlock(C, H, FFN, dropout=0.5, rng=rng)
    x = rng.normal(size=(B, T, C))
    assert not np.array_equal(block.forward(x), block.forward(x))  # fresh masks each time
    block.eval()
    np.testing.assert_array_equal(block.forward(x), block.forward(x))
    with pytest.raises(ValueError, match="evaluation mode"):  # eval is inference: no cache
        block.backward(rng.normal(size=(B, T, C)))
    block = EncoderBlock(C, H, FFN, dropout=0.0, rng=rng)  # a deterministic gradient: no dropout
    assert_gradcheck(check_module(block, {"x": x}), block)


def test_memory_required_exactly_when_cross():
    rng = np.random.default_rng(18)
    x, memory = rng.normal(size=(B, T, C)), rng.normal(size=(B, T_SRC, C))
    with pytest.raises(ValueError, match="pass the encoder's memory"):
        DecoderBlock(C, H, FFN, cross=True, rng=rng).forward(x)
    with pytest.raises(ValueError, match="cross=False"):
        DecoderBlock(C, H, FFN, rng=rng).forward(x, memory)


def test_post_ln_output_is_normalised():
    rng = np.random.default_rng(19)
    out = EncoderBlock(C, H, FFN, norm_first=False, rng=rng).forward(rng.normal(size=(B, T, C)))
    np.testing.assert_allclose(out.mean(-1), 0.0, atol=1e-12)
    np.testing.assert_allclose(out.std(-1), 1.0, atol=1e-4)


def test_bad_options():
    with pytest.raises(ValueError, match="norm must be one of"):
        EncoderBlock(C, H, FFN, norm="batchnorm")
    with pytest.raises(ValueError, match="activation must be one of"):
        DecoderBlock(C, H, FFN, activation="tanh")
    with pytest.raises(ValueError, match="does not divide"):
        EncoderBlock(C, 3, FFN)


# ----------------------------------------------------------------------------- negative controls
def test_catches_a_backward_that_drops_the_residual_path():
    rng = np.random.default_rng(20)
    block = perturb(EncoderBlock(C, H, FFN, rng=rng), rng)

    def wrong_backward(dout):  # forgets "dres" at the FFN's residual addition
        dx1 = block.norm2.backward(block.ffn.backward(block.drop2.backward(dout)))
        return dx1 + block.norm1.backward(block.attn.backward(block.drop1.backward(dx1)))

    block.backward = wrong_backward
    report = check_module(block, {"x": rng.normal(size=(B, T, C))})
    with pytest.raises(AssertionError, match="input x"):
        assert_gradcheck(report, block)


def test_catches_a_wrong_key_bias_gradient():
    """The zero-gradient allowance for ``bk`` still fails a backward that writes a real value."""
    rng = np.random.default_rng(21)
    block = EncoderBlock(C, H, FFN, rng=rng)
    right_backward = block.attn.backward

    def wrong_backward(dout):
        dx = right_backward(dout)
        block.attn.grads["bk"] += 1e-3
        return dx

    block.attn.backward = wrong_backward
    report = check_module(block, {"x": rng.normal(size=(B, T, C))})
    with pytest.raises(AssertionError, match="attn.bk"):
        assert_gradcheck(report, block)

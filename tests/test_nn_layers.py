"""Every basic layer against central differences (float64, random upstream gradient)."""

import numpy as np
import pytest
from _nn_helpers import assert_gradcheck

from numpy_transformer import config
from numpy_transformer.gradcheck import check_module, numeric_grad
from numpy_transformer.nn import (
    Dropout,
    Embedding,
    FeedForward,
    LayerNorm,
    LearnedPositions,
    Linear,
    RMSNorm,
    SinusoidalPositions,
    TiedOutput,
)
from numpy_transformer.nn.layers import make_norm


@pytest.fixture
def rng():
    return np.random.default_rng(2024)


@pytest.mark.parametrize("bias", [True, False])
def test_linear(rng, bias):
    layer = Linear(5, 3, bias=bias, rng=rng)
    assert ("b" in layer.params) == bias
    assert_gradcheck(check_module(layer, {"x": rng.normal(size=(2, 4, 5))}), layer)


def test_linear_init_bound_like_torch(rng):
    layer = Linear(400, 300, rng=rng)
    bound = 1 / np.sqrt(400)
    for p in layer.params.values():
        assert np.abs(p).max() <= bound and np.abs(p).max() > 0.95 * bound


def test_embedding_accumulates_repeated_ids(rng):
    layer = Embedding(6, 4, rng=rng)
    ids = np.array([[1, 1, 3], [5, 1, 0]])
    assert_gradcheck(check_module(layer, {"ids": ids}), layer)
    layer.zero_grad()
    layer.forward(ids)
    g = rng.normal(size=(2, 3, 4))
    assert layer.backward(g) is None  # token ids have no gradient
    np.testing.assert_allclose(layer.grads["table"][1], g[0, 0] + g[0, 1] + g[1, 1])
    assert not layer.grads["table"][2].any()


def test_embedding_std(rng):
    table = Embedding(500, 40, std=0.1, rng=rng).params["table"]
    assert abs(table.std() - 0.1) < 0.005


def test_embedding_rejects_bad_ids(rng):
    layer = Embedding(6, 4, rng=rng)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        layer.forward(np.array([[0, 6]]))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        layer.forward(np.array([[-1, 2]]))
    with pytest.raises(ValueError, match="integer"):
        layer.forward(np.array([[0.0, 1.0]]))


def test_tied_output_adds_into_the_embedding_grad(rng):
    embedding = Embedding(7, 4, rng=rng)
    head = TiedOutput(embedding)
    assert head.num_parameters() == 0  # owns nothing: the table is counted once, in embedding
    x, g = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 3, 7))
    table = embedding.params["table"]
    np.testing.assert_allclose(head.forward(x), x @ table.T)
    embedding.grads["table"][...] = 1.0  # an earlier contribution that must be kept
    dx = head.backward(g)

    def loss():
        return float((head.forward(x) * g).sum())

    np.testing.assert_allclose(embedding.grads["table"] - 1.0, numeric_grad(loss, table),
                               rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dx, numeric_grad(loss, x), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("norm", config.NORMS)
def test_norms(rng, norm):
    layer = make_norm(norm, 6)
    for p in layer.params.values():  # move off the ones/zeros init so w and b matter
        p += rng.normal(size=p.shape)
    x = rng.normal(size=(2, 3, 6)) * 3 + 1
    assert_gradcheck(check_module(layer, {"x": x}), layer)


def test_norm_defaults():
    assert LayerNorm(4).eps == 1e-5 and set(LayerNorm(4).params) == {"w", "b"}
    assert RMSNorm(4).eps is None and set(RMSNorm(4).params) == {"w"}
    with pytest.raises(ValueError, match="norm must be one of"):
        make_norm("batchnorm", 4)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("activation", config.ACTIVATIONS)
def test_feed_forward(rng, activation, bias):
    layer = FeedForward(6, 10, activation, bias=bias, rng=rng)
    assert all(("b" in child.params) == bias for child in layer.children.values())
    assert_gradcheck(check_module(layer, {"x": rng.normal(size=(2, 3, 6))}), layer)


def test_feed_forward_sizes():
    assert FeedForward(6, 10, "gelu").num_parameters() == 6 * 10 + 10 + 10 * 6 + 6
    assert FeedForward(6, 10, "swiglu").num_parameters() == 2 * (6 * 10 + 10) + 10 * 6 + 6
    assert FeedForward(6, 10, "swiglu", bias=False).num_parameters() == 3 * 6 * 10
    with pytest.raises(ValueError, match="activation must be one of"):
        FeedForward(6, 10, "tanh")


def test_dropout_reuses_its_mask_and_scales(rng):
    layer = Dropout(0.25, seed=3)
    x, g = rng.normal(size=(40, 50)), rng.normal(size=(40, 50))
    out = layer.forward(x)
    kept = out != 0
    assert abs(1 - kept.mean() - 0.25) < 0.03
    np.testing.assert_allclose(out[kept], x[kept] / 0.75)
    dx = layer.backward(g)
    np.testing.assert_allclose(dx, g * kept / 0.75)  # exactly the forward's mask
    assert not np.array_equal(layer.forward(x) != 0, kept)  # a new forward draws a new mask


def test_dropout_is_seeded_and_identity_in_eval(rng):
    x = rng.normal(size=(4, 5))
    np.testing.assert_array_equal(Dropout(0.5, seed=1).forward(x), Dropout(0.5, seed=1).forward(x))
    layer = Dropout(0.5, seed=1).eval()
    assert layer.forward(x) is x
    with pytest.raises(ValueError, match="evaluation mode"):  # inference keeps nothing
        layer.backward(x)
    assert Dropout(0.0).forward(x) is x
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(1.0)


def test_sinusoidal_positions(rng):
    layer = SinusoidalPositions(6, 4)
    assert layer.num_parameters() == 0 and layer.state_dict() == {}  # a buffer, not a parameter
    x = rng.normal(size=(2, 5, 4))
    out = layer.forward(x)
    np.testing.assert_allclose(out[:, 1, 0] - x[:, 1, 0], np.sin(1.0))
    np.testing.assert_allclose(out[:, 1, 1] - x[:, 1, 1], np.cos(1.0))
    assert_gradcheck(check_module(layer, {"x": x}), layer)


def test_learned_positions(rng):
    layer = LearnedPositions(6, 4, rng=rng)
    assert layer.num_parameters() == 24
    assert_gradcheck(check_module(layer, {"x": rng.normal(size=(2, 5, 4))}), layer)
    assert not layer.grads["table"][5].any()  # row 5 was not used at T = 5


@pytest.mark.parametrize("cls", [SinusoidalPositions, LearnedPositions])
def test_positions_reject_long_sequences_and_wrong_width(rng, cls):
    layer = cls(4, 6)
    with pytest.raises(ValueError, match="exceeds"):
        layer.forward(rng.normal(size=(1, 5, 6)))
    with pytest.raises(ValueError, match="width"):
        layer.forward(rng.normal(size=(1, 3, 4)))


def test_sinusoidal_needs_even_width():
    with pytest.raises(ValueError, match="even width"):
        SinusoidalPositions(4, 5)

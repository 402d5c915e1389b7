"""Dropout on the attention weights: the reference pair with a fixed mask by finite differences
(with a negative control), the module and the blocks, both backends, eval mode, the config and
a command-line run that resumes bit for bit.

Finite differences need the same mask in every forward: the reference pair takes the mask as
an argument; the module's generator is replaced by one that returns the same uniform draws
on every call (``_Replay``).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _run_helpers import TINY, resumed_to_equal_steps, run_cli, small_text

from numpy_transformer import functional as F
from numpy_transformer import nn
from numpy_transformer.gradcheck import check_module, check_op

TOL = 1e-6  # finite differences, float64
B, H, T, D = 2, 4, 5, 3
P = 0.3


def _qkv(rng, kv_heads=H):
    return (rng.normal(size=(B, H, T, D)), rng.normal(size=(B, kv_heads, T, D)),
            rng.normal(size=(B, kv_heads, T, D)))


def _mask_of_weights(rng, dtype=np.float64):
    return F.dropout_mask((B, H, T, T), P, rng, dtype)


@pytest.mark.parametrize("kv_heads", [H, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_the_reference_pair_with_dropout_by_finite_differences(kv_heads, causal):
    rng = np.random.default_rng(0)
    q, k, v = _qkv(rng, kv_heads)
    drop = _mask_of_weights(rng)
    assert 0 < (drop == 0).mean() < 1  # some weights dropped, some kept
    mask = F.causal_mask(T) if causal else None
    report = check_op(lambda q, k, v: F.sdpa_forward(q, k, v, mask, dropout=drop),
                      F.sdpa_backward, {"q": q, "k": k, "v": v})
    assert report.ok(TOL), str(report)


def test_a_backward_that_ignores_the_dropout_before_the_softmax_fails_the_check():
    """Negative control: dp~ taken for dp (the multipliers left out of the softmax's input)."""
    rng = np.random.default_rng(1)
    q, k, v = _qkv(rng)
    drop = _mask_of_weights(rng)

    def wrong_backward(dout, cache):  # the dropout's v-path only: (5) with p~, (4) with dp~
        dv = (cache.probs * cache.dropout).swapaxes(-1, -2) @ dout
        dq, dk, _ = F.sdpa_backward(dout, cache._replace(dropout=None))
        return dq, dk, dv

    forward = lambda q, k, v: F.sdpa_forward(q, k, v, dropout=drop)  # noqa: E731
    assert check_op(forward, F.sdpa_backward, {"q": q, "k": k, "v": v}).ok(TOL)
    wrong = check_op(forward, wrong_backward, {"q": q, "k": k, "v": v})
    assert not wrong.ok(TOL), str(wrong)


def test_ones_for_multipliers_is_attention_without_dropout():
    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng)
    plain, _ = F.sdpa_forward(q, k, v, F.causal_mask(T))
    ones, _ = F.sdpa_forward(q, k, v, F.causal_mask(T), dropout=np.ones((1, 1, T, T)))
    np.testing.assert_array_equal(ones, plain)


@pytest.mark.parametrize("bad, message", [
    (np.ones((B, H, T, T), np.float32), "dropout must have q's dtype float64"),
    (np.ones((B, H, T, 2)), "does not broadcast"),
    (np.ones((B, H, T, T), bool), "dropout"),
])
def test_the_pair_refuses_multipliers_that_do_not_fit(bad, message):
    q, k, v = _qkv(np.random.default_rng(3))
    for sdpa in (F.sdpa_forward, _numba_sdpa()):
        with pytest.raises(ValueError, match=message):
            sdpa(q, k, v, dropout=bad)


def _numba_sdpa():
    from numpy_transformer.kernels import attention

    return attention.sdpa_forward


class _Replay:
    """A stand-in generator whose ``random`` returns the same draws on every call."""

    def __init__(self, seed: int) -> None:
        self.draws: dict[tuple, np.ndarray] = {}
        self.rng = np.random.default_rng(seed)

    def random(self, shape):
        if tuple(shape) not in self.draws:
            self.draws[tuple(shape)] = self.rng.random(shape)
        return self.draws[tuple(shape)]


def _replayed(module):
    for _, m in module.named_modules():
        if isinstance(m, nn.MultiHeadAttention) and m.drop is not None:
            m.drop.rng = _Replay(7)
    return module


@pytest.mark.parametrize("cross", [False, True])
def test_the_block_with_attention_dropout_by_finite_differences(cross):
    rng = np.random.default_rng(4)
    x, memory = rng.normal(size=(2, 4, 8)), rng.normal(size=(2, 3, 8))
    block = _replayed(nn.DecoderBlock(8, 2, 16, cross=cross, attn_dropout=P, rng=rng,
                                      backend="numpy"))
    inputs = {"x": x, "memory": memory} if cross else {"x": x}
    report = check_module(block, inputs)
    assert report.ok(TOL), str(report)
    assert block.attn.cache.sdpa.dropout is not None  # the dropout did act


def _model(backend: str, attn_dropout: float = P, **kw) -> nn.DecoderLM:
    return nn.DecoderLM(nn.TransformerConfig(**{**dict(
        vocab=7, width=8, heads=2, layers=2, ffn_width=16, max_len=6, positions="learned",
        attn_dropout=attn_dropout, backend=backend, seed=3), **kw}))


def test_both_backends_draw_the_same_masks_and_agree():
    tokens = np.random.default_rng(5).integers(0, 7, size=(2, 6))
    models = [_model(b) for b in ("numpy", "numba")]
    logits = [m.forward(tokens) for m in models]
    g = np.random.default_rng(6).normal(size=logits[0].shape)
    for m in models:
        m.backward(g)
    np.testing.assert_allclose(logits[1], logits[0], rtol=0, atol=1e-12)
    grads = [{n: d for n, _, d in m.named_parameters()} for m in models]
    for name, d in grads[0].items():
        np.testing.assert_allclose(grads[1][name], d, rtol=0, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_the_dropout_acts_in_training_only_and_leaves_the_initial_weights(backend):
    tokens = np.random.default_rng(7).integers(0, 7, size=(2, 6))
    with_drop, without = _model(backend), _model(backend, attn_dropout=0.0)
    for (name, a, _), (_, b, _) in zip(with_drop.named_parameters(), without.named_parameters(),
                                       strict=True):
        np.testing.assert_array_equal(a, b, err_msg=name)  # rng.spawn draws no weights
    trained = with_drop.forward(tokens)
    assert np.abs(trained - without.forward(tokens)).max() > 1e-3  # it drops in training
    np.testing.assert_array_equal(with_drop.eval().forward(tokens),
                                  without.eval().forward(tokens))


@pytest.mark.parametrize("value", [1.0, -0.1, "0.1", float("nan")])
def test_the_config_and_the_module_refuse_a_rate_outside_0_1(value):
    with pytest.raises(ValueError, match="attn_dropout"):
        _model("numpy", attn_dropout=value).config.validate()
    with pytest.raises(ValueError, match="dropout"):
        nn.MultiHeadAttention(8, 2, dropout=value)


def test_a_command_line_run_with_attention_dropout_resumes_bit_for_bit(tmp_path):
    text = small_text(tmp_path)
    flags = [*TINY, "--attn-dropout", "0.2", "--text", text, "--quiet"]
    short, long = tmp_path / "short", tmp_path / "long"
    for run, steps in ((short, 2), (long, 4)):
        code, _, err = run_cli(["train", *flags, "--steps", str(steps), "--out", run])
        assert code == 0, err
    assert json.loads((short / "config.json").read_text())["config"]["attn_dropout"] == 0.2
    mine, _ = resumed_to_equal_steps(short, long, 4)
    assert any("attn.drop" in name for name in mine.rng)  # its generator is carried

"""The library's API refuses, with a ``ValueError`` naming the argument, on both backends:
empty sequences and head width 0 in attention, float16 on the numba backend, ``backward``
before ``forward`` in every module, an upstream gradient of the wrong shape for every module
and every functional backward, a lone surrogate in ``CharTokenizer`` (issue 14, item 9), a
junk cache given to the LSTM's backward and a negative seed (issue 43).

The kernels' own checks, argument by argument, are in ``tests/test_kernel_inputs.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from numpy_transformer import nn
from numpy_transformer.backend import get_backend
from numpy_transformer.config import (
    BACKENDS,
    ELEMENTWISE_ACTIVATIONS,
    LSTMConfig,
    TransformerConfig,
)
from numpy_transformer.data import CharTokenizer
from numpy_transformer.functional.masks import causal_mask
from numpy_transformer.nn.module import Module

B, T, C, H, V = 2, 4, 8, 2, 11


def arr(*shape, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def tokens(t=T):
    return np.random.default_rng(1).integers(0, V, size=(B, t))


# --------------------------------------------------------------------------- attention
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where, shapes", [
    ("T_q = 0", ((B, H, 0, 4), (B, H, 5, 4))),
    ("T_k = 0", ((B, H, 3, 4), (B, H, 0, 4))),
    ("D = 0", ((B, H, 3, 0), (B, H, 5, 0))),
])
def test_attention_refuses_empty_sequences_and_heads(backend, where, shapes):
    ops = get_backend(backend)
    q_shape, kv_shape = shapes
    name = "k" if where == "T_k = 0" else "q"
    with pytest.raises(ValueError, match=f"{name} has an axis of length 0"):
        ops.sdpa_forward(arr(*q_shape), arr(*kv_shape), arr(*kv_shape))


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_module_refuses_empty_sequences(backend):
    attn = nn.MultiHeadAttention(C, H, backend=backend, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="x has an axis of length 0"):
        attn(arr(B, 0, C))
    with pytest.raises(ValueError, match="context has an axis of length 0"):
        attn(arr(B, T, C), arr(B, 0, C))
    model = nn.DecoderLM(TransformerConfig(vocab=V, width=C, heads=H, layers=1, ffn_width=16,
                                           max_len=8, backend=backend))
    with pytest.raises(ValueError, match="tokens must have shape"):
        model.forward(np.zeros((B, 0), dtype=int))


# --------------------------------------------------------------------------- float16
@pytest.mark.parametrize("build", [
    lambda: nn.Linear(C, 5, dtype=np.float16, backend="numba"),
    lambda: nn.LayerNorm(C, dtype=np.float16, backend="numba"),
    lambda: nn.MultiHeadAttention(C, H, dtype=np.float16, backend="numba"),
    lambda: nn.FeedForward(C, 16, "relu", dtype=np.float16, backend="numba"),
], ids=["Linear", "LayerNorm", "MultiHeadAttention", "FeedForward"])
def test_numba_backend_refuses_float16(build):
    with pytest.raises(ValueError, match="float32 or float64 on the numba backend, got float16"):
        build()(arr(B, T, C, dtype=np.float16))


def test_float16_still_runs_on_the_numpy_backend():
    out = nn.LayerNorm(C, dtype=np.float16, backend="numpy")(arr(B, T, C, dtype=np.float16))
    assert out.dtype == np.float16


# --------------------------------------------------------------------------- modules
def _config(backend, **kw):
    return TransformerConfig(vocab=V, width=C, heads=H, layers=1, ffn_width=16, max_len=8,
                             backend=backend, **{"num_classes": 3, **kw})


# Each module with a valid forward call: name -> (build(backend), forward(module))
MODULES: dict[str, tuple[Callable, Callable]] = {
    "Linear": (lambda be: nn.Linear(C, 5, backend=be), lambda m: m(arr(B, T, C))),
    "Embedding": (lambda be: nn.Embedding(V, C, backend=be), lambda m: m(tokens())),
    "TiedOutput": (lambda be: nn.TiedOutput(nn.Embedding(V, C, backend=be)),
                   lambda m: m(arr(B, T, C))),
    "LayerNorm": (lambda be: nn.LayerNorm(C, backend=be), lambda m: m(arr(B, T, C))),
    "RMSNorm": (lambda be: nn.RMSNorm(C, backend=be), lambda m: m(arr(B, T, C))),
    "Dropout": (lambda be: nn.Dropout(0.0), lambda m: m(arr(B, T, C))),
    "FeedForward": (lambda be: nn.FeedForward(C, 16, "gelu", backend=be),
                    lambda m: m(arr(B, T, C))),
    "MultiHeadAttention": (lambda be: nn.MultiHeadAttention(C, H, backend=be),
                           lambda m: m(arr(B, T, C), mask=causal_mask(T))),
    "SinusoidalPositions": (lambda be: nn.SinusoidalPositions(8, C),
                            lambda m: m(arr(B, T, C))),
    "LearnedPositions": (lambda be: nn.LearnedPositions(8, C), lambda m: m(arr(B, T, C))),
    "EncoderBlock": (lambda be: nn.EncoderBlock(C, H, 16, backend=be),
                     lambda m: m(arr(B, T, C))),
    "DecoderBlock": (lambda be: nn.DecoderBlock(C, H, 16, cross=True, backend=be),
                     lambda m: m(arr(B, T, C), arr(B, 3, C, seed=2))),
    "Embeddings": (lambda be: nn.Embeddings(_config(be), np.random.default_rng(0)),
                   lambda m: m(tokens())),
    "Encoder": (lambda be: nn.Encoder(_config(be), np.random.default_rng(0)),
                lambda m: m(tokens())),
    "Decoder": (lambda be: nn.Decoder(_config(be), np.random.default_rng(0)),
                lambda m: m(tokens())),
    "EncoderClassifier": (lambda be: nn.EncoderClassifier(_config(be)), lambda m: m(tokens())),
    "DecoderLM": (lambda be: nn.DecoderLM(_config(be, num_classes=None)),
                  lambda m: m(tokens())),
    "EncoderDecoder": (lambda be: nn.EncoderDecoder(_config(be, num_classes=None)),
                       lambda m: m(tokens(), tokens(3))),
    "LSTM": (lambda be: nn.LSTM(C, 6, layers=2, backend=be), lambda m: m(arr(B, T, C))),
    "LSTMLM": (lambda be: nn.LSTMLM(LSTMConfig(vocab=V, hidden=6, max_len=8, embed=5,
                                               backend=be)), lambda m: m(tokens())),
}
# the relu FFN is one pass on the numba backend, with its own checks: check it too
MODULES["FeedForward(relu)"] = (lambda be: nn.FeedForward(C, 16, "relu", backend=be),
                                MODULES["FeedForward"][1])
MODULES["FeedForward(swiglu)"] = (lambda be: nn.FeedForward(C, 16, "swiglu", backend=be),
                                  MODULES["FeedForward"][1])


def test_every_module_has_a_case():
    classes = {name for name in nn.__all__ if isinstance(getattr(nn, name), type)
               and issubclass(getattr(nn, name), Module)} - {"Module", "ModuleList"}
    assert classes and classes <= set(MODULES), classes - set(MODULES)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(MODULES))
def test_backward_before_forward_raises(name, backend):
    module = MODULES[name][0](backend)
    with pytest.raises(ValueError, match=r"\.backward needs a forward first"):
        module.backward(arr(B, T, C))


def _bad_gradients(out: np.ndarray):
    yield "one column short", out[..., :-1]
    yield "one row", out[:1]  # NumPy would broadcast it to every row
    yield "one row more", np.concatenate([out, out[:1]])
    yield "another dtype", out.astype(np.float32)
    yield "a list", out.tolist()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(MODULES))
def test_backward_refuses_a_misshapen_gradient(name, backend):
    build, forward = MODULES[name]
    module = build(backend)
    out = forward(module)
    for label, dout in _bad_gradients(arr(*out.shape, seed=3)):
        with pytest.raises(ValueError, match="must (have shape|be float64)"):
            module.backward(dout)
        assert label  # (the label names the case in a failure's traceback)
    module.backward(arr(*out.shape, seed=3))  # the control: a right gradient runs


def test_positions_added_by_the_embeddings_take_any_batch():
    """Embeddings add the position rows themselves (``addend``): the backward then takes
    (B, T, C) for any B, but still refuses another T or C."""
    positions = nn.LearnedPositions(8, C)
    positions.addend(T)
    positions.backward(arr(3, T, C))
    with pytest.raises(ValueError, match=r"\(B, 4, 8\)"):
        positions.backward(arr(3, T + 1, C))


# --------------------------------------------------------------------------- functional
def _lstm_out_and_cache(ops, x, hidden=3):
    out, _, cache = ops.lstm_forward(x, None, None, arr(C, 4 * hidden, seed=6),
                                     arr(hidden, 4 * hidden, seed=7), arr(4 * hidden, seed=8))
    return out, cache


def _ops_cases(ops):
    """name -> (forward call returning (out, cache), backward(dout, cache)) for every
    backward of a backend."""
    x, w, b = arr(B, T, C), arr(C), arr(C)
    q, k = arr(B, H, T, 4), arr(B, H, 5, 4)
    cos, sin = ops.rope_tables(T, 4)
    ids = tokens()
    logits, targets = arr(B, T, V), tokens()
    cases = {
        "linear_backward": (lambda: ops.linear_forward(x, arr(C, 5)), ops.linear_backward),
        "linear_heads_backward": (  # one projection, two heads: its one gradient as dout
            lambda: (lambda ys, cache: (ys[0], cache))(
                *ops.linear_heads_forward(x, (arr(C, 4, seed=9),), None, 2)),
            lambda d, c: ops.linear_heads_backward((d,), c)),
        "layer_norm_backward": (lambda: ops.layer_norm_forward(x, w, b),
                                ops.layer_norm_backward),
        "rms_norm_backward": (lambda: ops.rms_norm_forward(x, w), ops.rms_norm_backward),
        "sdpa_backward": (lambda: ops.sdpa_forward(q, k, k), ops.sdpa_backward),
        "embedding_backward": (lambda: ops.embedding_forward(ids, arr(V, C)),
                               ops.embedding_backward),
        "embeddings_backward": (lambda: ops.embeddings_forward(ids, arr(V, C), 2.0),
                                lambda d, c: ops.embeddings_backward(d, c, 2.0)),
        "feed_forward_backward": (lambda: ops.feed_forward_forward(
            x, {"up": (arr(C, 16), arr(16)), "down": (arr(16, C), arr(C))}, "relu"),
            ops.feed_forward_backward),
        "softmax_backward": (lambda: ops.softmax_forward(x), ops.softmax_backward),
        "swiglu_backward": (lambda: ops.swiglu_forward(x, arr(B, T, C, seed=5)),
                            ops.swiglu_backward),
        "dropout_backward": (lambda: ops.dropout_forward(x, 0.5, np.random.default_rng(0)),
                             ops.dropout_backward),
        "rope_backward": (lambda: (ops.rope_forward(q, cos, sin), None),
                          lambda d, _: ops.rope_backward(d, cos, sin)),
        "lstm_backward": (lambda: _lstm_out_and_cache(ops, x),
                          lambda d, c: ops.lstm_backward(d, None, None, c)),
    }
    for act in ELEMENTWISE_ACTIVATIONS:
        forward, backward = ops.activation(act)
        cases[f"{act}_backward"] = (lambda forward=forward: forward(x), backward)
    return cases, (logits, targets)


def test_every_functional_backward_has_a_case():
    for backend in BACKENDS:
        ops = get_backend(backend)
        names = {n for n in vars(ops) if "_backward" in n} - set(_LOSS_BACKWARDS)
        cases, _ = _ops_cases(ops)
        assert names == set(cases), names ^ set(cases)


@pytest.mark.parametrize("backend", BACKENDS)
def test_functional_backward_refuses_a_misshapen_gradient(backend):
    ops = get_backend(backend)
    cases, _ = _ops_cases(ops)
    for name, (forward, backward) in cases.items():
        out, cache = forward()
        # rope has no cache: any batch is its input's, only (T, D) is fixed by the tables
        labels = ("one column short", "a list") if name == "rope_backward" else (
            "one column short", "one row", "one row more", "a list")
        for label in labels:
            dout = dict(_bad_gradients(arr(*out.shape, seed=3)))[label]
            with pytest.raises(ValueError, match="dout|dy"):
                backward(dout, cache)
                pytest.fail(f"{backend} {name} took a dout of {label}")
        backward(arr(*out.shape, seed=3), cache)  # the control


# the backwards of a loss, whose upstream gradient is a number (dloss), not an array
_LOSS_BACKWARDS = {
    "cross_entropy_backward": lambda ops, logits, targets: ops.cross_entropy_forward(logits,
                                                                                     targets),
    "linear_cross_entropy_backward": lambda ops, logits, targets: (
        ops.linear_cross_entropy_forward(logits, arr(V, V), None, targets)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", _LOSS_BACKWARDS)
def test_a_loss_backward_refuses_an_array_dloss(backend, name):
    ops = get_backend(backend)
    _, (logits, targets) = _ops_cases(ops)
    _, cache = _LOSS_BACKWARDS[name](ops, logits, targets)
    with pytest.raises(ValueError, match="dloss must be a real number"):
        getattr(ops, name)(np.ones(B * T), cache)
    getattr(ops, name)(0.5, cache)  # the control


@pytest.mark.parametrize("backend", BACKENDS)
def test_embedding_backward_does_not_broadcast_one_row(backend):
    """The case of issue 14: NumPy's scatter-add spread a one-row dout over every id."""
    ops = get_backend(backend)
    _, cache = ops.embedding_forward(tokens(), arr(V, C))
    with pytest.raises(ValueError, match=r"dout must have shape \(2, 4, 8\)"):
        ops.embedding_backward(arr(1, C), cache)


# --------------------------------------------------------------------------- tokenizer
def test_tokenizer_refuses_a_lone_surrogate():
    tok = CharTokenizer("abc")
    with pytest.raises(ValueError, match=r"text holds a lone surrogate U\+DC80 at position 2"):
        tok.encode("ab\udc80", unknown="skip")
    with pytest.raises(ValueError, match=r"U\+D800 at position 3"):
        CharTokenizer("abc\ud800d")


# --------------------------------------------------------------------------- issue 43
def refuses(call: Callable, *words: str) -> None:
    """``call()`` raises ``ValueError`` naming each of ``words``; any other exception (the
    foreign ones these cases used to raise) escapes and fails the test."""
    with pytest.raises(ValueError) as caught:
        call()
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))


def test_refuses_lets_a_foreign_exception_fail_the_test():
    """Negative control: a stub that raises KeyError, as adam_from_torch did, is not taken for
    a refusal."""
    with pytest.raises(KeyError):
        refuses(lambda: {}["exp_avg"], "exp_avg")
    with pytest.raises(AssertionError):  # a ValueError that does not name the value
        refuses(lambda: int("x"), "seed")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("junk", [(1, 2), None, "cache", ()])
def test_lstm_backward_refuses_a_junk_cache(backend, junk):
    ops = get_backend(backend)
    refuses(lambda: ops.lstm_backward(arr(B, T, 5), None, None, junk),
            "cache must be the LSTMCache", type(junk).__name__)


@pytest.mark.parametrize("make", [
    lambda seed: nn.LSTMLM(LSTMConfig(vocab=V, hidden=4, max_len=T, backend="numpy",
                                      seed=seed)),
    lambda seed: nn.DecoderLM(TransformerConfig(vocab=V, width=C, heads=H, layers=1,
                                                ffn_width=8, max_len=T, backend="numpy",
                                                seed=seed)),
])
def test_a_negative_seed_is_named(make):
    refuses(lambda: make(-1), "seed must be an integer >= 0, got -1")
    assert make(0) is not None  # the control: seed 0 builds

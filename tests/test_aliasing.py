"""No cache aliases memory that is written later (issue 23, item 6).

A functional pair's cache owns what it keeps: after ``out, cache = f_forward(x, w, ...)`` the
caller may write into every array it passed (inputs, weights, masks, states), and
``f_backward(dout, cache)`` must return, bit for bit, what it returns without those writes.
A module keeps the same promise for what its caller passed in or holds (inputs, masks, a
carried state; not the parameters) between ``forward`` and ``backward``.

Each check runs one computation twice from identical inputs: once plainly, once with every
such array overwritten in place by noise between the forward and the backward, and compares
the two backwards (random upstream gradients, never ones). The pairs are every
``<name>_forward`` that has a ``<name>_backward`` in a backend's namespace: a pair without a
case in ``PAIR_CASES`` fails. A toy pair and a toy module that keep their input by reference
are the negative controls.

To add an operation: one entry in ``PAIR_CASES`` (name -> function building its inputs).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from _aliasing_helpers import ModuleCase, PairCase, module_difference, pair_difference

from numpy_transformer import nn
from numpy_transformer.backend import get_backend
from numpy_transformer.config import ACTIVATIONS, BACKENDS, DTYPES
from numpy_transformer.functional.feedforward import feed_forward_weight_names
from numpy_transformer.functional.masks import causal_mask
from numpy_transformer.functional.positional import alibi_bias, rope_tables


# ----------------------------------------------------------------------------- pair cases
def _normal(rng: np.random.Generator, dtype, *shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def _one_input(rng, dtype):
    return PairCase([_normal(rng, dtype, 2, 3, 5)])


def _mask(rng, *shape) -> np.ndarray:
    """A random boolean mask whose every row may attend key 0 (True = may attend)."""
    mask = rng.random(shape) < 0.6
    mask[..., 0] = True
    return mask


def _cross_entropy(rng, dtype):
    targets = rng.integers(0, 6, (2, 4))
    targets[0, 1] = -100
    mask = _mask(rng, 2, 4)
    return PairCase([_normal(rng, dtype, 2, 4, 6), targets], dict(ignore_index=-100, mask=mask))


def _linear_cross_entropy(rng, dtype):
    """A vocabulary wide enough for the numba kernel's blocks (``kernels/head_loss.py``)."""
    vocab = 4096 + 5
    targets = rng.integers(0, vocab, (2, 4))
    targets[0, 1] = -100
    return PairCase([_normal(rng, dtype, 2, 4, 3), _normal(rng, dtype, 3, vocab),
                     _normal(rng, dtype, vocab), targets],
                    dict(ignore_index=-100, mask=_mask(rng, 2, 4)))


def _embeddings(rng, dtype):
    ids, table = rng.integers(0, 5, (2, 4)), _normal(rng, dtype, 5, 3)
    return PairCase([ids, table, 1.5, _normal(rng, dtype, 4, 3)],
                    call=lambda backward, douts, cache: backward(*douts, cache, 1.5))


def _rope(rng, dtype):
    """RoPE keeps no cache: the caller gives its backward the tables again (clean ones)."""
    cos, sin = rope_tables(5, 4, dtype=dtype)
    tables = (cos.copy(), sin.copy())
    return PairCase([_normal(rng, dtype, 2, 2, 5, 4), cos, sin],
                    split=lambda out: ((out,), None),
                    call=lambda backward, douts, _: backward(*douts, *tables))


def _lstm(rng, dtype):
    b, t, c, h = 3, 4, 2, 5
    return PairCase([_normal(rng, dtype, b, t, c), _normal(rng, dtype, b, h),
                     _normal(rng, dtype, b, h), 0.5 * _normal(rng, dtype, c, 4 * h),
                     0.5 * _normal(rng, dtype, h, 4 * h), _normal(rng, dtype, 4 * h)],
                    split=lambda result: ((result[0], *result[1]), result[2]))


def _linear_heads(rng, dtype):
    """Two projections of one source, 256 rows: the numba kernel's own path."""
    return PairCase([_normal(rng, dtype, 2, 128, 4),
                     (_normal(rng, dtype, 4, 6), _normal(rng, dtype, 4, 6)),
                     (_normal(rng, dtype, 6), _normal(rng, dtype, 6)), 2],
                    split=lambda result: (result[0], result[1]),
                    call=lambda backward, douts, cache: backward(douts, cache))


def _sdpa(rng, dtype, heads: int = 2, kv_heads: int = 2):
    q = _normal(rng, dtype, 2, heads, 5, 4)
    k, v = (_normal(rng, dtype, 2, kv_heads, 6, 4) for _ in range(2))
    return PairCase([q, k, v], dict(mask=_mask(rng, 2, 1, 5, 6),
                                    bias=alibi_bias(heads, 5, 6, dtype=dtype)))


def _feed_forward(activation: str) -> Callable[[np.random.Generator, np.dtype], PairCase]:
    """The network with ``activation`` and biases, 256 rows (the one-pass kernel's own path
    for ReLU); the weights are the caller's too, overwritten alike."""
    def build(rng, dtype):
        weights = {name: (_normal(rng, dtype, *((8, 4) if name == "down" else (4, 8))),
                          _normal(rng, dtype, 4 if name == "down" else 8))
                   for name in feed_forward_weight_names(activation)}
        return PairCase([_normal(rng, dtype, 2, 128, 4), weights, activation],
                        call=_dx_and_grads)
    return build


def _dx_and_grads(backward, douts, cache) -> tuple:
    """The backward's ``(dx, {name: (dw, db)})`` as one flat tuple, names in order."""
    dx, grads = backward(*douts, cache)
    return (dx, *(grads[name] for name in sorted(grads)))


# linear, linear_heads and feed_forward with 256 rows: the numba kernels' own path, not their
# reference's
# (the feed-forward network with every other activation: its own test below)
PAIR_CASES: dict[str, Callable[[np.random.Generator, np.dtype], PairCase]] = {
    "relu": _one_input, "gelu": _one_input, "gelu_tanh": _one_input, "silu": _one_input,
    "softmax": _one_input,
    "swiglu": lambda rng, dtype: PairCase([_normal(rng, dtype, 2, 3, 5),
                                           _normal(rng, dtype, 2, 3, 5)]),
    "dropout": lambda rng, dtype: PairCase([_normal(rng, dtype, 2, 3, 5), 0.4,
                                            np.random.default_rng(rng.integers(2**32))]),
    "cross_entropy": _cross_entropy,
    "linear_cross_entropy": _linear_cross_entropy,
    "embedding": lambda rng, dtype: PairCase([rng.integers(0, 5, (2, 4)),
                                              _normal(rng, dtype, 5, 3)]),
    "embeddings": _embeddings,
    "layer_norm": lambda rng, dtype: PairCase([_normal(rng, dtype, 2, 3, 5),
                                               _normal(rng, dtype, 5),
                                               _normal(rng, dtype, 5), 1e-5]),
    "rms_norm": lambda rng, dtype: PairCase([_normal(rng, dtype, 2, 3, 5),
                                             _normal(rng, dtype, 5)]),
    "rope": _rope,
    "lstm": _lstm,
    "linear": lambda rng, dtype: PairCase([_normal(rng, dtype, 2, 128, 4),
                                           _normal(rng, dtype, 4, 6), _normal(rng, dtype, 6)]),
    "linear_heads": _linear_heads,
    "sdpa": _sdpa,
    "feed_forward": _feed_forward("relu"),
}

def functional_pairs(backend: str) -> list[str]:
    """Every ``<name>`` whose ``<name>_forward`` and ``<name>_backward`` the backend has."""
    ops = vars(get_backend(backend))
    return sorted(name.removesuffix("_forward") for name in ops if name.endswith("_forward")
                  and name.removesuffix("_forward") + "_backward" in ops)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend, pair", [
    (backend, pair) for backend in BACKENDS for pair in functional_pairs(backend)])
def test_a_pairs_backward_ignores_writes_into_the_callers_arrays(backend, pair, dtype):
    if pair not in PAIR_CASES:
        pytest.fail(f"no case for pair {pair}: add one to PAIR_CASES")
    ops = get_backend(backend)
    moved = pair_difference(getattr(ops, f"{pair}_forward"), getattr(ops, f"{pair}_backward"),
                            PAIR_CASES[pair], dtype)
    assert not moved, f"{backend} {pair}: the backward's {moved} changed"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_the_feed_forward_network_ignores_writes_with_every_activation(activation, backend,
                                                                       dtype):
    ops = get_backend(backend)
    moved = pair_difference(ops.feed_forward_forward, ops.feed_forward_backward,
                            _feed_forward(activation), dtype)
    assert not moved, f"{backend} feed_forward({activation}): the backward's {moved} changed"


# a pair's other paths: grouped-query attention (4 query heads read 2 kv heads, whose
# gradients the backward sums; the numba kernel's repeated copies)
VARIANT_CASES: dict[str, tuple[str, Callable[[np.random.Generator, np.dtype], PairCase]]] = {
    "sdpa (grouped-query)": ("sdpa", lambda rng, dtype: _sdpa(rng, dtype, 4, 2)),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", VARIANT_CASES)
def test_a_pairs_other_paths_ignore_writes_into_the_callers_arrays(variant, backend, dtype):
    pair, case = VARIANT_CASES[variant]
    ops = get_backend(backend)
    moved = pair_difference(getattr(ops, f"{pair}_forward"), getattr(ops, f"{pair}_backward"),
                            case, dtype)
    assert not moved, f"{backend} {variant}: the backward's {moved} changed"


def test_every_pair_case_names_a_pair():
    """A case left behind by an operation that is gone (or misspelt) fails too."""
    pairs = {pair for backend in BACKENDS for pair in functional_pairs(backend)}
    assert set(PAIR_CASES) <= pairs, sorted(set(PAIR_CASES) - pairs)


# ----------------------------------------------------------------------------- module cases
def _x(rng, dtype, t: int = 5) -> np.ndarray:
    return _normal(rng, dtype, 2, t, 8)  # (B, T, C)


def _transformer(dtype, backend, **kw) -> nn.TransformerConfig:
    return nn.TransformerConfig(**{**dict(vocab=7, width=8, heads=2, layers=1, ffn_width=16,
                                          max_len=6, backend=backend, dtype=dtype.name), **kw})


def _lstm_lm(rng, dtype, backend, state: bool) -> ModuleCase:
    model = nn.LSTMLM(nn.LSTMConfig(vocab=7, embed=4, hidden=5, layers=2, max_len=6,
                                    backend=backend, dtype=dtype.name))
    held = None
    if state:  # a carried, non-zero state: the forward writes the final state into it
        held = nn.new_state(model, 2)
        held.h[...], held.c[...] = _normal(rng, dtype, 2, *held.h.shape)
    return ModuleCase(model, [rng.integers(0, 7, (2, 6))], dict(state=held))


def _tied_output(rng, dtype, backend) -> ModuleCase:
    embedding = nn.Embedding(7, 8, dtype=dtype, rng=rng, backend=backend)
    return ModuleCase(nn.TiedOutput(embedding), [_x(rng, dtype)], owner=embedding)


def _attention(rng, dtype, backend, kind: str) -> ModuleCase:
    opts = dict(rope=kind == "rope", alibi=kind == "alibi", max_len=5)
    heads = dict(heads=4, kv_heads=2) if kind == "grouped-query" else dict(heads=2)
    module = nn.MultiHeadAttention(8, **heads, dtype=dtype, rng=rng, backend=backend, **opts)
    x = _x(rng, dtype)
    if kind == "cross":
        return ModuleCase(module, [x, _x(rng, dtype, 6)], dict(mask=_mask(rng, 2, 1, 5, 6)))
    mask = causal_mask(5) if kind == "rope" else _mask(rng, 2, 1, 5, 5)
    return ModuleCase(module, [x], dict(mask=mask))


def _decoder_block(rng, dtype, backend) -> ModuleCase:
    block = nn.DecoderBlock(8, 2, 16, cross=True, dtype=dtype, rng=rng, backend=backend)
    return ModuleCase(block, [_x(rng, dtype), _x(rng, dtype, 6)],
                      dict(memory_mask=_mask(rng, 2, 1, 5, 6), mask=_mask(rng, 2, 1, 5, 5)))


def _encoder_block(rng, dtype, backend, **kw) -> ModuleCase:
    block = nn.EncoderBlock(8, 2, 16, dtype=dtype, rng=rng, backend=backend, **kw)
    return ModuleCase(block, [_x(rng, dtype)], dict(mask=_mask(rng, 2, 1, 5, 5)))


def _options(rng, dtype, backend) -> dict:
    return dict(dtype=dtype, rng=rng, backend=backend)


MODULE_CASES: dict[str, Callable[[np.random.Generator, np.dtype, str], ModuleCase]] = {
    "Linear": lambda rng, dtype, backend: ModuleCase(
        nn.Linear(8, 6, **_options(rng, dtype, backend)), [_x(rng, dtype)]),
    "Embedding": lambda rng, dtype, backend: ModuleCase(
        nn.Embedding(7, 4, **_options(rng, dtype, backend)), [rng.integers(0, 7, (2, 5))]),
    "TiedOutput": _tied_output,
    "LayerNorm": lambda rng, dtype, backend: ModuleCase(
        nn.LayerNorm(8, dtype=dtype, backend=backend), [_x(rng, dtype)]),
    "RMSNorm": lambda rng, dtype, backend: ModuleCase(
        nn.RMSNorm(8, dtype=dtype, backend=backend), [_x(rng, dtype)]),
    "Dropout": lambda rng, dtype, backend: ModuleCase(
        nn.Dropout(0.3, seed=int(rng.integers(2**32))), [_x(rng, dtype)]),
    **{f"FeedForward({act})": lambda rng, dtype, backend, act=act: ModuleCase(
        nn.FeedForward(8, 16, act, **_options(rng, dtype, backend)), [_x(rng, dtype)])
       for act in ACTIVATIONS},
    **{f"MultiHeadAttention({kind})": lambda rng, dtype, backend, kind=kind: _attention(
        rng, dtype, backend, kind)
       for kind in ("self", "cross", "rope", "alibi", "grouped-query")},
    "EncoderBlock(pre-LN)": _encoder_block,
    "EncoderBlock(post-LN, dropout)": lambda rng, dtype, backend: _encoder_block(
        rng, dtype, backend, norm_first=False, dropout=0.2),
    "DecoderBlock(cross)": _decoder_block,
    "Embeddings": lambda rng, dtype, backend: ModuleCase(
        nn.Embeddings(_transformer(dtype, backend, embed_scale=True), rng),
        [rng.integers(0, 7, (2, 5))]),
    "SinusoidalPositions": lambda rng, dtype, backend: ModuleCase(
        nn.SinusoidalPositions(6, 8, dtype=dtype), [_x(rng, dtype)]),
    "LearnedPositions": lambda rng, dtype, backend: ModuleCase(
        nn.LearnedPositions(6, 8, dtype=dtype, rng=rng), [_x(rng, dtype)]),
    "LSTM": lambda rng, dtype, backend: ModuleCase(
        nn.LSTM(8, 5, 2, **_options(rng, dtype, backend)), [_x(rng, dtype)]),
    "DecoderLM": lambda rng, dtype, backend: ModuleCase(
        nn.DecoderLM(_transformer(dtype, backend, positions="learned")),
        [rng.integers(0, 7, (2, 6))]),
    "EncoderClassifier": lambda rng, dtype, backend: ModuleCase(
        nn.EncoderClassifier(_transformer(dtype, backend, num_classes=3)),
        [rng.integers(0, 7, (2, 6)), np.array([6, 4])]),
    "EncoderDecoder": lambda rng, dtype, backend: ModuleCase(
        nn.EncoderDecoder(_transformer(dtype, backend)),
        [rng.integers(0, 7, (2, 6)), rng.integers(0, 7, (2, 5)), np.array([6, 3])]),
    "LSTMLM": lambda rng, dtype, backend: _lstm_lm(rng, dtype, backend, state=False),
    "LSTMLM(state)": lambda rng, dtype, backend: _lstm_lm(rng, dtype, backend, state=True),
}

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend, name", [
    (backend, name) for backend in BACKENDS for name in MODULE_CASES])
def test_a_modules_backward_ignores_writes_into_what_its_caller_holds(backend, name, dtype):
    moved = module_difference(MODULE_CASES[name], dtype, backend)
    assert not moved, f"{backend} {name}: {moved} changed"


# ----------------------------------------------------------------------------- negative controls
def _keeping_forward(x: np.ndarray, w: np.ndarray):
    """``out = x * w`` whose cache keeps x by reference: the aliasing the checks are for."""
    return x * w, (x, w.copy())


def _keeping_backward(dout: np.ndarray, cache):
    x, w = cache
    return dout * w, (dout * x).sum(axis=0)  # dx, dw


def _toy_case(rng, dtype):
    return PairCase([_normal(rng, dtype, 4, 3), _normal(rng, dtype, 3)])


def test_negative_control_a_pair_that_keeps_its_input_is_caught():
    assert pair_difference(_keeping_forward, _keeping_backward, _toy_case,
                           np.float64) == ["result[1]"]
    owning = lambda x, w: _keeping_forward(x.copy(), w)  # noqa: E731 - the same pair, fixed
    assert pair_difference(owning, _keeping_backward, _toy_case, np.float64) == []


class _KeepingScale(nn.Module):
    """``out = x * w`` whose cache is the caller's x itself."""

    def __init__(self, dtype) -> None:
        super().__init__()
        self.add_param("w", np.linspace(0.5, 1.5, 8).astype(dtype))

    def forward(self, x: np.ndarray) -> np.ndarray:
        self.cache = x
        return x * self.params["w"]

    def backward(self, dout: np.ndarray) -> np.ndarray:
        self.grads["w"] += (dout * self.cache).sum(axis=(0, 1))
        return dout * self.params["w"]


def test_negative_control_a_module_that_keeps_its_input_is_caught():
    def build(rng, dtype, backend):
        return ModuleCase(_KeepingScale(dtype), [_x(rng, dtype)])

    assert module_difference(build, np.float64, "numpy") == ["grad w"]

"""What a cache keeps of a weight (``numpy_transformer/ownership.py``).

A forward's cache keeps a copy of each weight its backward needs; inside a model's
``loss_and_backward`` (its forward and its backward in one call) it keeps the weight itself,
and lets go of it when the call returns. Checked here: no copy is made inside the call (the
memory it saves), no cache aliases a parameter once the call returned or raised, a backward
of that spent forward raises ``ValueError``, and a plain forward still copies (the control
that shows the alias check can fail).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import pytest
from _nn_helpers import FAMILIES, small_family

from numpy_transformer.nn import DecoderLM, TransformerConfig
from numpy_transformer.ownership import borrowing, kept, let_go, to_let_go


def _arrays(value: object):
    """Every array in a cache, at any depth of its tuples and dataclasses."""
    if isinstance(value, np.ndarray):
        yield value
    elif isinstance(value, tuple):
        for item in value:
            yield from _arrays(item)
    elif dataclasses.is_dataclass(value):
        for field in dataclasses.fields(value):
            yield from _arrays(getattr(value, field.name))


def _cached(model) -> list[np.ndarray]:
    return [a for _, module in model.named_modules() for name in ("cache", "loss_cache")
            for a in _arrays(getattr(module, name, None))]


def _aliases(model) -> set[str]:
    """The parameters that some cached array shares memory with."""
    cached = _cached(model)
    return {name for name, param, _ in model.named_parameters()
            if any(np.shares_memory(a, param) for a in cached)}


def _copies(model) -> set[str]:
    """The parameters that some cached array equals (or its transpose) without aliasing it."""
    cached = _cached(model)
    return {name for name, param, _ in model.named_parameters() if param.ndim == 2 and any(
        a.shape in (param.shape, param.T.shape) and not np.shares_memory(a, param)
        and np.array_equal(a if a.shape == param.shape else a.T, param) for a in cached)}


def test_kept_copies_a_weight_outside_and_borrows_it_inside():
    w = np.arange(6.0).reshape(2, 3)
    outside = kept(w)
    assert not np.shares_memory(outside, w) and np.array_equal(outside, w)
    with borrowing() as borrowed:
        assert kept(w) is w
        cast = kept(w, np.float32)  # a cast is a new array: the cache owns it
        assert cast.dtype == np.float32 and not np.shares_memory(cast, w)
    assert borrowed == [w]
    assert kept(w) is not w  # the block is over


class _Pair(NamedTuple):
    a: object
    b: object


@dataclasses.dataclass
class _Box:
    inner: object
    other: np.ndarray


def test_let_go_replaces_the_borrowed_arrays_at_any_depth():
    w, x = np.ones(3), np.zeros(2)
    cache = _Pair((x, _Box(_Pair(w, x), x)), w)
    out = let_go(cache, {id(w)})
    assert isinstance(out, _Pair) and out.b is None
    assert out.a[0] is x and out.a[1].inner == _Pair(None, x) and out.a[1].other is x
    assert cache.b is w  # the NamedTuples are rebuilt, not changed
    assert let_go(cache, {id(np.ones(3))}) is cache  # none of it in there: the same object


def test_the_arrays_let_go_are_those_whose_memory_a_protected_array_owns():
    table, x = np.ones((4, 3)), np.zeros((2, 3))
    borrowed = [table.T, x, table, x[1:].reshape(3)]
    assert to_let_go(borrowed, [table]) == {id(borrowed[0]), id(table)}
    assert to_let_go(borrowed, [x[:1]]) == {id(x), id(borrowed[3])}  # one owner: x
    assert to_let_go(borrowed, []) == set()


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("family", FAMILIES)
def test_after_loss_and_backward_no_cache_aliases_a_parameter(family, backend):
    model, inputs, targets, mask = small_family(family, backend)
    model.loss_and_backward(*inputs, targets=targets, mask=mask)
    assert _cached(model), "the activations stay for a reader"
    assert _aliases(model) == set()


def _decoder(backend: str, tied: bool = False) -> tuple[DecoderLM, np.ndarray]:
    """A decoder with 4 x 64 = 256 positions: enough rows for the numba kernels' own paths."""
    model = DecoderLM(TransformerConfig(vocab=29, width=32, heads=2, layers=2, ffn_width=64,
                                        max_len=64, tie_embeddings=tied, backend=backend))
    return model, np.random.default_rng(5).integers(0, 29, size=(4, 65))


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_inside_the_call_the_caches_keep_the_weights_themselves(backend):
    model, ids = _decoder(backend)
    model.forward(ids[:, :-1])  # the control: a plain forward copies every weight it keeps
    copied = _copies(model)
    assert _aliases(model) == set()
    assert {"head.w", "decoder.blocks.0.ffn.up.w", "decoder.blocks.1.attn.wo"} <= copied
    with borrowing():  # what loss_and_backward's forward does
        model.forward(ids[:, :-1])
        assert _copies(model) == set()  # no copy of any weight is made
        assert copied <= _aliases(model)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("tied", [False, True])
def test_a_backward_of_the_spent_forward_raises(backend, tied):
    model, ids = _decoder(backend, tied)
    model.forward(ids[:, 1:])  # an earlier forward: its caches must not mix with the call's
    model.loss_and_backward(ids[:, :-1], targets=ids[:, 1:])
    dlogits = np.random.default_rng(6).standard_normal((4, 64, 29))
    with pytest.raises(ValueError, match="already ran in loss_and_backward"):
        model.backward(dlogits)
    block = model.submodule("decoder.blocks.1")
    with pytest.raises(ValueError, match="DecoderBlock.backward: the backward of its last"):
        block.backward(dlogits[..., :32])
    model.forward(ids[:, :-1])  # a new forward: its backward runs
    model.backward(dlogits)
    assert _aliases(model) == set()


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_a_call_that_raises_lets_go_as_well(backend):
    model, ids = _decoder(backend)
    with pytest.raises(ValueError, match="target"):
        model.loss_and_backward(ids[:, :-1], targets=ids[:, 1:] + 100)  # outside the vocabulary
    assert _cached(model) and _aliases(model) == set()

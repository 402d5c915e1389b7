"""What a cache keeps of a weight (``numpy_transformer/ownership.py``), and where the numba
backend borrows them (``Backend.forward_and_backward`` in ``numpy_transformer/backend.py``).

A forward's cache keeps a copy of each weight its backward needs: the references of
``functional/`` always, the kernels outside one block. A model's ``loss_and_backward`` runs
its forward and its backward inside ``self.ops.forward_and_backward(self)``: there the numba
kernels' caches keep the weights themselves, and the block takes them out of every cache when
it ends. Checked here: inside the call no numba cache holds a copy of a weight (the memory it
saves), while the references copy there as everywhere and a plain forward copies on both
backends (the controls that show the copy check can fail); no cache aliases a parameter once
the call returned or raised; a backward of that spent forward raises ``ValueError``.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import pytest
from _nn_helpers import FAMILIES, small_family

from numpy_transformer.nn import DecoderLM, Module, TransformerConfig
from numpy_transformer.ownership import borrowing, kept


def _arrays(value: object):
    """Every array in a cache, at any depth of its tuples, lists and dataclasses."""
    if isinstance(value, np.ndarray):
        yield value
    elif isinstance(value, (tuple, list)):
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


def test_let_go_takes_the_arrays_out_of_every_cache_at_any_depth():
    w, x = np.ones(3), np.zeros(2)
    parent, child = Module(), Module()
    parent.add("child", child)
    cache = _Pair((x, _Box(_Pair(w, x), x)), w)
    parent.cache, child.cache = cache, (w, x)
    parent.grad_like = ((2,), x.dtype)  # as after a forward; the child had none
    parent.let_go({id(w)})
    out = parent.cache
    assert isinstance(out, _Pair) and out.b is None
    assert out.a[0] is x and out.a[1].inner == _Pair(None, x) and out.a[1].other is x
    assert cache.b is w  # the NamedTuples are rebuilt, not changed
    assert child.cache[0] is None and child.cache[1] is x
    with pytest.raises(ValueError, match="already ran in loss_and_backward"):
        parent.check_grad("dout", x)
    with pytest.raises(ValueError, match="needs a forward first"):  # no forward: none spent
        child.check_grad("dout", x)
    parent.let_go({id(np.ones(3))})  # none of it in there: the same object
    assert parent.cache is out


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


def _inside_the_call(model: DecoderLM, ids: np.ndarray) -> tuple[set[str], set[str]]:
    """``(copies, aliases)`` of the caches between the forward and the backward of one
    ``loss_and_backward``: looked at when the call asks the head for its loss's backward."""
    seen = []
    loss_backward = model.head.loss_backward

    def looking(*args, **kwargs):
        seen.append((_copies(model), _aliases(model)))
        return loss_backward(*args, **kwargs)

    model.head.loss_backward = looking
    model.loss_and_backward(ids[:, :-1], targets=ids[:, 1:])
    (found,) = seen
    return found


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_inside_the_call_the_numba_caches_keep_the_weights_themselves(backend):
    model, ids = _decoder(backend)
    model.forward(ids[:, :-1])  # the control: a plain forward copies every weight it keeps
    copied = _copies(model)
    assert _aliases(model) == set()
    assert {"head.w", "decoder.blocks.0.ffn.up.w", "decoder.blocks.1.attn.wo",
            "decoder.blocks.1.attn.wq"} <= copied
    copies, aliases = _inside_the_call(*_decoder(backend))
    body = copied - {"head.w"}  # the head's loss keeps x alone on the numba backend
    if backend == "numba":  # no copy of any weight is made
        assert copies == set() and body <= aliases
    else:  # the references copy, inside the call as everywhere
        assert body <= copies and aliases == set()


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

"""What a cache keeps of a weight: a copy of its own, or within one call the weight itself.

A cache owns what it keeps. Between a forward and its backward the caller may write into a
weight (an optimiser step, ``load_state_dict``, a reader's experiment), so every forward
keeps a copy of the weights its backward needs: :func:`kept`.

A model's ``loss_and_backward`` runs its forward and its backward in one call, and nothing
writes a weight in between. Inside :func:`weights_borrowed` the caches therefore keep the
weights themselves (GPT-2 small: 243 MiB of copies never made). When the call returns,
:func:`let_go` takes every such weight out of the caches again, so that no cache aliases a
parameter that the optimiser writes next; the activations stay for a reader to look at.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np

# the weights the caches kept inside the innermost weights_borrowed(), None outside it
_BORROWED: ContextVar[list | None] = ContextVar("borrowed", default=None)


def kept(w: np.ndarray, dtype: np.dtype | None = None) -> np.ndarray:
    """What a forward's cache keeps of the weight ``w``, as ``dtype`` (default: its own).

    A copy of its own; inside :func:`weights_borrowed`, ``w`` itself when no cast is needed.
    """
    borrowed = _BORROWED.get()
    if borrowed is None or (dtype is not None and np.dtype(dtype) != w.dtype):
        return w.copy() if dtype is None else np.array(w, dtype=dtype)
    borrowed.append(w)
    return w


@contextmanager
def weights_borrowed() -> Iterator[list]:
    """Within the block, caches keep weights uncopied; yields the list of those weights.

    Only for a block that runs a forward and its backward and nothing else: the caller then
    lets go of the weights with :func:`let_go` before anyone can write into them.
    """
    borrowed: list = []
    token = _BORROWED.set(borrowed)
    try:
        yield borrowed
    finally:
        _BORROWED.reset(token)


def let_go(cache: object, borrowed: list) -> object:
    """``cache`` with every array of ``borrowed`` in it (at any depth of its tuples and
    dataclasses) replaced by ``None``; the same object when it holds none of them."""
    ids = {id(w) for w in borrowed}
    return _without(cache, ids) if ids else cache


def _without(value: object, ids: set[int]) -> object:
    if isinstance(value, np.ndarray):
        return None if id(value) in ids else value
    if isinstance(value, tuple):
        items = [_without(item, ids) for item in value]
        if all(new is old for new, old in zip(items, value, strict=True)):
            return value
        return type(value)._make(items) if hasattr(value, "_fields") else tuple(items)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changed = {f.name: _without(getattr(value, f.name), ids)
                   for f in dataclasses.fields(value)}
        changed = {name: new for name, new in changed.items()
                   if new is not getattr(value, name)}
        return dataclasses.replace(value, **changed) if changed else value
    return value

"""What a cache keeps of a weight its forward was given: a copy of its own, or, within one
call that runs the forward and its backward, the weight itself.

A cache owns what it keeps. Between a forward and its backward the caller may write into a
weight (an optimiser step, ``load_state_dict``, a reader's experiment), so every forward
keeps a copy of the weights its backward needs: :func:`kept` (the inputs are copied as
before, where each forward copies them).

A model's ``loss_and_backward`` runs its forward and its backward in one call, and nothing
writes into a weight in between (the optimiser steps after it). Inside :func:`borrowing` the
caches therefore keep the weights themselves: at GPT-2 small's shape, a copy of nearly every
weight is never made (the linear layers', and the attention's projections put side by side;
``benchmarks/README.md``). When the call returns, :func:`let_go` takes the parameters, and
any array of the call's own arguments, out of the caches again, so that no cache aliases an
array that the optimiser or the caller writes next; the activations stay for a reader to look
at.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np

# the arrays the caches kept inside the innermost borrowing(), None outside it
_BORROWED: ContextVar[list | None] = ContextVar("borrowed", default=None)


def kept(w: np.ndarray, dtype: np.dtype | None = None) -> np.ndarray:
    """What a forward's cache keeps of the weight ``w``, as ``dtype`` (default: its own).

    A copy of its own (``w.copy()``, or ``np.array(w, dtype)`` for a ``dtype``); inside
    :func:`borrowing`, ``w`` itself when no cast is needed.
    """
    borrowed = _BORROWED.get()
    if borrowed is None or (dtype is not None and np.dtype(dtype) != w.dtype):
        return w.copy() if dtype is None else np.array(w, dtype=dtype)
    borrowed.append(w)
    return w


def is_borrowing() -> bool:
    """Whether a cache made now may keep what it is given (inside :func:`borrowing`)."""
    return _BORROWED.get() is not None


@contextmanager
def borrowing() -> Iterator[list]:
    """Within the block, :func:`kept` returns its weight uncopied; yields the list of those.

    Only for a block that runs a forward and its backward and nothing else in between; the
    caller then lets go of the weights it or the optimiser may write (:func:`let_go`).
    """
    borrowed: list = []
    token = _BORROWED.set(borrowed)
    try:
        yield borrowed
    finally:
        _BORROWED.reset(token)


def owner(a: np.ndarray) -> np.ndarray:
    """The array that owns ``a``'s memory (``a`` itself, or the base of its views)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def to_let_go(borrowed: list, protected: Iterable[np.ndarray]) -> set[int]:
    """The ids of the ``borrowed`` arrays whose memory is one of the ``protected`` arrays'."""
    owners = {id(owner(a)) for a in protected}
    return {id(a) for a in borrowed if id(owner(a)) in owners}


def let_go(cache: object, ids: set[int]) -> object:
    """``cache`` with every array whose id is in ``ids`` (at any depth of its tuples and
    dataclasses) replaced by ``None``; the same object when it holds none of them."""
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

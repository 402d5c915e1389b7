"""What a kernel's cache keeps of a weight: a copy of its own, or, while its backend borrows
the weights, the weight itself.

A cache owns what it keeps: between a forward and its backward the caller may write into a
weight (an optimiser step, ``load_state_dict``, a reader's experiment). The references of
``functional/`` therefore always keep copies, and so do the kernels, through :func:`kept`.

A model's ``loss_and_backward`` runs its forward and its backward inside
``Backend.forward_and_backward`` (``numpy_transformer/backend.py``), and nothing writes into a
weight in between. That block is :func:`borrowing`: inside it :func:`kept` hands back the
weight itself and notes it, and when the block ends the backend takes every weight it noted
out of the model's caches again (``Module.let_go``). Only the kernels call :func:`kept`: on the
numpy backend nothing is borrowed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np

# the weights kept uncopied inside the innermost borrowing(), None outside it
_BORROWED: ContextVar[list | None] = ContextVar("borrowed", default=None)


def kept(w: np.ndarray, dtype: np.dtype | None = None) -> np.ndarray:
    """What a kernel's cache keeps of the weight ``w``, as ``dtype`` (default: its own).

    A copy of its own (``w.copy()``, or ``np.array(w, dtype)`` for a ``dtype``); inside
    :func:`borrowing`, ``w`` itself when no cast is needed.
    """
    borrowed = _BORROWED.get()
    if borrowed is None or (dtype is not None and np.dtype(dtype) != w.dtype):
        return w.copy() if dtype is None else np.array(w, dtype=dtype)
    borrowed.append(w)
    return w


@contextmanager
def borrowing() -> Iterator[list]:
    """Within the block, :func:`kept` returns its weight uncopied; yields the list of those.

    Only for a block that runs a forward and its backward and nothing else in between
    (``Backend.forward_and_backward``), which then takes the weights out of the caches.
    """
    borrowed: list = []
    token = _BORROWED.set(borrowed)
    try:
        yield borrowed
    finally:
        _BORROWED.reset(token)

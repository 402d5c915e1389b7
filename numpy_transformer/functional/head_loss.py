"""A classifier's output layer and its loss as one operation: ``loss = CE(x w + b, targets)``.

A language model's last layer maps each position's features to one logit per word of the
vocabulary, and the loss turns the logits into one number. Training needs neither the logits
nor their probabilities, only the loss and its gradient; at GPT-2's vocabulary (50,304) and
1,024 positions each of the logits, the probabilities and the logits' gradient is a
(1024, 50304) array, 51.5 million numbers. Taking the two layers as one operation lets a fast
implementation go through the rows a block at a time and never hold them whole. The reference
below is the composition of the two references it fuses, which is all the math there is:
``functional/linear.py`` and ``functional/softmax.py``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .linear import LinearCache, linear_backward, linear_forward
from .softmax import CrossEntropyCache, cross_entropy_backward, cross_entropy_forward

# The operations of the backends (numpy_transformer.backend)
__all__ = ['linear_cross_entropy_forward', 'linear_cross_entropy_backward']


class LinearCrossEntropyCache(NamedTuple):
    linear: LinearCache  # the head's: x and w
    loss: CrossEntropyCache  # the loss's: the probabilities (N, V), the targets and weights


def linear_cross_entropy_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                                 targets: np.ndarray, ignore_index: int = -100,
                                 mask: np.ndarray | None = None, *, keep: bool = True):
    """Mean cross-entropy of the logits ``x w + b`` against ``targets``.

    Parameters
    ----------
    x : ndarray of shape (..., C), typically (B, T, C)
        The features of each position.
    w : ndarray of shape (C, V)
    b : ndarray of shape (V,), or None
    targets : ndarray of int, shape (...), typically (B, T)
    ignore_index : int, default -100
        Targets equal to it are not counted.
    mask : ndarray of bool, shape (...), optional
        ``True`` = count this target. Combined with ``ignore_index``.
    keep : bool, default True
        Whether to return the cache a backward needs; False (a held-out loss): None.

    Returns
    -------
    loss : float
        Mean over the counted targets.
    cache : LinearCrossEntropyCache or None

    Raises
    ------
    ValueError
        As ``linear_forward`` and ``cross_entropy_forward`` do.

    Notes
    -----
    (1) logits = x w + b   (2) loss = cross_entropy(logits, targets)
    """
    logits, linear = linear_forward(x, w, b, keep=keep)  # (1) (..., V)
    loss, ce = cross_entropy_forward(logits, targets, ignore_index, mask, keep=keep)  # (2)
    return loss, LinearCrossEntropyCache(linear, ce) if keep else None


def linear_cross_entropy_backward(dloss: float, cache: LinearCrossEntropyCache):
    """Returns ``(dx, dw, db)``; ``db`` is ``None`` when the forward had no bias."""
    if not isinstance(cache, LinearCrossEntropyCache):
        raise ValueError(f"cache must be the LinearCrossEntropyCache that "
                         f"linear_cross_entropy_forward returns, got {type(cache).__name__}")
    dlogits = cross_entropy_backward(dloss, cache.loss)  # (2) dloss w_n (p - onehot(t))
    return linear_backward(dlogits, cache.linear)  # (1) dx = dlogits w^T, dw = x^T dlogits

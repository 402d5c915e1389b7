"""The position-wise feed-forward network: linear, activation, linear.

The plain composition of the pairs of ``linear.py`` and ``activations.py``, for every
activation of ``config.ACTIVATIONS``: the activation ``name`` is the pair ``<name>_forward`` /
``<name>_backward`` of ``activations.py``, and a gated one (``config.GATED_ACTIVATIONS``) takes
``(gate, up)`` and a third matrix.

References
----------
Vaswani et al., "Attention Is All You Need", 2017.
Shazeer, "GLU Variants Improve Transformer", 2020.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .._checks import check_choice
from ..config import ACTIVATIONS, GATED_ACTIVATIONS
from . import activations
from .linear import LinearCache, linear_backward, linear_forward

# The operations of the backends (numpy_transformer.backend)
__all__ = ['feed_forward_forward', 'feed_forward_backward']

Weights = dict[str, tuple[np.ndarray, np.ndarray | None]]  # name -> (w, b or None)


def feed_forward_weight_names(activation: str) -> tuple[str, ...]:
    """The names of the network's weights: ``("gate", "up", "down")`` for a gated activation
    (``config.GATED_ACTIVATIONS``), else ``("up", "down")``."""
    check_choice("activation", activation, ACTIVATIONS)
    return ("gate", "up", "down") if activation in GATED_ACTIVATIONS else ("up", "down")


def activation_pair(name: str) -> tuple[Callable, Callable]:
    """``(<name>_forward, <name>_backward)`` of ``functional/activations.py``."""
    return getattr(activations, f"{name}_forward"), getattr(activations, f"{name}_backward")


def check_feed_forward_weights(weights: object, activation: str) -> None:
    """Raise ``ValueError`` unless ``weights`` holds a ``(w, b or None)`` pair under each name
    of :func:`feed_forward_weight_names` and nothing else, ``w`` an array, the hidden widths
    agreeing (the linear maps check the rest)."""
    names = feed_forward_weight_names(activation)
    if not isinstance(weights, dict) or sorted(weights) != sorted(names) or not all(
            isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], np.ndarray)
            for pair in weights.values()):
        raise ValueError(f"weights must be a dict of (w, b or None) under {', '.join(names)} "
                         f"for activation {activation!r}, got {weights!r:.80}")
    up, down = weights["up"][0], weights["down"][0]
    hidden = {weights[name][0].shape[1:] for name in names if name != "down"} | {down.shape[:1]}
    if up.ndim != 2 or down.ndim != 2 or len(hidden) != 1:
        raise ValueError(f"the weights must be (C, F) up{' and gate' * (len(names) == 3)} and "
                         f"(F, C) down, got {', '.join(str(weights[n][0].shape) for n in names)}")


class FeedForwardCache(NamedTuple):
    activation: str  # which pair (2) is
    up: LinearCache  # (1) x (..., C), a copy of the caller's, and w_up (C, F), a copy
    gate: LinearCache | None  # (1) x and w_gate (C, F), for a gated activation; else None
    act: object  # (2) the activation's cache
    down: LinearCache  # (3) a (..., F) and w_down (F, C), a copy


def feed_forward_forward(x: np.ndarray, weights: Weights, activation: str, *,
                         keep: bool = True):
    """The feed-forward network over the last axis.

    Parameters
    ----------
    x : ndarray of shape (..., C)
    weights : dict of name -> (w, b or None)
        ``"up"``: (C, F) and (F,); ``"down"``: (F, C) and (C,); and for a gated activation
        ``"gate"``: (C, F) and (F,). ``x @ w`` layout; the cache copies the matrices.
    activation : str
        One of ``config.ACTIVATIONS``.
    keep : bool, default True
        Whether to return the cache a backward needs; False (inference): None, and nothing
        is copied.

    Returns
    -------
    out : ndarray of shape (..., C)
    cache : FeedForwardCache or None

    Raises
    ------
    ValueError
        If the activation is unknown, or the weights do not fit x or each other.

    Notes
    -----
    elementwise: (1) h = x w_up + b_up                    (2) a = act(h)
    gated:       (1) g = x w_gate + b_gate, u = x w_up + b_up   (2) a = silu(g) * u
    both:        (3) out = a w_down + b_down

    The steps are :func:`compose_forward`'s, with ``linear_forward`` and the activation's pair.
    """
    check_feed_forward_weights(weights, activation)
    return compose_forward(x, weights, activation, linear_forward, activation_pair(activation),
                           keep)


def feed_forward_backward(dout: np.ndarray, cache: FeedForwardCache):
    """Returns ``(dx, grads)``: dx shaped like the forward's x, and ``grads`` shaped like its
    ``weights``, ``{name: (dw, db or None)}``."""
    return compose_backward(dout, cache, linear_backward, activation_pair(cache.activation))


def compose_forward(x: np.ndarray, weights: Weights, activation: str, linear: Callable,
                    pair: tuple[Callable, Callable], keep: bool = True):
    """(1)-(3) of :func:`feed_forward_forward` made of the given pieces: ``linear(x, w, b,
    keep=keep)`` and the activation's ``(forward, backward)`` (a faster backend gives its
    own)."""
    act_forward, _ = pair
    # each linear map's cache keeps its own copies of x and w (the caller may write into its)
    h, up = linear(x, *weights["up"], keep=keep)  # (1) (..., F)
    gate = None
    if activation in GATED_ACTIVATIONS:
        g, gate = linear(x, *weights["gate"], keep=keep)  # (1) (..., F)
        a, act = act_forward(g, h, keep=keep)  # (2) silu(g) * u
    else:
        a, act = act_forward(h, keep=keep)  # (2)
    out, down = linear(a, *weights["down"], keep=keep)  # (3) (..., C)
    return out, FeedForwardCache(activation, up, gate, act, down) if keep else None


def compose_backward(dout: np.ndarray, cache: FeedForwardCache, linear_back: Callable,
                     pair: tuple[Callable, Callable]):
    """:func:`feed_forward_backward` made of the given pieces, as :func:`compose_forward`."""
    _, up, gate, act, down = cache
    _, act_backward = pair
    # (3) out = a w_down + b_down
    da, *grads_down = linear_back(dout, down)
    grads = {"down": tuple(grads_down)}
    if gate is None:
        dh = act_backward(da, act)  # (2) a = act(h)
        dx, *grads_up = linear_back(dh, up)  # (1) h = x w_up + b_up
    else:
        dg, du = act_backward(da, act)  # (2) a = silu(g) * u
        # (1) g = x w_gate + b_gate, u = x w_up + b_up: x feeds both, dx = dx_g + dx_u
        dx_gate, *grads_gate = linear_back(dg, gate)
        dx_up, *grads_up = linear_back(du, up)
        grads["gate"] = tuple(grads_gate)
        dx = dx_gate + dx_up
    grads["up"] = tuple(grads_up)
    return dx, grads

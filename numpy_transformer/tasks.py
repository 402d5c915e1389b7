"""Synthetic sequence tasks, each drawn from an explicit ``numpy.random.Generator``.

* :func:`sort_batch` (encoder only): output i is the i-th smallest input digit, so the model
  needs content AND position.
* :func:`copy_back_batch` (causal decoder): output t is the digit ``shift`` places back, an
  attend-a-fixed-offset pattern. With a negative shift the target is a FUTURE digit, which a
  causal mask hides: a causal model stays at chance (1 / digits) there, a bidirectional one
  does not.
* :func:`reverse_batch` (encoder-decoder): the decoder must output the source reversed, which
  it can only read through cross-attention.

All tokens are digits ``0 .. digits - 1``; the reverse task adds one BOS token (id ``digits``).
Masked-out targets hold :data:`IGNORE_INDEX` (-100), the default ``ignore_index`` of
``functional.softmax.cross_entropy_forward``; the boolean mask (``True`` = counted) is returned
as well, for accuracies.
"""

from __future__ import annotations

import numpy as np

__all__ = ["IGNORE_INDEX", "sort_batch", "copy_back_batch", "reverse_batch"]

IGNORE_INDEX = -100  # a target that is not counted, as torch's F.cross_entropy default


def _check_args(rng: object, **sizes: object) -> None:
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def sort_batch(n: int, rng: np.random.Generator, length: int = 10,
               digits: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Random digit sequences and the same digits sorted, one target per position.

    Parameters
    ----------
    n : int
        Number of sequences B.
    rng : numpy.random.Generator
    length : int, default 10
        Sequence length T.
    digits : int, default 10
        Vocabulary size V; tokens are ``0 .. digits - 1``.

    Returns
    -------
    x : ndarray of int64, shape (B, T)
    y : ndarray of int64, shape (B, T)
        ``y[b] = sorted(x[b])``.

    Raises
    ------
    ValueError
        If a size is not a positive integer or ``rng`` is not a Generator.
    """
    _check_args(rng, n=n, length=length, digits=digits)
    x = rng.integers(0, digits, size=(n, length), dtype=np.int64)
    return x, np.sort(x, axis=1)


def copy_back_batch(n: int, rng: np.random.Generator, length: int = 10, shift: int = 3,
                    digits: int = 10) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Predict, at each position t, the digit at position ``t - shift``.

    Parameters
    ----------
    n, rng, length, digits
        As :func:`sort_batch`.
    shift : int, default 3
        Positive: the target at t is ``x[t - shift]`` (a past token), positions
        ``t < shift`` have none. Negative: the target is ``x[t + |shift|]`` (a FUTURE token),
        positions ``t >= length - |shift|`` have none. Zero: the identity.

    Returns
    -------
    x : ndarray of int64, shape (B, T)
    y : ndarray of int64, shape (B, T)
        Targets; :data:`IGNORE_INDEX` where there is none.
    loss_mask : ndarray of bool, shape (B, T)
        ``True`` where a target exists.

    Raises
    ------
    ValueError
        If a size is invalid or ``|shift| >= length`` (no position would have a target).
    """
    _check_args(rng, n=n, length=length, digits=digits)
    if isinstance(shift, bool) or not isinstance(shift, (int, np.integer)) \
            or abs(shift) >= length:
        raise ValueError(f"shift must be an integer with |shift| < length = {length}, got "
                         f"{shift!r}")
    x = rng.integers(0, digits, size=(n, length), dtype=np.int64)
    y = np.full_like(x, IGNORE_INDEX)
    loss_mask = np.zeros(x.shape, dtype=bool)
    if shift >= 0:
        y[:, shift:] = x[:, :length - shift]  # y[t] = x[t - shift] for t >= shift
        loss_mask[:, shift:] = True
    else:
        ahead = -shift
        y[:, :length - ahead] = x[:, ahead:]  # y[t] = x[t + ahead] for t < length - ahead
        loss_mask[:, :length - ahead] = True
    return x, y, loss_mask


def reverse_batch(n: int, rng: np.random.Generator, length: int = 8,
                  digits: int = 10) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A source sequence and its reversal, laid out for a teacher-forced decoder.

    Vocabulary (size ``digits + 1``): ids ``0 .. digits - 1`` are the digits, id ``digits``
    is BOS, which appears only as the first decoder input. The source never holds BOS.

    Parameters
    ----------
    n, rng, length, digits
        As :func:`sort_batch`.

    Returns
    -------
    src : ndarray of int64, shape (B, T)
        Encoder input.
    tgt_in : ndarray of int64, shape (B, T)
        Decoder input ``[BOS] + tgt_out[:-1]`` (the target shifted right).
    tgt_out : ndarray of int64, shape (B, T)
        Decoder targets, ``src`` reversed. Position t of the decoder must output
        ``src[T - 1 - t]``, which only cross-attention into the source can supply.

    Raises
    ------
    ValueError
        If a size is not a positive integer or ``rng`` is not a Generator.
    """
    _check_args(rng, n=n, length=length, digits=digits)
    bos = digits
    src = rng.integers(0, digits, size=(n, length), dtype=np.int64)
    tgt_out = src[:, ::-1].copy()
    tgt_in = np.empty_like(tgt_out)
    tgt_in[:, 0] = bos
    tgt_in[:, 1:] = tgt_out[:, :-1]
    return src, tgt_in, tgt_out

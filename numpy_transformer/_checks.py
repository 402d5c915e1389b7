"""Input validation shared by every layer, the optimisers and the schedules: clear
``ValueError`` messages that name the value.

A user who passes the wrong thing should read what was wrong, not a NumPy broadcasting
trace three frames deep or, worse, get a silently wrong answer.
"""

from __future__ import annotations

import math

import numpy as np


def check_float(name: str, x: object, ndim: int | tuple[int, ...] | None = None) -> np.ndarray:
    """Return ``x`` if it is a non-empty floating ndarray of the expected rank, else raise
    ``ValueError``. An axis of length 0 (no tokens, no features) is refused: nothing in the
    library has a meaning for it, and the kernels would index outside it."""
    if not isinstance(x, np.ndarray):
        raise ValueError(f"{name} must be a NumPy array, got {type(x).__name__}")
    if x.dtype.kind != "f":  # np.issubdtype(x.dtype, np.floating), 20x faster
        raise ValueError(f"{name} must be a float array (float32 or float64), got dtype {x.dtype}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else ndim
        if x.ndim not in allowed:
            raise ValueError(f"{name} must have {' or '.join(map(str, allowed))} dimensions, "
                             f"got shape {x.shape}")
    if x.size == 0:
        raise ValueError(f"{name} has an axis of length 0 (shape {x.shape}): nothing to compute")
    return x


def check_shaped(name: str, x: object, shape: tuple[int, ...], dtype=None,
                 what: str = "the forward's output") -> np.ndarray:
    """Return ``x`` if it is a float array of exactly ``shape`` (and ``dtype``, if given), else
    raise ``ValueError`` saying it should be shaped like ``what``. Used for an upstream gradient
    against the forward's output, and for parameters against their input.

    Exact, not broadcast: a one-row gradient must not be spread silently over every row.
    """
    check_float(name, x)
    if x.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} like {what}, got {x.shape}")
    if dtype is not None and x.dtype != dtype:
        raise ValueError(f"{name} must be {np.dtype(dtype)} like {what}, got {x.dtype}")
    return x


def check_scalar(name: str, value: object) -> None:
    """Raise ``ValueError`` unless ``value`` is one real number: a Python or NumPy number or a
    0-d array of one (a gradient check's random upstream gradient of a scalar loss), not a
    bool and not an array with an axis."""
    number = isinstance(value, (int, float, np.integer, np.floating)) or (
        isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iuf")
    if isinstance(value, bool) or not number:
        raise ValueError(f"{name} must be a real number, got {type(value).__name__} {value!r}")


def check_ids(name: str, ids: object, vocab: int) -> np.ndarray:
    """Return ``ids`` as an integer ndarray whose values lie in ``[0, vocab)``."""
    ids = np.asarray(ids)
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"{name} must be integer token ids, got dtype {ids.dtype}")
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        bad = ids[(ids < 0) | (ids >= vocab)].flat[0]
        raise ValueError(f"{name} holds id {bad}, outside the vocabulary [0, {vocab})")
    return ids


def check_last_dim(name: str, x: np.ndarray, size: int) -> None:
    """Raise ``ValueError`` unless the last axis of ``x`` has length ``size``."""
    if x.shape[-1] != size:
        raise ValueError(f"{name} has last dimension {x.shape[-1]} (shape {x.shape}), "
                         f"expected {size}")


def check_positive(name: str, value: float, integer: bool = False) -> None:
    """Raise ``ValueError`` unless ``value`` is a positive (integer, if asked) finite number:
    an infinite initial scale would make every weight it draws non-finite."""
    ok = isinstance(value, (int, np.integer)) if integer else isinstance(value, (int, float))
    if not ok or isinstance(value, bool) or not 0 < value < math.inf:
        kind = "a positive integer" if integer else "a positive finite number"
        raise ValueError(f"{name} must be {kind}, got {value!r}")


def check_choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``allowed``, else raise ``ValueError`` listing them.

    Every named choice of the library (norm, activation, positions, dtype, backend) is checked
    here, against the lists of ``numpy_transformer.config``.
    """
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def check_even(what: str, name: str, value: int) -> None:
    """Raise ``ValueError`` unless ``value`` is even and at least 2 (``what`` pairs features)."""
    if value < 2 or value % 2:
        raise ValueError(f"{what} needs an even {name} >= 2, got {value}")


def check_number(name: str, value: object, low: float, high: float | None = None,
                 low_open: bool = False, high_open: bool = True) -> float:
    """Return ``value`` as a float if it is a real number in the given interval."""
    ok = isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)
    ok = ok and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low)
    if high is not None:
        ok = ok and (value < high if high_open else value <= high)
    if not ok:
        lo, hi = ("(" if low_open else "["), ("" if high is None else (")" if high_open else "]"))
        interval = f"{lo}{low}, {'inf)' if high is None else f'{high}{hi}'}"
        raise ValueError(f"{name} must be a finite number in {interval}, got {value!r}")
    return float(value)


def check_seed(seed: object) -> None:
    """Raise ``ValueError`` unless ``seed`` is an integer >= 0, what NumPy's generators take
    (``np.random.default_rng(-1)`` says only "expected non-negative integer")."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")


def check_kv_heads(heads: int, kv_heads: int | None) -> int:
    """H_kv for ``kv_heads`` (None = ``heads``); ``ValueError`` naming it unless it is a
    positive integer dividing ``heads``."""
    if kv_heads is None:
        return heads
    check_positive("kv_heads", kv_heads, integer=True)
    if heads % kv_heads:
        raise ValueError(f"kv_heads={kv_heads} does not divide heads={heads}")
    return int(kv_heads)

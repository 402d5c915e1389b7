"""The checks of ``tests/test_aliasing.py``: run a pair or a module twice from identical inputs,
once with the caller's arrays overwritten in place between the forward and the backward, and
name what the backward returned differently (bit for bit)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from numpy_transformer import nn


def caller_arrays(value) -> list[np.ndarray]:
    """Every writeable ndarray in ``value``: itself, or inside tuples, lists, dicts and
    ``LSTMState``s."""
    if isinstance(value, np.ndarray):
        return [value] if value.flags.writeable else []
    if isinstance(value, nn.LSTMState):
        value = [value.h, value.c]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [a for v in value for a in caller_arrays(v)]
    return []


def overwrite(arrays: list[np.ndarray], rng: np.random.Generator) -> None:
    """Noise into each array, in place: floats redrawn, booleans flipped, integers (ids)
    rolled by one place, so that they stay valid ids (compiled code does not check them)."""
    for a in arrays:
        if a.dtype.kind == "f":
            a[...] = 3 * rng.standard_normal(a.shape)
        elif a.dtype == np.bool_:
            np.logical_not(a, out=a)
        else:
            a[...] = np.roll(a, 1)


def upstream(outputs: tuple, seed: int) -> tuple:
    """A random gradient for each output, in its dtype (a float for a scalar loss)."""
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(o.shape).astype(o.dtype) if isinstance(o, np.ndarray)
                 else float(rng.standard_normal()) for o in outputs)


def snapshot(value):
    """A copy of a backward's result (an array, None, or nested tuples of them)."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, (tuple, list)):
        return tuple(snapshot(v) for v in value)
    return value


def differences(clean, dirty, name: str = "result") -> list[str]:
    """The names of the entries of two results that are not the same bit for bit."""
    if isinstance(clean, (tuple, list)):
        return [d for i, (c, g) in enumerate(zip(clean, dirty, strict=True))
                for d in differences(c, g, f"{name}[{i}]")]
    if isinstance(clean, np.ndarray):
        same = (isinstance(dirty, np.ndarray) and clean.dtype == dirty.dtype
                and clean.shape == dirty.shape and clean.tobytes() == dirty.tobytes())
        return [] if same else [name]
    return [] if clean == dirty else [name]


def _out_and_cache(result):
    out, cache = result
    return (out,), cache


def _grads_then_cache(backward, douts, cache):
    return backward(*douts, cache)


@dataclass
class PairCase:
    """One call of a pair: ``forward(*args, **kwargs)``, then the backward on its cache."""

    args: list  # the forward's positional arguments; every ndarray among them is overwritten
    kwargs: dict = field(default_factory=dict)  # keyword arguments, overwritten alike
    split: Callable = _out_and_cache  # the forward's result -> (outputs, cache)
    call: Callable = _grads_then_cache  # (backward, upstream gradients, cache) -> its result


def pair_difference(forward: Callable, backward: Callable, build: Callable, dtype,
                    seed: int = 0) -> list[str]:
    """Which results of ``backward`` move when the caller's arrays are overwritten after
    ``forward``: the case ``build(rng, dtype)`` is run twice from the same seed, clean and
    overwritten; returns the names of the results that differ (empty: none)."""
    results = []
    for dirty in (False, True):
        case = build(np.random.default_rng(seed), np.dtype(dtype))
        outputs, cache = case.split(forward(*case.args, **case.kwargs))
        if dirty:
            overwrite(caller_arrays([case.args, case.kwargs]), np.random.default_rng(seed + 1))
        results.append(snapshot(case.call(backward, upstream(outputs, seed + 2), cache)))
    return differences(*results)


@dataclass
class ModuleCase:
    """One call of a module: ``module.forward(*args, **kwargs)``, then its backward."""

    module: nn.Module
    args: list  # what the caller passes in and holds: every ndarray among them is overwritten
    kwargs: dict = field(default_factory=dict)
    owner: nn.Module | None = None  # whose gradients the backward fills, if not the module's


def module_difference(build: Callable, dtype, backend: str, seed: int = 0) -> list[str]:
    """As :func:`pair_difference` for the module ``build(rng, dtype, backend)`` builds: the
    names of its gradients (and of its returned input gradients) that differ."""
    results = []
    for dirty in (False, True):
        case = build(np.random.default_rng(seed), np.dtype(dtype), backend)
        out = case.module.forward(*case.args, **case.kwargs)
        if dirty:
            overwrite(caller_arrays([case.args, case.kwargs]), np.random.default_rng(seed + 1))
        dinput = snapshot(case.module.backward(upstream((out,), seed + 2)[0]))
        owner = case.owner or case.module
        results.append({"returned": dinput, **{f"grad {name}": g.copy()
                                               for name, _, g in owner.named_parameters()}})
    clean, dirty = results
    return [d for name in clean for d in differences(clean[name], dirty[name], name)]

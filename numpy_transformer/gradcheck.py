"""Finite-difference gradient checks for any op, module or whole model: a user feature.

Every check works the same way. Pick a random upstream gradient ``G`` (never ``ones``: for
softmax the true gradient would then be exactly zero and no bug could show), form the scalar
``L = sum(out * G)``, and compare the backward's ``dL/dx`` for every input and parameter with
the central difference ``(L(x + h e_i) - L(x - h e_i)) / 2h``, entry by entry, in float64.

The relative error of a tensor is ``max |analytic - numeric| / max(max |analytic|,
max |numeric|)``: the worst entry error measured against the tensor's own scale, so entries
that happen to be near zero do not inflate it. Central differences in float64 with h = 1e-6
reach about 1e-9 on smooth functions; a wrong backward gives errors of order 1.

For big models, :func:`check_direction` costs two forward passes: it compares the directional
derivative ``<G, J v>`` by finite differences with ``<J^T G, v>`` from the backward, for one
random direction ``v`` over all inputs and parameters at once (the check of JAX's
``check_vjp``).

For a reader deriving gradients by hand (the notebooks of ``docs/notebooks``),
:func:`compare` checks one array of their own against the library's and against finite
differences, and prints one line: ``exact``, ``close (max rel err ...)`` or
``WRONG (max abs err ...)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

ZERO_TOL = 1e-8  # a gradient that is zero in theory must be zero to within this, absolutely


@dataclass
class GradcheckRow:
    """One named tensor's result."""

    name: str
    shape: tuple
    max_abs: float
    max_rel: float
    expect_zero: bool = False  # true gradient is exactly zero: judged by max_abs <= ZERO_TOL

    def ok(self, tol: float) -> bool:
        """Relative error within ``tol`` (absolute within ``ZERO_TOL`` for a known-zero one)."""
        return self.max_abs <= ZERO_TOL if self.expect_zero else self.max_rel <= tol


@dataclass
class GradcheckReport:
    """Per-tensor errors of one check; ``str(report)`` is a readable table."""

    title: str
    rows: list[GradcheckRow] = field(default_factory=list)

    @property
    def max_rel(self) -> float:
        """The worst relative error over the tensors not known to have a zero gradient."""
        return max((r.max_rel for r in self.rows if not r.expect_zero), default=0.0)

    def ok(self, tol: float = 1e-6) -> bool:
        """True when every tensor passes (see :meth:`GradcheckRow.ok`)."""
        return all(r.ok(tol) for r in self.rows)

    def __str__(self) -> str:
        lines = [self.title, f"  {'tensor':<38}{'shape':<16}{'max abs err':>13}{'max rel err':>13}"]
        for r in self.rows:
            rel = f"{'(zero)':>13}  true gradient is 0" if r.expect_zero else f"{r.max_rel:>13.2e}"
            lines.append(f"  {r.name:<38}{str(r.shape):<16}{r.max_abs:>13.2e}{rel}")
        return "\n".join(lines)


def _compare(name: str, analytic: np.ndarray, numeric: np.ndarray) -> GradcheckRow:
    diff = np.abs(analytic - numeric).max(initial=0.0)
    scale = max(np.abs(analytic).max(initial=0.0), np.abs(numeric).max(initial=0.0))
    rel = 0.0 if diff == 0.0 else diff / max(scale, 1e-300)
    return GradcheckRow(name, tuple(analytic.shape), float(diff), float(rel))


def numeric_grad(loss: Callable[[], float], x: np.ndarray, h: float = 1e-6,
                 entries: np.ndarray | None = None) -> np.ndarray:
    """Central differences of the scalar ``loss()`` with respect to the entries of ``x``.

    ``x`` is perturbed in place and restored, so ``loss`` must read ``x`` when called.

    Parameters
    ----------
    loss : callable
        ``loss() -> float``, reading ``x``.
    x : ndarray
        Float64, perturbed one entry at a time.
    h : float, default 1e-6
        Step of the central difference.
    entries : ndarray of int, optional
        Flat indices into ``x``: only these entries are perturbed (two calls of ``loss`` each,
        for tensors too big to difference whole).

    Returns
    -------
    grad : ndarray
        Shaped like ``x``; or, with ``entries``, of shape ``entries.shape``, the derivatives
        at those entries.
    """
    flat = x.reshape(-1)  # a view: writes reach x
    index = np.arange(flat.size) if entries is None else np.asarray(entries)
    grad = np.zeros(index.shape, dtype=x.dtype)
    gflat = grad.reshape(-1)  # a view: writes reach grad
    for i, j in enumerate(index.reshape(-1)):
        old = flat[j]
        flat[j] = old + h
        up = loss()
        flat[j] = old - h
        down = loss()
        flat[j] = old
        gflat[i] = (up - down) / (2.0 * h)
    return grad.reshape(x.shape) if entries is None else grad


def _require_float64(named: dict[str, np.ndarray]) -> None:
    for name, x in named.items():
        if x.dtype != np.float64:
            raise ValueError(f"gradcheck needs float64 tensors, {name} is {x.dtype}")


def check_op(forward: Callable, backward: Callable, inputs: dict[str, np.ndarray], *,
             seed: int = 0, h: float = 1e-6, title: str = "op") -> GradcheckReport:
    """Check a functional forward/backward pair against central differences.

    Parameters
    ----------
    forward : callable
        ``forward(*inputs.values()) -> (out, cache)``; ``out`` may be a tuple of arrays (an
        LSTM's output and final state), each then gets its own random upstream gradient.
    backward : callable
        ``backward(dout, cache)`` returning one gradient per input, in the order of
        ``inputs`` (a single array when there is one input); ``dout`` is a tuple when
        ``out`` is.
    inputs : dict of str to float64 ndarray
        The differentiable inputs by name; bind anything else (masks, eps) into ``forward``.
    seed : int
        Seed of the random upstream gradient.
    h : float
        Finite-difference step.

    Returns
    -------
    GradcheckReport

    Examples
    --------
    >>> import numpy as np
    >>> from numpy_transformer.functional.norms import layer_norm_forward, layer_norm_backward
    >>> rng = np.random.default_rng(0)
    >>> x, w, b = rng.normal(size=(2, 3, 4)), rng.normal(size=4), rng.normal(size=4)
    >>> report = check_op(layer_norm_forward, layer_norm_backward, {"x": x, "w": w, "b": b})
    >>> report.ok()
    True
    """
    _require_float64(inputs)
    args = list(inputs.values())
    out, cache = forward(*args)
    several = isinstance(out, tuple)
    gen = np.random.default_rng(seed)
    gs = tuple(gen.standard_normal(np.shape(o)) for o in (out if several else (out,)))
    grads = backward(gs if several else gs[0], cache)
    grads = (grads,) if len(args) == 1 else tuple(grads)

    def loss() -> float:
        outs = forward(*args)[0]
        return float(sum((o * g).sum() for o, g in zip(outs if several else (outs,), gs,
                                                        strict=True)))

    report = GradcheckReport(title)
    for (name, x), analytic in zip(inputs.items(), grads, strict=True):
        report.rows.append(_compare(name, analytic, numeric_grad(loss, x, h)))
    return report


def zero_gradient_names(module, prefix: str = "") -> set[str]:
    """Dotted names of parameters whose true gradient is exactly zero: key biases without RoPE.

    The key bias ``bk`` adds ``q . bk`` to every score of a query row: the same number across
    the row, which softmax ignores. Its gradient is therefore exactly zero, and a gradient
    check must judge it by absolute error (both sides are rounding noise). With RoPE the bias
    is rotated differently at each key position, and the gradient is real.
    """
    from .nn import MultiHeadAttention  # gradcheck works on any op without the modules

    names = set()
    if isinstance(module, MultiHeadAttention) and not module.rope:
        names.add(prefix + "bk")
    for name, child in getattr(module, "children", {}).items():
        names |= zero_gradient_names(child, prefix + name + ".")
    return names


def _module_call(module, inputs: dict[str, np.ndarray], g: np.ndarray | None, kwargs: dict):
    """Forward, then (when ``g`` is given) zero the grads and run backward. Returns out, dinputs."""
    out = module.forward(*inputs.values(), **kwargs)
    if g is None:
        return out, None
    module.zero_grad()
    dinputs = module.backward(g)
    return out, dinputs if isinstance(dinputs, tuple) else (dinputs,)


def check_module(module, inputs: dict[str, np.ndarray], *, seed: int = 0, h: float = 1e-6,
                 title: str | None = None, expect_zero: set[str] | None = None,
                 **kwargs) -> GradcheckReport:
    """Check a module's backward for every float input and every parameter.

    Parameters
    ----------
    module : Module
        Anything with ``forward``, ``backward``, ``zero_grad`` and ``named_parameters``
        (``(name, param, grad)`` triples), in float64.
    inputs : dict of str to ndarray
        Positional inputs of ``forward`` by name. Float inputs are checked, integer ones (token
        ids) are passed through. The backward returns one gradient per float input, in order.
    expect_zero : set of str, optional
        Parameters whose true gradient is exactly zero, judged by absolute error instead (a
        relative error of rounding noise against rounding noise means nothing). Default: the
        key biases of attentions without RoPE, see :func:`zero_gradient_names`.
    **kwargs
        Passed to ``forward`` (masks, a training flag, ...).

    Returns
    -------
    GradcheckReport
    """
    params = {name: p for name, p, _ in module.named_parameters()}
    floats = {n: x for n, x in inputs.items() if np.issubdtype(np.asarray(x).dtype, np.floating)}
    _require_float64({**floats, **params})
    out = module.forward(*inputs.values(), **kwargs)
    g = np.random.default_rng(seed).standard_normal(np.shape(out))
    _, dinputs = _module_call(module, inputs, g, kwargs)
    analytic = {name: grad.copy() for name, _, grad in module.named_parameters()}

    def loss() -> float:
        return float((module.forward(*inputs.values(), **kwargs) * g).sum())

    if expect_zero is None:
        expect_zero = zero_gradient_names(module)
    report = GradcheckReport(title or type(module).__name__)
    for (name, x), dx in zip(floats.items(), dinputs, strict=False):
        report.rows.append(_compare(f"input {name}", dx, numeric_grad(loss, x, h)))
    for name, p in params.items():
        row = _compare(name, analytic[name], numeric_grad(loss, p, h))
        row.expect_zero = name in expect_zero
        report.rows.append(row)
    return report


def check_direction(module, inputs: dict[str, np.ndarray], *, seed: int = 0, h: float = 1e-5,
                    title: str | None = None, **kwargs) -> GradcheckReport:
    """The cheap check for big models: one random direction over all inputs and parameters.

    Compares ``<G, (f(theta + h v) - f(theta - h v)) / 2h>`` with ``<v, J^T G>`` from the
    backward, where ``theta`` gathers every float input and parameter and ``v`` is a random
    unit-scale direction. Two forward passes, whatever the model size.

    Returns
    -------
    GradcheckReport
        One row, ``"direction"``: the absolute and relative error of the two numbers.

    Notes
    -----
    The step moves every parameter at once. In a trained ReLU network many pre-activations
    sit near 0, and a step that carries one across its kink spoils the finite difference,
    not the gradient: the chapter's char model after ``numpy-transformer train`` gives a
    relative error near 1e-2 at ``h=1e-5`` and ``1e-6``, and 3e-10 at ``h=1e-7``
    (``examples/study_gradient.py``). For such a model pass a smaller ``h``.
    """
    rng = np.random.default_rng(seed)
    tensors = {f"input {n}": x for n, x in inputs.items()
               if np.issubdtype(np.asarray(x).dtype, np.floating)}
    tensors.update({name: p for name, p, _ in module.named_parameters()})
    _require_float64(tensors)
    out = module.forward(*inputs.values(), **kwargs)
    g = rng.standard_normal(np.shape(out))
    _, dinputs = _module_call(module, inputs, g, kwargs)
    grads = dict(zip([n for n in tensors if n.startswith("input ")], dinputs, strict=False))
    grads.update({name: grad for name, _, grad in module.named_parameters()})
    v = {n: rng.standard_normal(x.shape) for n, x in tensors.items()}
    analytic = sum(float((v[n] * grads[n]).sum()) for n in tensors)

    def shift(sign: float) -> None:
        for n, x in tensors.items():
            x += sign * h * v[n]

    shift(+1.0)
    up = float((module.forward(*inputs.values(), **kwargs) * g).sum())
    shift(-2.0)
    down = float((module.forward(*inputs.values(), **kwargs) * g).sum())
    shift(+1.0)
    numeric = (up - down) / (2.0 * h)
    row = _compare("direction <v, J^T G>", np.array(analytic), np.array(numeric))
    return GradcheckReport(title or f"{type(module).__name__} (random direction)", [row])


# ---------------------------------------------------------------------------------------------
# compare: one line per tensor, for a reader checking a gradient derived by hand
# ---------------------------------------------------------------------------------------------

class WrongGradientError(AssertionError):
    """Raised by :func:`compare` after it printed a ``WRONG`` verdict."""


def verdict(mine: np.ndarray, other: np.ndarray, tol: float = 1e-6, atol: float = 1e-10) -> str:
    """``"exact"``, ``"close (max rel err e)"`` or ``"WRONG (max abs err e)"`` for two arrays.

    Exact means the same shape and bit-for-bit equal values. Close means the worst entry error
    is within ``tol`` of the arrays' scale (the relative error of :func:`check_op`), or within
    ``atol`` absolutely (for gradients that are zero in theory and rounding noise in practice).
    A shape mismatch is ``WRONG`` and names both shapes.
    """
    mine, other = np.asarray(mine), np.asarray(other)
    if mine.shape != other.shape:
        return f"WRONG (shape {mine.shape}, expected {other.shape})"
    if np.array_equal(mine, other):
        return "exact"
    row = _compare("", mine, other)
    if not np.isfinite(row.max_abs):
        return "WRONG (not finite)"
    if row.max_rel <= tol:
        return f"close (max rel err {row.max_rel:.1e})"
    if row.max_abs <= atol:
        return f"close (max abs err {row.max_abs:.1e})"
    return f"WRONG (max abs err {row.max_abs:.1e})"


def _verdicts(mine: np.ndarray, reference, numeric, entries, label: str, tol: float,
              atol: float) -> list[tuple[str, str]]:
    """``(what, verdict)`` of ``mine`` against each of ``reference`` and ``numeric`` given.

    ``numeric`` is compared with the flat ``entries`` of ``mine`` when they are given.
    """
    found = []
    if reference is not None:
        found.append((label, verdict(mine, reference, tol, atol)))
    if numeric is not None:
        at_entries = mine if entries is None else mine.reshape(-1)[np.asarray(entries)]
        found.append(("finite differences", verdict(at_entries, numeric, tol, atol)))
    return found


def compare(name: str, mine: np.ndarray, reference: np.ndarray | None = None,
            numeric: np.ndarray | None = None, *, entries: np.ndarray | None = None,
            tol: float = 1e-6, atol: float = 1e-10, strict: bool = True,
            label: str = "library") -> None:
    """Check a gradient of your own against the library's and against finite differences.

    Prints one line, ``name``, then a verdict against each of ``reference`` and ``numeric``
    that is given: ``exact``, ``close (max rel err ...)`` or ``WRONG (max abs err ...)``
    (see :func:`verdict`). In the spirit of the ``cmp`` of Karpathy's "backprop ninja"
    exercise, and meant to follow each line a reader derives by hand.

    Parameters
    ----------
    name : str
        What ``mine`` is, e.g. ``"dv"``.
    mine : ndarray
        Your array.
    reference : ndarray, optional
        The library's array (from its backward), same shape as ``mine``.
    numeric : ndarray, optional
        Central differences (:func:`numeric_grad`), same shape as ``mine``; or, with
        ``entries``, the derivatives at those flat entries of ``mine`` only.
    entries : ndarray of int, optional
        Flat indices of ``mine`` that ``numeric`` holds.
    tol, atol : float
        Relative and absolute tolerance of a ``close`` verdict. Finite differences in
        float64 reach about 1e-8 relative; a wrong derivation is off by order 1.
    strict : bool, default True
        Raise :class:`WrongGradientError` after printing when a verdict is ``WRONG``, so that
        a notebook run top to bottom (in CI) stops there.
    label : str, default "library"
        What ``reference`` is, printed before its verdict.

    Raises
    ------
    ValueError
        If ``mine`` is still ``...`` (an exercise not filled in yet), or neither
        ``reference`` nor ``numeric`` is given.
    WrongGradientError
        If ``strict`` and a verdict is ``WRONG``.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([1.0, 2.0, 3.0])
    >>> compare("d(x^2)", 2 * x, reference=2 * x, numeric=2 * x + 1e-10)  # doctest: +ELLIPSIS
    d(x^2)          library exact                        finite differences close (max rel...
    """
    if mine is Ellipsis:
        raise ValueError(f"{name} is still ...: write your line in its exercise cell, then run "
                         f"that cell and this one again")
    if reference is None and numeric is None:
        raise ValueError(f"compare({name!r}, ...) needs a reference, numeric values, or both")
    verdicts = _verdicts(np.asarray(mine), reference, numeric, entries, label, tol, atol)
    line = " ".join([f"{name:<15}"] + [f"{what} {v:<28}" for what, v in verdicts]).rstrip()
    print(line)
    if strict and any(v.startswith("WRONG") for _, v in verdicts):
        raise WrongGradientError(line)

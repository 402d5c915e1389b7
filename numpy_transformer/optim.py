"""Optimisers (Adam, AdamW) and global-norm gradient clipping.

The optimisers work on two plain dicts with the same keys, ``params`` and ``grads``
(``dict[str, ndarray]``), and update ``params`` IN PLACE, so any model that can hand out its
parameter and gradient arrays by name can be trained, and nothing here knows about layers.

A training step reads::

    norm = clip_grad_norm(grads, max_norm=1.0)      # global norm, as torch's clip_grad_norm_
    if math.isfinite(norm):
        opt.step(params, grads, lr=schedule(opt.t + 1))

where ``schedule`` is a learning-rate schedule from :mod:`numpy_transformer.schedules`.

The update arithmetic follows ``torch.optim.Adam`` / ``torch.optim.AdamW`` operation by
operation (same order, same rounding points), so a run agrees with PyTorch to float precision.
It is an operation of the optimiser's backend (``numpy_transformer.backend``):
``adam_update_group``, the readable reference of ``functional/adam.py`` or the Numba kernel of
``kernels/adam.py``, one loop that reads and writes each element once (one pass over memory
instead of about a dozen) and updates all the parameters of a model in one parallel call. The
tests check they agree bit for bit.

References
----------
Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015.
Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019.
Pascanu, Mikolov & Bengio, "On the difficulty of training recurrent neural networks", 2013
(gradient clipping by norm).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from ._checks import check_float, check_number
from .backend import Backend, get_backend
from .config import DEFAULT_BACKEND

__all__ = ["global_norm", "clip_grad_norm", "Adam", "AdamW"]


# --------------------------------------------------------------------------------------------
# Gradient clipping
# --------------------------------------------------------------------------------------------

def global_norm(grads: Mapping[str, np.ndarray]) -> float:
    """``sqrt(sum over every tensor of sum(g**2))``, finite whenever every gradient is.

    Raises
    ------
    ValueError
        If a gradient is not a float array.

    Notes
    -----
    The squares are summed by BLAS in the gradients' dtype. In float32 a square overflows
    past 3.4e38, i.e. for an element above 1.8e19, and the sum becomes inf although every
    gradient is finite. Only then is the norm computed again the way LAPACK's ``nrm2`` does:
    every element divided by the largest magnitude s first (so each square is at most 1),
    ``norm = s * sqrt(sum((g / s)**2))``. Finite norms are never recomputed, so they are the
    same numbers as ever.
    """
    sum_sq = 0.0
    for name, g in grads.items():
        check_float(f"grads[{name!r}]", g)
        flat = g.reshape(-1)  # a view for contiguous arrays (a copy otherwise, read only)
        with np.errstate(over="ignore"):  # an overflow is handled below
            sum_sq += float(np.dot(flat, flat))  # BLAS dot: no temporary array
    norm = math.sqrt(sum_sq)
    if norm != math.inf:  # finite, or NaN (a NaN gradient: no scaling can help)
        return norm
    scale = max((float(np.abs(g).max()) for g in grads.values() if g.size), default=0.0)
    if not math.isfinite(scale):  # an infinite gradient: the norm is inf
        return norm
    scaled = (g.reshape(-1) / g.dtype.type(scale) for g in grads.values())  # each |x| <= 1
    return scale * math.sqrt(sum(float(np.dot(x, x)) for x in scaled))


def clip_grad_norm(grads: Mapping[str, np.ndarray], max_norm: float) -> float:
    """Scale all gradients in place so that their GLOBAL L2 norm is at most ``max_norm``.

    Parameters
    ----------
    grads : dict of str to ndarray
        Gradient arrays (float32 or float64); modified in place.
    max_norm : float
        Largest allowed global norm, positive.

    Returns
    -------
    total_norm : float
        The global norm BEFORE clipping, ``sqrt(sum over every tensor of sum(g**2))``
        (:func:`global_norm`: finite whenever every gradient is).
        If it is not finite (inf or NaN) the gradients are left untouched and the value is
        returned so the caller can skip the step. (PyTorch instead multiplies by the NaN or
        zero coefficient it computes; skipping is the decision a training loop wants.)

    Raises
    ------
    ValueError
        If ``max_norm`` is not a positive finite number or a gradient is not a float array.

    Notes
    -----
    One norm over all tensors, not one per tensor: clipping each tensor on its own would
    change the direction of the update, which is what global clipping avoids. As in
    ``torch.nn.utils.clip_grad_norm_``::

        clip_coef = max_norm / (total_norm + 1e-6),   clamped to at most 1.0
        g *= clip_coef  for every g

    The 1e-6 keeps the division finite at a zero norm, and makes a gradient whose norm is
    exactly ``max_norm`` shrink very slightly, as in PyTorch.
    """
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) \
            or not math.isfinite(max_norm) or max_norm <= 0:
        raise ValueError(f"max_norm must be a positive finite number, got {max_norm!r}")
    total_norm = global_norm(grads)
    if not math.isfinite(total_norm):
        return total_norm
    clip_coef = max_norm / (total_norm + 1e-6)
    if clip_coef < 1.0:  # clamped to 1.0: multiplying by 1 would change nothing
        for g in grads.values():
            g *= g.dtype.type(clip_coef)
    return total_norm


# --------------------------------------------------------------------------------------------
# Adam and AdamW
# --------------------------------------------------------------------------------------------

def decay_matrices(name: str, p: np.ndarray) -> bool:
    """Default weight-decay rule: decay weight matrices (``ndim >= 2``), not biases or gains."""
    return p.ndim >= 2


class Adam:
    """Adam with bias correction; updates a dict of parameters in place.

    Parameters
    ----------
    lr : float, default 1e-3
        Learning rate, used when :meth:`step` is not given one.
    betas : (float, float), default (0.9, 0.999)
        Decay rates of the first and second moment averages, each in [0, 1).
    eps : float, default 1e-8
        Added to the denominator, after the bias correction (as PyTorch).
    weight_decay : float, default 0.0
        Adam: an L2 term ``wd * p`` added to the gradient ("coupled"), as ``torch.optim.Adam``.
        :class:`AdamW` instead shrinks the parameter directly ("decoupled").
    decay : callable (name, param) -> bool, or iterable of names, optional
        Which parameters weight decay applies to. Default :func:`decay_matrices`: only arrays
        with ``ndim >= 2`` (weight matrices, embeddings), never biases or norm gains.
    backend : str or Backend, default ``config.DEFAULT_BACKEND``
        Where ``adam_update_group`` comes from: the NumPy reference or the fused numba loop;
        both compute the same numbers. Pass the model's (``config.backend``).

    Attributes
    ----------
    t : int
        Number of updates made (the bias corrections use it).
    m, v : dict of str to ndarray
        First and second moment of each parameter, in the parameter's dtype.

    Notes
    -----
    Per parameter, with g its gradient and t the step counter after ``t += 1``, the update
    whose equations (1)-(7) and rounding points are written out in ``functional/adam.py``
    (the backend's ``adam_update_group`` does the arithmetic; :meth:`step` keeps the state
    and picks each parameter's weight decay by the decay rule): an L2 term ``wd * p`` joins
    g (Adam) or p shrinks by ``1 - lr * wd`` (AdamW), then
    ``m = beta1 m + (1 - beta1) g``, ``v = beta2 v + (1 - beta2) g^2`` and
    ``p = p - lr / (1 - beta1**t) * m / (sqrt(v) / sqrt(1 - beta2**t) + eps)``.

    Dividing by ``1 - beta**t`` corrects the bias of averages that start at zero: after one
    step ``m = (1 - beta1) g``, and ``m / (1 - beta1)`` is ``g`` itself.

    References
    ----------
    Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015.
    """

    decoupled = False  # AdamW sets True: decay the parameter, not the gradient

    def __init__(self, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0,
                 decay: Callable[[str, np.ndarray], bool] | Iterable[str] | None = None,
                 backend: str | Backend = DEFAULT_BACKEND) -> None:
        self.ops = get_backend(backend)
        self.lr = check_number("lr", lr, 0.0)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
        self.betas = (check_number("beta1", betas[0], 0.0, 1.0),
                      check_number("beta2", betas[1], 0.0, 1.0))
        self.eps = check_number("eps", eps, 0.0)
        self.weight_decay = check_number("weight_decay", weight_decay, 0.0)
        if decay is None:
            decay = decay_matrices
        elif not callable(decay):
            if isinstance(decay, str):
                raise ValueError(f"decay must be a callable or a collection of names, got the "
                                 f"string {decay!r} (wrap a single name in a set)")
            decay = frozenset(decay)
        self.decay = decay
        self.t = 0
        self.m: dict[str, np.ndarray] = {}
        self.v: dict[str, np.ndarray] = {}

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(lr={self.lr}, betas={self.betas}, eps={self.eps}, "
                f"weight_decay={self.weight_decay}, backend={self.ops.name!r}, t={self.t})")

    def decays(self, name: str, p: np.ndarray) -> bool:
        """Whether weight decay applies to parameter ``name``."""
        if isinstance(self.decay, frozenset):
            return name in self.decay
        return bool(self.decay(name, p))

    def _check(self, params: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray]) -> None:
        """Validate everything before the first array is touched, so a bad call changes nothing."""
        if set(params) != set(grads):
            missing, extra = sorted(set(params) - set(grads)), sorted(set(grads) - set(params))
            raise ValueError(f"params and grads must have the same keys; no gradient for "
                             f"{missing}, gradient without parameter for {extra}")
        if self.m and set(params) != set(self.m):
            new, gone = sorted(set(params) - set(self.m)), sorted(set(self.m) - set(params))
            raise ValueError(f"the parameters changed since the optimiser state was made: "
                             f"new {new}, missing {gone}")
        if isinstance(self.decay, frozenset) and not self.decay <= set(params):
            raise ValueError(f"decay names {sorted(self.decay - set(params))} are not parameters")
        for name, p in params.items():
            check_float(f"params[{name!r}]", p)
            g = grads[name]
            check_float(f"grads[{name!r}]", g)
            if g.shape != p.shape or g.dtype != p.dtype:
                raise ValueError(f"grads[{name!r}] is {g.dtype} {g.shape} but params[{name!r}] "
                                 f"is {p.dtype} {p.shape}")
            if not p.flags.writeable:
                raise ValueError(f"params[{name!r}] is read-only; the update is in place")
            if self.m and (self.m[name].shape != p.shape or self.m[name].dtype != p.dtype):
                raise ValueError(f"optimiser state for {name!r} is {self.m[name].dtype} "
                                 f"{self.m[name].shape} but the parameter is {p.dtype} {p.shape}")

    def step(self, params: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray],
             lr: float | None = None) -> None:
        """Apply one update to every parameter, in place.

        Parameters
        ----------
        params : dict of str to ndarray
            Parameters (float32 or float64), updated in place.
        grads : dict of str to ndarray
            Their gradients: same keys, shapes and dtypes. Not modified.
        lr : float, optional
            Learning rate for this step (for a schedule); default ``self.lr``.

        Raises
        ------
        ValueError
            If keys, shapes or dtypes disagree, ``lr`` is invalid, or the set of parameters
            differs from the one the moments were made for. Nothing is modified then.
        """
        lr = self.lr if lr is None else check_number("lr", lr, 0.0)
        self._check(params, grads)
        if not self.m:
            for name, p in params.items():
                self.m[name] = np.zeros(p.shape, dtype=p.dtype)
                self.v[name] = np.zeros(p.shape, dtype=p.dtype)
        self.t += 1
        names = list(params)
        self.ops.adam_update_group(
            [params[n] for n in names], [grads[n] for n in names],
            [self.m[n] for n in names], [self.v[n] for n in names],
            lr=lr, beta1=self.betas[0], beta2=self.betas[1], eps=self.eps,
            weight_decays=[self.weight_decay if self.decays(n, params[n]) else 0.0
                           for n in names],
            t=self.t, decoupled=self.decoupled)

    def state_dict(self) -> dict:
        """The optimiser state as plain values: ints, floats and dicts of array copies.

        Returns
        -------
        state : dict
            ``{"t": int, "lr": float, "beta1": float, "beta2": float, "eps": float,
            "weight_decay": float, "m": {name: ndarray}, "v": {name: ndarray}}``.
            The decay rule (a function) is not saved: construct the optimiser with the same
            ``decay`` before :meth:`load_state_dict`.
        """
        return {"t": self.t, "lr": self.lr, "beta1": self.betas[0], "beta2": self.betas[1],
                "eps": self.eps, "weight_decay": self.weight_decay,
                "m": {k: a.copy() for k, a in self.m.items()},
                "v": {k: a.copy() for k, a in self.v.items()}}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a :meth:`state_dict` (arrays are copied); hyperparameters are restored too.

        Raises
        ------
        ValueError
            If a field is missing or malformed, or ``m`` and ``v`` do not match.
        """
        keys = {"t", "lr", "beta1", "beta2", "eps", "weight_decay", "m", "v"}
        if set(state) != keys:
            raise ValueError(f"optimiser state must have keys {sorted(keys)}, got "
                             f"{sorted(state)}")
        t = state["t"]
        if isinstance(t, np.ndarray) and t.shape == ():  # as read back from an npz file
            t = t.item()
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
            raise ValueError(f"state['t'] must be a non-negative integer, got {t!r}")
        m, v = state["m"], state["v"]
        if set(m) != set(v):
            raise ValueError(f"state['m'] and state['v'] have different keys: "
                             f"{sorted(set(m) ^ set(v))}")
        for name in m:
            check_float(f"state['m'][{name!r}]", m[name])
            check_float(f"state['v'][{name!r}]", v[name])
            if m[name].shape != v[name].shape or m[name].dtype != v[name].dtype:
                raise ValueError(f"state['m'][{name!r}] and state['v'][{name!r}] differ in "
                                 f"shape or dtype")
        if (t == 0) != (len(m) == 0):
            raise ValueError(f"state['t'] = {t} but {len(m)} moment arrays: a fresh state has "
                             f"t = 0 and no moments, a used one both")
        hyper = {k: float(np.asarray(state[k])) for k in ("lr", "beta1", "beta2", "eps",
                                                         "weight_decay")}
        self.lr = check_number("state['lr']", hyper["lr"], 0.0)
        self.betas = (check_number("state['beta1']", hyper["beta1"], 0.0, 1.0),
                      check_number("state['beta2']", hyper["beta2"], 0.0, 1.0))
        self.eps = check_number("state['eps']", hyper["eps"], 0.0)
        self.weight_decay = check_number("state['weight_decay']", hyper["weight_decay"], 0.0)
        self.t = int(t)
        self.m = {k: np.array(a, copy=True, order="C") for k, a in m.items()}
        self.v = {k: np.array(a, copy=True, order="C") for k, a in v.items()}


class AdamW(Adam):
    """Adam with decoupled weight decay: the parameter shrinks by ``lr * wd * p`` directly.

    Same parameters as :class:`Adam`, except ``weight_decay`` defaults to 0.01 (as
    ``torch.optim.AdamW``) and enters the update as equation (2) of ``functional/adam.py``,
    ``p = p * (1 - lr * wd)``, instead of being added to the gradient. With Adam's coupled
    L2, the decay term is divided by ``sqrt(v)`` like the gradient, so parameters with large
    gradients are barely decayed; decoupling makes the decay the same for all of them.

    Note the default ``decay`` rule differs from PyTorch's defaults: here only matrices
    (``ndim >= 2``) are decayed; ``torch.optim.AdamW(model.parameters())`` decays everything.
    Pass ``decay=lambda name, p: True`` for PyTorch's behaviour.

    References
    ----------
    Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019.
    """

    decoupled = True

    def __init__(self, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2,
                 decay: Callable[[str, np.ndarray], bool] | Iterable[str] | None = None,
                 backend: str | Backend = DEFAULT_BACKEND) -> None:
        super().__init__(lr, betas, eps, weight_decay, decay, backend)

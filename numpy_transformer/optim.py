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
Two implementations of the same update: :func:`adam_update_numpy` here, the readable
reference, and the Numba kernel of ``kernels/adam.py``, one loop that reads and writes each
element once (one pass over memory instead of about a dozen) and updates all the parameters of
a model in one parallel call. The tests check they agree bit for bit.

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
from .kernels.adam import ParameterSet, adam_update_numba

__all__ = ["clip_grad_norm", "Adam", "AdamW", "adam_update_numpy", "adam_update_numba"]


# --------------------------------------------------------------------------------------------
# Gradient clipping
# --------------------------------------------------------------------------------------------

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
        The global norm BEFORE clipping, ``sqrt(sum over every tensor of sum(g**2))``.
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
    sum_sq = 0.0
    for name, g in grads.items():
        check_float(f"grads[{name!r}]", g)
        flat = g.reshape(-1)  # a view for contiguous arrays (a copy otherwise, read only)
        sum_sq += float(np.dot(flat, flat))  # BLAS dot: no temporary array
    total_norm = math.sqrt(sum_sq)
    if not math.isfinite(total_norm):
        return total_norm
    clip_coef = max_norm / (total_norm + 1e-6)
    if clip_coef < 1.0:  # clamped to 1.0: multiplying by 1 would change nothing
        for g in grads.values():
            g *= g.dtype.type(clip_coef)
    return total_norm


# --------------------------------------------------------------------------------------------
# The Adam update: NumPy reference and fused numba kernel, same arguments, same arithmetic
# --------------------------------------------------------------------------------------------

def adam_update_numpy(p, g, m, v, scratch, decay, l2, w1, beta2, w2, bc2_sqrt, eps, neg_step):
    """One Adam/AdamW update of one parameter, in place, with NumPy: the readable reference.

    Parameters
    ----------
    p, m, v : ndarray, same shape and dtype
        Parameter, first moment, second moment; all updated in place.
    g : ndarray, same shape and dtype
        Gradient; read only.
    scratch : ndarray, same shape and dtype
        Work space, overwritten. Passing it in keeps the step free of allocations.
    decay, l2, w1, beta2, w2, bc2_sqrt, eps, neg_step : scalars of the parameter's dtype
        ``decay = 1 - lr * wd`` (AdamW, else 1), ``l2 = wd`` (Adam, else 0),
        ``w1 = 1 - beta1``, ``w2 = 1 - beta2``, ``bc2_sqrt = sqrt(1 - beta2**t)``,
        ``neg_step = -lr / (1 - beta1**t)``. See :class:`Adam` for the equations.
    """
    if l2 != 0:  # (0) Adam's coupled L2 term joins the gradient: g = g + wd * p
        g = g + l2 * p  # a temporary only on this rarely used path
    if decay != 1:  # (1) AdamW: p = p * (1 - lr * wd)
        p *= decay
    np.subtract(g, m, out=scratch)  # (2) m = m + (1 - beta1) (g - m)   [torch: m.lerp_(g, w1)]
    scratch *= w1
    m += scratch
    np.multiply(g, w2, out=scratch)  # (3) v = beta2 v + (1 - beta2) g g   [torch: addcmul_]
    scratch *= g
    v *= beta2
    v += scratch
    np.sqrt(v, out=scratch)  # (4) denom = sqrt(v) / sqrt(1 - beta2**t) + eps
    scratch /= bc2_sqrt
    scratch += eps
    np.divide(m, scratch, out=scratch)  # (5) p = p - lr / (1 - beta1**t) * m / denom
    scratch *= neg_step
    p += scratch


_KERNELS = {"numpy": adam_update_numpy, "numba": adam_update_numba}


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
    kernel : {"numba", "numpy"}, default "numba"
        The fused numba loop or the NumPy reference; both compute the same numbers.

    Attributes
    ----------
    t : int
        Number of updates made (the bias corrections use it).
    m, v : dict of str to ndarray
        First and second moment of each parameter, in the parameter's dtype.

    Notes
    -----
    Per parameter, with g its gradient and t the step counter after ``t += 1``::

        (0) g = g + wd * p                          Adam only (L2 in the gradient)
        (1) p = p * (1 - lr * wd)                   AdamW only (decoupled decay)
        (2) m = beta1 * m + (1 - beta1) * g         written m + (1 - beta1) (g - m), as torch
        (3) v = beta2 * v + (1 - beta2) * g * g
        (4) denom = sqrt(v) / sqrt(1 - beta2**t) + eps
        (5) p = p - lr / (1 - beta1**t) * m / denom

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
                 kernel: str = "numba") -> None:
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
        if kernel not in _KERNELS:
            raise ValueError(f"kernel must be one of {sorted(_KERNELS)}, got {kernel!r}")
        self.kernel = kernel
        self.t = 0
        self.m: dict[str, np.ndarray] = {}
        self.v: dict[str, np.ndarray] = {}
        self._scratch: dict[np.dtype, np.ndarray] = {}  # one flat work buffer per dtype
        self._sets = None  # (identity of the arrays, their ParameterSets): numba kernel

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(lr={self.lr}, betas={self.betas}, eps={self.eps}, "
                f"weight_decay={self.weight_decay}, kernel={self.kernel!r}, t={self.t})")

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

    def _scratch_like(self, p: np.ndarray) -> np.ndarray:
        buf = self._scratch.get(p.dtype)
        if buf is None or buf.size < p.size:
            buf = self._scratch[p.dtype] = np.empty(p.size, dtype=p.dtype)
        return buf[:p.size].reshape(p.shape)

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
        beta1, beta2 = self.betas
        # Scalars in float64, as torch computes them in Python, then cast to each param's dtype.
        bias_correction1 = 1.0 - beta1 ** self.t
        bc2_sqrt = (1.0 - beta2 ** self.t) ** 0.5
        neg_step = -(lr / bias_correction1)
        # per parameter: (1) AdamW's decay factor, (0) Adam's L2 weight
        wds = {name: self.weight_decay if self.decays(name, p) else 0.0
               for name, p in params.items()}
        decay = {name: 1.0 - lr * wd if self.decoupled else 1.0 for name, wd in wds.items()}
        l2 = {name: 0.0 if self.decoupled else wd for name, wd in wds.items()}

        def shared(f):  # the scalars every parameter shares, in its dtype
            return (f(1.0 - beta1), f(beta2), f(1.0 - beta2), f(bc2_sqrt), f(self.eps),
                    f(neg_step))

        if self.kernel == "numba" and all(p.flags.c_contiguous and grads[n].flags.c_contiguous
                                          for n, p in params.items()):
            for names, group in self._parameter_sets(params, grads):
                f = group.dtype.type
                group.update(np.array([decay[n] for n in names], group.dtype),
                             np.array([l2[n] for n in names], group.dtype), *shared(f))
            return
        update = _KERNELS[self.kernel]
        for name, p in params.items():
            f = p.dtype.type
            update(p, grads[name], self.m[name], self.v[name], self._scratch_like(p),
                   f(decay[name]), f(l2[name]), *shared(f))

    def _parameter_sets(self, params: Mapping[str, np.ndarray],
                        grads: Mapping[str, np.ndarray]) -> list:
        """``[(names, ParameterSet)]``, one per dtype, for the numba kernel. Kept from step
        to step while every array is the same object (the views write through to them)."""
        key = tuple((n, id(p), id(grads[n]), id(self.m[n]), id(self.v[n]))
                    for n, p in params.items())
        if self._sets is None or self._sets[0] != key:
            by_dtype: dict[np.dtype, list[str]] = {}
            for n, p in params.items():
                by_dtype.setdefault(p.dtype, []).append(n)
            self._sets = key, [(names, ParameterSet(
                [params[n] for n in names], [grads[n] for n in names],
                [self.m[n] for n in names], [self.v[n] for n in names]))
                for names in by_dtype.values()]
        return self._sets[1]

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
    ``torch.optim.AdamW``) and enters the update as step (1) of :class:`Adam`'s Notes,
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
                 kernel: str = "numba") -> None:
        super().__init__(lr, betas, eps, weight_decay, decay, kernel)

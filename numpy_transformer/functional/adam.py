"""The Adam / AdamW update of a parameter, in NumPy: the reference the compiled update follows.

:class:`numpy_transformer.optim.Adam` holds the state (moments, step count, decay rule); the
whole update is here, in Kingma & Ba's symbols, at the rounding points of
``torch.optim.Adam`` / ``AdamW`` operation by operation, so a run agrees with PyTorch to float
precision. The compiled backend (``numpy_transformer.backend``) does the same update in one
pass over memory for all parameters at once, checked against this one bit for bit.

Notes
-----
Kingma & Ba's Algorithm 1, with the step count t after ``t += 1``, the parameter θ (``p``),
its gradient g, the learning rate α (``lr``) and the weight decay λ (``weight_decay``)::

    (1) g_t = g + λ θ_{t-1}                           Adam: L2 in the gradient ("coupled")
    (2) θ_{t-1} ← (1 - α λ) θ_{t-1}                   AdamW: decoupled decay (L & H)
    (3) m_t = β1 m_{t-1} + (1 - β1) g_t
    (4) v_t = β2 v_{t-1} + (1 - β2) g_t²
    (5) m̂_t = m_t / (1 - β1^t)
    (6) v̂_t = v_t / (1 - β2^t)
    (7) θ_t = θ_{t-1} - α m̂_t / (√v̂_t + ε)

Adam applies (1) and never (2); AdamW (2) and never (1). Loshchilov & Hutter write (2) as
``θ - η_t λ θ`` with a schedule multiplier η_t; here, as in ``torch.optim.AdamW``, the
scheduled learning rate α plays that part. As torch, (3) is computed as
``m + (1 - β1) (g - m)`` (``lerp``), and (5)-(7) as
``θ - α / (1 - β1^t) · m_t / (√v_t / √(1 - β2^t) + ε)``: the same in exact arithmetic, so ε
is added to √v̂_t. Every scalar (``1 - β1``, ``α / (1 - β1^t)``, ...) is computed in Python
floats (float64), then rounded once to the parameter's dtype; the arrays' arithmetic runs in
that dtype.

References
----------
Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015.
Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .._checks import check_float, check_number, check_positive, check_shaped

# The operations of the backends (numpy_transformer.backend)
__all__ = ['adam_update', 'adam_update_group']


def adam_update(p: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, *, lr: float,
                beta1: float, beta2: float, eps: float, weight_decay: float, t: int,
                decoupled: bool) -> None:
    """One Adam (``decoupled=False``) or AdamW (``decoupled=True``) update of one parameter.

    Parameters
    ----------
    p, m, v : ndarray, all of one shape and float dtype
        Parameter θ, first moment m_{t-1}, second moment v_{t-1}; all three updated in place
        (to θ_t, m_t, v_t).
    g : ndarray, p's shape and dtype
        Gradient; read only.
    lr : float
        Learning rate α, at least 0.
    beta1, beta2 : float
        Decay rates of the moment averages, each in [0, 1).
    eps : float
        ε, added to √v̂_t; at least 0.
    weight_decay : float
        λ, at least 0: an L2 term λθ in the gradient (Adam) or a decay of θ by αλ (AdamW).
    t : int
        Step count, 1 on the first update: the bias corrections use it.
    decoupled : bool
        True for AdamW's decoupled decay (2), False for Adam's L2 term (1).

    Raises
    ------
    ValueError
        If an array or a hyperparameter is not as described; nothing is modified then.

    Notes
    -----
    The equations (1)-(7) and the rounding points are in the module's docstring.
    """
    check_adam_arrays([p], [g], [m], [v])
    lr, beta1, beta2, eps, t = check_adam_hyperparameters(lr, beta1, beta2, eps, t, decoupled)
    weight_decay = check_number("weight_decay", weight_decay, 0.0)
    f = p.dtype.type  # a scalar: computed in Python floats, rounded once to p's dtype
    if decoupled:
        p *= f(1.0 - lr * weight_decay)  # (2) θ ← (1 - α λ) θ
    elif f(weight_decay) != 0:  # (skipped for λ = 0: g + 0·θ would turn a -0 into +0)
        g = g + f(weight_decay) * p  # (1) g_t = g + λ θ
    m += f(1.0 - beta1) * (g - m)  # (3) m_t = β1 m + (1 - β1) g_t
    v[...] = f(beta2) * v + f(1.0 - beta2) * g * g  # (4) v_t = β2 v + (1 - β2) g_t²
    step = f(lr / (1.0 - beta1 ** t))  # (5) α m̂_t = α / (1 - β1^t) · m_t
    denom = np.sqrt(v) / f((1.0 - beta2 ** t) ** 0.5) + f(eps)  # (6) √v̂_t + ε
    p -= step * (m / denom)  # (7) θ_t = θ - α m̂_t / (√v̂_t + ε)


def adam_update_group(ps: Sequence[np.ndarray], gs: Sequence[np.ndarray],
                      ms: Sequence[np.ndarray], vs: Sequence[np.ndarray], *, lr: float,
                      beta1: float, beta2: float, eps: float, weight_decays: Sequence[float],
                      t: int, decoupled: bool) -> None:
    """:func:`adam_update` of every parameter of a model, in place.

    Parameters
    ----------
    ps, gs, ms, vs : sequences of ndarray, as many of each
        Parameters, gradients, first and second moments: the k-th of each as
        :func:`adam_update`'s ``p, g, m, v``. The parameters may have different dtypes.
    weight_decays : sequence of float
        λ of each parameter, at least 0 (0.0 for a parameter the decay rule leaves out).
    lr, beta1, beta2, eps, t, decoupled
        Shared by all parameters, as in :func:`adam_update`.

    Raises
    ------
    ValueError
        If an argument is not as described; everything is checked before the first array is
        touched, so nothing is modified then.
    """
    check_adam_arrays(ps, gs, ms, vs)
    check_adam_hyperparameters(lr, beta1, beta2, eps, t, decoupled)
    weight_decays = check_weight_decays(weight_decays, len(ps))
    for p, g, m, v, weight_decay in zip(ps, gs, ms, vs, weight_decays, strict=True):
        adam_update(p, g, m, v, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                    weight_decay=weight_decay, t=t, decoupled=decoupled)


def check_adam_arrays(ps: Sequence, gs: Sequence, ms: Sequence, vs: Sequence) -> None:
    """Raise ``ValueError`` unless ps, gs, ms, vs hold as many arrays, at least one, the k-th
    of each a float array of ps[k]'s shape and dtype, and ps[k], ms[k], vs[k] writeable."""
    lengths = [len(group) for group in (ps, gs, ms, vs)]
    if len(set(lengths)) != 1 or lengths[0] == 0:
        raise ValueError(f"ps, gs, ms, vs must hold as many arrays, at least one, got {lengths}")
    for group_name, group in zip("pgmv", (ps, gs, ms, vs), strict=True):
        for k, x in enumerate(group):
            name = f"{group_name}s[{k}]" if lengths[0] > 1 else group_name
            if group_name == "p":
                check_float(name, x)
            else:
                check_shaped(name, x, ps[k].shape, ps[k].dtype, what="the parameter")
            if group_name != "g" and not x.flags.writeable:
                raise ValueError(f"{name} is read-only; the update is in place")


def check_adam_hyperparameters(lr: float, beta1: float, beta2: float, eps: float, t: int,
                          decoupled: bool) -> tuple[float, float, float, float, int]:
    """Return ``(lr, beta1, beta2, eps, t)`` as Python floats and an int, or raise
    ``ValueError`` naming the first one out of its range (see :func:`adam_update`)."""
    lr = check_number("lr", lr, 0.0)
    beta1, beta2 = check_number("beta1", beta1, 0.0, 1.0), check_number("beta2", beta2, 0.0, 1.0)
    eps = check_number("eps", eps, 0.0)
    check_positive("t", t, integer=True)
    if not isinstance(decoupled, (bool, np.bool_)):
        raise ValueError(f"decoupled must be True (AdamW) or False (Adam), got {decoupled!r}")
    return lr, beta1, beta2, eps, int(t)


def check_weight_decays(weight_decays: Sequence[float], n: int) -> list[float]:
    """Return the n weight decays as Python floats, or raise ``ValueError`` unless there are
    n of them, each a number at least 0."""
    if isinstance(weight_decays, (str, bytes)) or not hasattr(weight_decays, "__len__") \
            or len(weight_decays) != n:
        raise ValueError(f"weight_decays must hold one number per parameter, {n}, got "
                         f"{weight_decays!r}")
    return [check_number(f"weight_decays[{k}]", wd, 0.0) for k, wd in enumerate(weight_decays)]

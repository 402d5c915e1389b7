"""The Adam / AdamW update of a parameter, in NumPy: the reference the compiled update follows.

:class:`numpy_transformer.optim.Adam` holds the state (moments, step count, decay rule) and
computes the scalars; the arithmetic on the arrays is here, operation by operation in the
order and at the rounding points of ``torch.optim.Adam`` / ``AdamW``, so a run agrees with
PyTorch to float precision. The compiled backend (``numpy_transformer.backend``) does the same
update in one pass over memory for all parameters at once, checked against this one bit for
bit.

Notes
-----
Per parameter, with g its gradient and t the step counter after ``t += 1``::

    (0) g = g + wd * p                          Adam only (L2 in the gradient)
    (1) p = p * (1 - lr * wd)                   AdamW only (decoupled decay)
    (2) m = beta1 * m + (1 - beta1) * g         written m + (1 - beta1) (g - m), as torch
    (3) v = beta2 * v + (1 - beta2) * g * g
    (4) denom = sqrt(v) / sqrt(1 - beta2**t) + eps
    (5) p = p - lr / (1 - beta1**t) * m / denom

References
----------
Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015.
Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .._checks import check_shaped

# The operations of the backends (numpy_transformer.backend)
__all__ = ['adam_update', 'adam_update_group']


def adam_update(p, g, m, v, decay, l2, w1, beta2, w2, bc2_sqrt, eps, neg_step) -> None:
    """One Adam/AdamW update of one parameter, in place.

    Parameters
    ----------
    p, m, v : ndarray, same shape and dtype
        Parameter, first moment, second moment; all updated in place.
    g : ndarray, same shape and dtype
        Gradient; read only.
    decay, l2, w1, beta2, w2, bc2_sqrt, eps, neg_step : scalars of the parameter's dtype
        ``decay = 1 - lr * wd`` (AdamW, else 1), ``l2 = wd`` (Adam, else 0),
        ``w1 = 1 - beta1``, ``w2 = 1 - beta2``, ``bc2_sqrt = sqrt(1 - beta2**t)``,
        ``neg_step = -lr / (1 - beta1**t)``.
    """
    for name, x in (("g", g), ("m", m), ("v", v)):
        check_shaped(name, x, p.shape, what="the parameter p")
    if l2 != 0:  # (0) Adam's coupled L2 term joins the gradient: g = g + wd * p
        g = g + l2 * p
    if decay != 1:  # (1) AdamW: p = p * (1 - lr * wd)
        p *= decay
    tmp = np.subtract(g, m)  # (2) m = m + (1 - beta1) (g - m)   [torch: m.lerp_(g, w1)]
    tmp *= w1
    m += tmp
    np.multiply(g, w2, out=tmp)  # (3) v = beta2 v + (1 - beta2) g g   [torch: addcmul_]
    tmp *= g
    v *= beta2
    v += tmp
    np.sqrt(v, out=tmp)  # (4) denom = sqrt(v) / sqrt(1 - beta2**t) + eps
    tmp /= bc2_sqrt
    tmp += eps
    np.divide(m, tmp, out=tmp)  # (5) p = p - lr / (1 - beta1**t) * m / denom
    tmp *= neg_step
    p += tmp


def adam_update_group(ps: Sequence[np.ndarray], gs: Sequence[np.ndarray],
                      ms: Sequence[np.ndarray], vs: Sequence[np.ndarray], decays: np.ndarray,
                      l2s: np.ndarray, w1, beta2, w2, bc2_sqrt, eps, neg_step) -> None:
    """:func:`adam_update` of every parameter of one dtype; ``decays[i]`` and ``l2s[i]`` are
    parameter i's, the other scalars are shared (all of the parameters' dtype)."""
    for name, values in (("decays", decays), ("l2s", l2s)):
        if np.shape(values) != (len(ps),):
            raise ValueError(f"{name} must hold one value per parameter, {len(ps)}, got shape "
                             f"{np.shape(values)}")
    for i, (p, g, m, v) in enumerate(zip(ps, gs, ms, vs, strict=True)):
        adam_update(p, g, m, v, decays[i], l2s[i], w1, beta2, w2, bc2_sqrt, eps, neg_step)

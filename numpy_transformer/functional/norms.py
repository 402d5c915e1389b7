"""LayerNorm and RMSNorm over the feature (last) axis, each token on its own.

References
----------
Ba, Kiros & Hinton, "Layer Normalization", 2016.
Zhang & Sennrich, "Root Mean Square Layer Normalization", 2019.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import check_float, check_last_dim, check_shaped

# The operations of the backends (numpy_transformer.backend)
__all__ = ['layer_norm_forward', 'layer_norm_backward', 'rms_norm_forward', 'rms_norm_backward']


def check_norm_inputs(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> None:
    """Raise ``ValueError`` unless x is (..., C) and the gain ``w`` (and shift ``b``) are (C,)."""
    check_float("x", x)
    check_float("w", w, ndim=1)
    check_last_dim("x", x, w.shape[0])
    if b is not None:
        check_shaped("b", b, w.shape, what="w")


class LayerNormCache(NamedTuple):
    x_hat: np.ndarray  # (..., C) normalised input
    w: np.ndarray  # (C,) a copy of the gain
    rstd: np.ndarray  # (..., 1) 1 / sqrt(var + eps)


def layer_norm_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-5, *,
                       keep: bool = True):
    """LayerNorm: normalise each token's features to zero mean and unit variance, then affine.

    Parameters
    ----------
    x : ndarray of shape (..., C)
    w, b : ndarray of shape (C,)
        Gain and shift.
    eps : float, default 1e-5 (as ``torch.nn.LayerNorm``)
    keep : bool, default True
        Whether to return the cache a backward needs; False (inference): None.

    Returns
    -------
    out : ndarray of shape (..., C)
    cache : LayerNormCache or None

    Notes
    -----
    (1) mu = mean_C x,  var = mean_C (x - mu)^2  (biased, as PyTorch)
    (2) x_hat = (x - mu) * rstd,  rstd = 1 / sqrt(var + eps)
    (3) out = x_hat * w + b
    """
    check_norm_inputs(x, w, b)
    mu = x.mean(axis=-1, keepdims=True)  # (1) (..., 1)
    xc = x - mu
    var = (xc * xc).mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + x.dtype.type(eps))  # (2)
    x_hat = xc * rstd
    return x_hat * w + b, LayerNormCache(x_hat, w.copy(), rstd) if keep else None  # (3)


def layer_norm_backward(dout: np.ndarray, cache: LayerNormCache):
    """Returns ``(dx, dw, db)``, each shaped like the forward's ``x``, ``w``, ``b``."""
    x_hat, w, rstd = cache
    check_shaped("dout", dout, x_hat.shape)
    lead = tuple(range(dout.ndim - 1))
    # (3) out = x_hat * w + b   =>   dw = sum dout * x_hat,  db = sum dout,  dx_hat = dout * w
    dw = (dout * x_hat).sum(axis=lead)
    db = dout.sum(axis=lead)
    dxh = dout * w
    # (2), (1) x_hat = (x - mu) rstd with mu and var functions of x
    #   =>   dx = rstd * (dxh - mean_C dxh - x_hat * mean_C(dxh * x_hat))
    dx = rstd * (dxh - dxh.mean(axis=-1, keepdims=True)
                 - x_hat * (dxh * x_hat).mean(axis=-1, keepdims=True))
    return dx, dw, db


class RMSNormCache(NamedTuple):
    x_hat: np.ndarray  # (..., C) x / rms(x)
    w: np.ndarray  # (C,) a copy of the gain
    rrms: np.ndarray  # (..., 1) 1 / sqrt(mean x^2 + eps)


def rms_norm_forward(x: np.ndarray, w: np.ndarray, eps: float | None = None, *,
                     keep: bool = True):
    """RMSNorm: divide each token by its root-mean-square, then scale. No mean, no shift.

    Parameters
    ----------
    x : ndarray of shape (..., C)
    w : ndarray of shape (C,)
    eps : float, optional
        Default ``np.finfo(x.dtype).eps``, as ``torch.nn.RMSNorm(eps=None)``.
    keep : bool, default True
        As :func:`layer_norm_forward`'s.

    Returns
    -------
    out : ndarray of shape (..., C)
    cache : RMSNormCache or None

    Notes
    -----
    (1) rrms = 1 / sqrt(mean_C x^2 + eps)   (2) x_hat = x * rrms   (3) out = x_hat * w
    """
    check_norm_inputs(x, w)
    eps = np.finfo(x.dtype).eps if eps is None else eps
    rrms = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + x.dtype.type(eps))  # (1)
    x_hat = x * rrms  # (2)
    return x_hat * w, RMSNormCache(x_hat, w.copy(), rrms) if keep else None  # (3)


def rms_norm_backward(dout: np.ndarray, cache: RMSNormCache):
    """Returns ``(dx, dw)``, shaped like the forward's ``x`` and ``w``."""
    x_hat, w, rrms = cache
    check_shaped("dout", dout, x_hat.shape)
    # (3) out = x_hat * w   =>   dw = sum dout * x_hat,  dx_hat = dout * w
    dw = (dout * x_hat).sum(axis=tuple(range(dout.ndim - 1)))
    dxh = dout * w
    # (2), (1) x_hat = x rrms, d rrms/dx = -rrms^3 x / C
    #   =>   dx = rrms * (dxh - x_hat * mean_C(dxh * x_hat))
    dx = rrms * (dxh - x_hat * (dxh * x_hat).mean(axis=-1, keepdims=True))
    return dx, dw

"""The ops' twins: functions of torch tensors with the signatures of our ``*_forward``.

``linear(x, w, b)`` takes ``w`` in our (C_in, C_out) layout; ``sdpa(q, k, v, mask, bias)``
takes our mask (True = may attend) and gives our zero output for a fully masked row. Position
tables, RoPE angles and ALiBi slopes are computed here from their formulas.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..config import ACTIVATIONS, DTYPES
from ._torch import F, torch

TORCH_DTYPES = {np.dtype(name): getattr(torch, name) for name in DTYPES}  # config.DTYPES


def tensor_of(a, requires_grad: bool = False) -> torch.Tensor:
    """A torch copy of a NumPy array (float arrays may require a gradient)."""
    t = torch.from_numpy(np.array(a, copy=True))
    return t.requires_grad_(True) if requires_grad else t


def linear(x, w, b=None):
    """``x @ w + b`` with ``w`` of shape (C_in, C_out), our layout (``F.linear`` takes w.T)."""
    return F.linear(x, w.T, b)


def embedding(ids, table):
    """``table[ids]``: rows of the (V, C) table."""
    return F.embedding(ids, table)


def relu(x):
    """``max(x, 0)``."""
    return F.relu(x)


def gelu(x):
    """The exact GELU, ``x Phi(x)`` with the normal CDF by erf."""
    return F.gelu(x, approximate="none")


def gelu_tanh(x):
    """GELU's tanh approximation (GPT-2's ``gelu_new``)."""
    return F.gelu(x, approximate="tanh")


def silu(x):
    """``x sigmoid(x)``."""
    return F.silu(x)


def swiglu(gate, up):
    """``silu(gate) * up``: the gated unit of LLaMA's feed-forward network."""
    return F.silu(gate) * up


def activation(name: str) -> Callable:
    """The twin of the activation ``name`` of ``config.ACTIVATIONS``: this module's function of
    that name, ``f(x)``, or ``f(gate, up)`` for a gated one.

    Raises
    ------
    ValueError
        If ``name`` is not a registered activation, or has no twin here.
    """
    if name not in ACTIVATIONS or not callable(globals().get(name)):
        raise ValueError(f"activation {name!r} has no PyTorch twin in {__name__} (the "
                         f"activations: {', '.join(ACTIVATIONS)})")
    return globals()[name]


def softmax(x):
    """Softmax over the last axis."""
    return torch.softmax(x, dim=-1)


def log_softmax(x):
    """Log-softmax over the last axis."""
    return torch.log_softmax(x, dim=-1)


def cross_entropy(logits, targets, ignore_index: int = -100, mask=None):
    """Mean NLL over the counted targets; a ``mask`` (True = counted) becomes ignore_index."""
    if mask is not None:
        targets = torch.where(mask, targets, ignore_index)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=ignore_index)


def layer_norm(x, w, b, eps: float = 1e-5):
    """LayerNorm over the last axis with gain ``w`` and shift ``b``."""
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def rms_norm(x, w, eps: float | None = None):
    """RMSNorm over the last axis; ``eps=None`` is the dtype's machine epsilon."""
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def sdpa(q, k, v, mask=None, bias=None, scale=None, dropout=None):
    """Attention with our conventions: mask True = may attend; a fully masked row gives 0.

    ``F.scaled_dot_product_attention`` returns NaN for such a row; here the row's scores are
    replaced by zeros before the softmax and its weights multiplied by 0 afterwards, so
    neither the output nor any gradient sees a NaN. ``dropout``, a function of the weights
    (an ``nn.Dropout``, or a fixed mask's product), acts on them after the softmax.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale  # (B, H, T_q, T_k)
    if bias is not None:
        s = s + bias
    if mask is None:
        p = torch.softmax(s, dim=-1)
    else:
        visible = mask.any(dim=-1, keepdim=True)  # (..., T_q, 1) does the row see any key?
        s = s.masked_fill(~mask, -math.inf).masked_fill(~visible, 0.0)
        p = torch.softmax(s, dim=-1) * visible
    return (p if dropout is None else dropout(p)) @ v


def rope_tables(length: int, head_width: int, base: float = 10000.0, dtype=torch.float64):
    """``(cos, sin)`` of the angles p * base^(-2i/D), each (length, D/2)."""
    theta = base ** (-torch.arange(0, head_width, 2, dtype=torch.float64) / head_width)
    angles = torch.arange(length, dtype=torch.float64)[:, None] * theta
    return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)


def rope(x, cos, sin):
    """Rotate each feature pair (2i, 2i+1) by its angle (the interleaved, GPT-J layout)."""
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def sinusoidal_table(length: int, width: int, dtype=torch.float64):
    """PE[p, 2i] = sin(p theta_i), PE[p, 2i+1] = cos(p theta_i), theta_i = 10000^(-2i/C)."""
    cos, sin = rope_tables(length, width, 1e4, torch.float64)
    return torch.stack((sin, cos), dim=-1).flatten(-2).to(dtype)


def alibi_slopes(heads: int) -> torch.Tensor:
    """2^(-8/n), 2^(-16/n), ... for n = heads a power of two; else Press et al.'s interleave."""
    def power_of_two(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    low = 2 ** int(math.floor(math.log2(heads)))
    slopes = power_of_two(low) + power_of_two(2 * low)[0::2][: heads - low]
    return torch.tensor(slopes, dtype=torch.float64)


def alibi_bias(heads: int, t_q: int, t_k: int, dtype=torch.float64):
    """-m_h |i + t_k - t_q - j| of shape (1, H, T_q, T_k)."""
    qpos = torch.arange(t_q)[:, None] + (t_k - t_q)
    dist = (qpos - torch.arange(t_k)[None, :]).abs().to(torch.float64)
    return (-alibi_slopes(heads)[:, None, None] * dist)[None].to(dtype)


def causal_mask(t: int) -> torch.Tensor:
    """(T, T) boolean, True on and below the diagonal: query i may attend keys j <= i."""
    return torch.ones(t, t, dtype=torch.bool).tril()


def key_padding_mask(lengths, t_k: int) -> torch.Tensor:
    """(B, 1, 1, T_k), True where key j < lengths[b]."""
    return (torch.arange(t_k)[None, :] < lengths[:, None])[:, None, None, :]

"""Transformer blocks: the encoder block and the decoder block, pre-LN or post-LN.

Each sublayer reads the residual stream and writes a correction back into it. The backward
walks the sublayers in exact reverse order, and at every residual addition the gradient
splits in two: the part that flows straight through (``dres``) and the part that went through
the sublayer, summed as ``dx = dres + dsub``. In a pre-LN block the sublayer's path ends in
the norm that read the stream: ``dsub`` is the norm's backward.

References
----------
Vaswani et al., "Attention Is All You Need", 2017 (post-LN).
Xiong et al., "On Layer Normalization in the Transformer Architecture", 2020 (pre-LN).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..backend import get_backend
from ..config import DEFAULT_BACKEND
from ..functional.masks import causal_mask, combine_masks
from .attention import MultiHeadAttention
from .layers import Dropout, FeedForward, make_norm
from .module import Module

if TYPE_CHECKING:
    from ..backend import Backend
    from .decoding import BlockCache


def _seed(rng: np.random.Generator) -> int:
    """A dropout seed drawn from the block's generator, so one model seed fixes everything."""
    return int(rng.integers(2**32))


class _Block(Module):
    """What both blocks share: the backend."""

    def __init__(self, backend: str | Backend) -> None:
        super().__init__()
        self.ops = get_backend(backend)


class EncoderBlock(_Block):
    """Bidirectional self-attention and a feed-forward network, each with a residual.

    Parameters
    ----------
    width, heads, ffn_width : int
        C, H and the FFN's hidden width F.
    norm : str, default "layernorm"
        One of ``config.NORMS``.
    norm_eps : float, optional
        The norms' epsilon (default: the norm's own, :func:`make_norm`).
    activation : str, default "gelu"
        One of ``config.ACTIVATIONS``.
    norm_first : bool, default True
        Pre-LN (True) or post-LN (False).
    dropout : float, default 0.0
        Applied to each sublayer's output before the residual addition.
    attn_dropout : float, default 0.0
        Applied to the attention weights (see :class:`MultiHeadAttention`).
    kv_heads : int, optional
        H_kv of the attention (None = H; see :class:`MultiHeadAttention`).
    rope, alibi, max_len
        Passed to the self-attention (see :class:`MultiHeadAttention`).
    bias : bool, default True
        Whether the attention's projections and the feed-forward network's linear layers add
        a bias.
    backend : str or Backend, default ``config.DEFAULT_BACKEND``
    dtype : dtype, default float64
    rng : np.random.Generator, optional

    Notes
    -----
    Pre-LN:                                   Post-LN:
    (1) x = x + drop1(attn(norm1(x)))         (1) x = norm1(x + drop1(attn(x)))
    (2) x = x + drop2(ffn(norm2(x)))          (2) x = norm2(x + drop2(ffn(x)))
    """

    def __init__(self, width: int, heads: int, ffn_width: int, *, kv_heads: int | None = None,
                 norm: str = "layernorm", norm_eps: float | None = None,
                 activation: str = "gelu", norm_first: bool = True, dropout: float = 0.0,
                 attn_dropout: float = 0.0, rope: bool = False, alibi: bool = False,
                 max_len: int | None = None,
                 bias: bool = True, backend: str | Backend = DEFAULT_BACKEND,
                 dtype=np.float64, rng: np.random.Generator | None = None) -> None:
        super().__init__(backend)
        rng = np.random.default_rng() if rng is None else rng
        ops = self.ops
        self.norm_first = norm_first
        self.norm1 = self.add("norm1", make_norm(norm, width, norm_eps, dtype=dtype,
                                                 backend=ops))
        self.attn = self.add("attn", MultiHeadAttention(
            width, heads, kv_heads=kv_heads, rope=rope, alibi=alibi, max_len=max_len, bias=bias,
            dropout=attn_dropout, backend=ops, dtype=dtype, rng=rng))
        self.drop1 = self.add("drop1", Dropout(dropout, seed=_seed(rng)))
        self.norm2 = self.add("norm2", make_norm(norm, width, norm_eps, dtype=dtype,
                                                 backend=ops))
        self.ffn = self.add("ffn", FeedForward(width, ffn_width, activation, bias=bias,
                                                  dtype=dtype, rng=rng, backend=ops))
        self.drop2 = self.add("drop2", Dropout(dropout, seed=_seed(rng)))

    def forward(self, x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """x : (B, T, C) -> (B, T, C); ``mask`` (True = may attend) goes to the attention."""
        if self.norm_first:
            x = x + self.drop1(self.attn(self.norm1(x), mask=mask))  # (1)
            x = x + self.drop2(self.ffn(self.norm2(x)))  # (2)
        else:
            x = self.norm1(x + self.drop1(self.attn(x, mask=mask)))  # (1)
            x = self.norm2(x + self.drop2(self.ffn(x)))  # (2)
        return self.expect_grad_like(x)

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """dout : (B, T, C) -> dx : (B, T, C)."""
        self.check_grad("dout", dout)
        if self.norm_first:
            # (2) x2 = x1 + drop2(ffn(norm2(x1)))  =>  dx1 = dout + norm2'(ffn'(drop2'(dout)))
            dsub = self.norm2.backward(self.ffn.backward(self.drop2.backward(dout)))
            dx1 = dout + dsub
            # (1) x1 = x + drop1(attn(norm1(x)))  =>  dx = dx1 + norm1'(attn'(drop1'(dx1)))
            dsub = self.norm1.backward(self.attn.backward(self.drop1.backward(dx1)))
            return dx1 + dsub
        # (2) x2 = norm2(s2),  s2 = x1 + drop2(ffn(x1))  =>  dx1 = ds2 + ffn'(drop2'(ds2))
        ds2 = self.norm2.backward(dout)
        dx1 = ds2 + self.ffn.backward(self.drop2.backward(ds2))
        # (1) x1 = norm1(s1),  s1 = x + drop1(attn(x))  =>  dx = ds1 + attn'(drop1'(ds1))
        ds1 = self.norm1.backward(dx1)
        return ds1 + self.attn.backward(self.drop1.backward(ds1))


class DecoderBlock(_Block):
    """Causal self-attention, optional cross-attention to an encoder's output, then an FFN.

    Parameters
    ----------
    width, heads, ffn_width, kv_heads, norm, norm_eps, activation, norm_first, dropout,
    attn_dropout, rope, alibi, max_len, bias, backend, dtype, rng
        As for :class:`EncoderBlock` (rope and alibi apply to the self-attention only;
        kv_heads and attn_dropout to both attentions).
    cross : bool, default False
        Add the cross-attention sublayer (encoder-decoder models). Without it this is the
        block of a decoder-only language model.

    Notes
    -----
    Pre-LN (post-LN moves each norm after its addition, as in :class:`EncoderBlock`):

    (1) x = x + drop1(attn(norm1(x), causal mask))
    (2) x = x + cross_drop(cross_attn(cross_norm(x), memory))       (if cross)
    (3) x = x + drop2(ffn(norm2(x)))
    """

    def __init__(self, width: int, heads: int, ffn_width: int, *, kv_heads: int | None = None,
                 cross: bool = False, norm: str = "layernorm", norm_eps: float | None = None,
                 activation: str = "gelu", norm_first: bool = True, dropout: float = 0.0,
                 attn_dropout: float = 0.0, rope: bool = False, alibi: bool = False,
                 max_len: int | None = None,
                 bias: bool = True,
                 backend: str | Backend = DEFAULT_BACKEND, dtype=np.float64,
                 rng: np.random.Generator | None = None) -> None:
        super().__init__(backend)
        rng = np.random.default_rng() if rng is None else rng
        ops = self.ops
        self.norm_first, self.cross = norm_first, cross
        self.norm1 = self.add("norm1", make_norm(norm, width, norm_eps, dtype=dtype,
                                                 backend=ops))
        self.attn = self.add("attn", MultiHeadAttention(
            width, heads, kv_heads=kv_heads, rope=rope, alibi=alibi, max_len=max_len, bias=bias,
            dropout=attn_dropout, backend=ops, dtype=dtype, rng=rng))
        self.drop1 = self.add("drop1", Dropout(dropout, seed=_seed(rng)))
        if cross:
            self.cross_norm = self.add("cross_norm", make_norm(norm, width, norm_eps,
                                                               dtype=dtype, backend=ops))
            self.cross_attn = self.add("cross_attn", MultiHeadAttention(
                width, heads, kv_heads=kv_heads, bias=bias, dropout=attn_dropout, backend=ops,
                dtype=dtype, rng=rng))
            self.cross_drop = self.add("cross_drop", Dropout(dropout, seed=_seed(rng)))
        self.norm2 = self.add("norm2", make_norm(norm, width, norm_eps, dtype=dtype,
                                                 backend=ops))
        self.ffn = self.add("ffn", FeedForward(width, ffn_width, activation, bias=bias,
                                                  dtype=dtype, rng=rng, backend=ops))
        self.drop2 = self.add("drop2", Dropout(dropout, seed=_seed(rng)))

    def forward(self, x: np.ndarray, memory: np.ndarray | None = None,
                memory_mask: np.ndarray | None = None, mask: np.ndarray | None = None,
                kv_cache: BlockCache | None = None) -> np.ndarray:
        """Run the block.

        Parameters
        ----------
        x : ndarray of shape (B, T, C)
        memory : ndarray of shape (B, T_s, C), required when ``cross``
            The encoder's output, attended by the cross-attention.
        memory_mask : ndarray of bool, broadcastable to (B, H, T, T_s), optional
            Which memory positions may be attended (the source padding).
        mask : ndarray of bool, broadcastable to (B, H, T, T_so_far), optional
            Extra self-attention mask, combined (AND) with the causal mask.
        kv_cache : BlockCache, optional
            Cached decoding (``nn/decoding.py``): x holds the positions after those in the
            cache, and the self-attention also attends to the cached ones.

        Returns
        -------
        out : ndarray of shape (B, T, C)
        """
        if self.cross and memory is None:
            raise ValueError("this DecoderBlock has cross-attention: pass the encoder's memory")
        if not self.cross and memory is not None:
            raise ValueError("memory given, but this DecoderBlock was built with cross=False")
        attn_kv, cross_kv = (None, None) if kv_cache is None else kv_cache
        t, start = x.shape[1], 0 if attn_kv is None else attn_kv.length
        self_mask = combine_masks(causal_mask(t, start + t), mask)  # (T, T_so_far) or more
        if self.norm_first:
            x = x + self.drop1(self.attn(self.norm1(x), mask=self_mask, kv_cache=attn_kv))  # (1)
            if self.cross:
                x = x + self.cross_drop(self.cross_attn(self.cross_norm(x), memory,
                                                        mask=memory_mask, kv_cache=cross_kv))  # (2)
            x = x + self.drop2(self.ffn(self.norm2(x)))  # (3)
        else:
            x = self.norm1(x + self.drop1(self.attn(x, mask=self_mask, kv_cache=attn_kv)))  # (1)
            if self.cross:
                x = self.cross_norm(x + self.cross_drop(self.cross_attn(
                    x, memory, mask=memory_mask, kv_cache=cross_kv)))  # (2)
            x = self.norm2(x + self.drop2(self.ffn(x)))  # (3)
        return self.expect_grad_like(x)

    def backward(self, dout: np.ndarray):
        """dout : (B, T, C) -> dx (B, T, C), or ``(dx, dmemory)`` when ``cross``."""
        self.check_grad("dout", dout)
        if self.norm_first:
            # (3) x3 = x2 + drop2(ffn(norm2(x2)))  =>  dx2 = dout + norm2'(ffn'(drop2'(dout)))
            dsub = self.norm2.backward(self.ffn.backward(self.drop2.backward(dout)))
            dx = dout + dsub
            # (2) x2 = x1 + cross_drop(cross_attn(cross_norm(x1), memory))
            if self.cross:
                dsub, dmemory = self.cross_attn.backward(self.cross_drop.backward(dx))
                dx = dx + self.cross_norm.backward(dsub)
            # (1) x1 = x + drop1(attn(norm1(x)))  =>  dx = dx1 + norm1'(attn'(drop1'(dx1)))
            dsub = self.norm1.backward(self.attn.backward(self.drop1.backward(dx)))
            dx = dx + dsub
        else:
            # (3) x3 = norm2(s3),  s3 = x2 + drop2(ffn(x2))  =>  dx2 = ds + ffn'(drop2'(ds))
            ds = self.norm2.backward(dout)
            dx = ds + self.ffn.backward(self.drop2.backward(ds))
            # (2) x2 = cross_norm(s2),  s2 = x1 + cross_drop(cross_attn(x1, memory))
            if self.cross:
                ds = self.cross_norm.backward(dx)
                dsub, dmemory = self.cross_attn.backward(self.cross_drop.backward(ds))
                dx = ds + dsub
            # (1) x1 = norm1(s1),  s1 = x + drop1(attn(x))  =>  dx = ds + attn'(drop1'(ds))
            ds = self.norm1.backward(dx)
            dx = ds + self.attn.backward(self.drop1.backward(ds))
        return (dx, dmemory) if self.cross else dx

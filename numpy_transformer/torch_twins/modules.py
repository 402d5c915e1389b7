"""The layers', blocks' and models' twins: ``torch.nn.Module`` trees with our child names.

Each class takes the same arguments as ours (the models a ``TransformerConfig``, which they
keep as ``config``) and is made of ``nn.Linear``, ``nn.Embedding``, ``nn.LayerNorm`` and
``nn.RMSNorm``, so its ``state_dict`` is an ordinary PyTorch one. Dropout is ``nn.Dropout``:
the same rate, PyTorch's own random masks.
"""

from __future__ import annotations

import numpy as np

from ..config import GATED_ACTIVATIONS, LSTMConfig, TransformerConfig
from ._torch import F, nn, torch
from .ops import activation as activation_twin
from .ops import (
    alibi_bias,
    causal_mask,
    key_padding_mask,
    rope,
    rope_tables,
    sdpa,
    sinusoidal_table,
)


# ============================================================================ layers
class FeedForward(nn.Module):
    """C -> F -> C with children ``up``, ``down`` (and ``gate`` for a gated activation); the
    activation is the twin of :mod:`.ops` under its name."""

    def __init__(self, width: int, hidden: int, activation: str = "gelu",
                 bias: bool = True) -> None:
        super().__init__()
        self.activation, self.act = activation, activation_twin(activation)
        if activation in GATED_ACTIVATIONS:
            self.gate = nn.Linear(width, hidden, bias=bias)
        self.up = nn.Linear(width, hidden, bias=bias)
        self.down = nn.Linear(hidden, width, bias=bias)

    def forward(self, x):
        if self.activation in GATED_ACTIVATIONS:
            return self.down(self.act(self.gate(x), self.up(x)))
        return self.down(self.act(self.up(x)))


class MultiHeadAttention(nn.Module):
    """Separate q/k/v/out projections; optional RoPE or ALiBi; our mask convention.

    With ``kv_heads`` < ``heads`` (grouped-query attention) k_proj and v_proj are
    (kv_heads D, C), and each kv head is repeated for its group with
    ``torch.repeat_interleave``: autograd, not our hand-written sum, then adds the group's
    gradients. ``dropout`` acts on the attention weights (``nn.Dropout``, in training only).
    """

    def __init__(self, width: int, heads: int, *, kv_heads: int | None = None,
                 rope: bool = False, alibi: bool = False, max_len: int | None = None,
                 bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.heads, self.rope, self.alibi = heads, rope, alibi
        self.kv_heads = heads if kv_heads is None else kv_heads
        kv_width = self.kv_heads * (width // heads)
        self.q_proj = nn.Linear(width, width, bias=bias)
        self.k_proj = nn.Linear(width, kv_width, bias=bias)
        self.v_proj = nn.Linear(width, kv_width, bias=bias)
        self.out_proj = nn.Linear(width, width, bias=bias)
        if rope:
            cos, sin = rope_tables(max_len, width // heads)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x, context=None, mask=None):
        src = x if context is None else context
        (b, t_q, c), t_k, h, h_kv = x.shape, src.shape[1], self.heads, self.kv_heads
        q = self.q_proj(x).view(b, t_q, h, c // h).transpose(1, 2)  # (B, H, T_q, D)
        k = self.k_proj(src).view(b, t_k, h_kv, c // h).transpose(1, 2)  # (B, H_kv, T_k, D)
        v = self.v_proj(src).view(b, t_k, h_kv, c // h).transpose(1, 2)
        if self.rope:
            cos, sin = self.rope_cos[:t_q].to(x.dtype), self.rope_sin[:t_q].to(x.dtype)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
        # query head i reads kv head i // (H / H_kv): (B, H, T_k, D)
        k, v = k.repeat_interleave(h // h_kv, dim=1), v.repeat_interleave(h // h_kv, dim=1)
        bias = alibi_bias(h, t_q, t_k, x.dtype) if self.alibi else None
        drop = self.drop if self.drop.p else None  # none at all: no call, no copy
        o = sdpa(q, k, v, mask, bias, dropout=drop)  # (B, H, T_q, D)
        return self.out_proj(o.transpose(1, 2).reshape(b, t_q, c))


class SinusoidalPositions(nn.Module):
    """Adds the fixed sine/cosine table (a non-persistent buffer: a formula, not saved)."""

    def __init__(self, max_len: int, width: int) -> None:
        super().__init__()
        self.register_buffer("table", sinusoidal_table(max_len, width), persistent=False)

    def forward(self, x):
        return x + self.table[: x.shape[1]].to(x.dtype)


class LearnedPositions(nn.Module):
    """Adds a learned (max_len, C) table, our ``LearnedPositions``."""

    def __init__(self, max_len: int, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(0.02 * torch.randn(max_len, width))

    def forward(self, x):
        return x + self.weight[: x.shape[1]]


NORM_TWINS = {"layernorm": lambda width: nn.LayerNorm(width, eps=1e-5),  # as ours
              "rmsnorm": lambda width: nn.RMSNorm(width, eps=None)}


def make_norm(norm: str, width: int) -> nn.Module:
    """``nn.LayerNorm`` (eps 1e-5) or ``nn.RMSNorm`` (eps None), as ours.

    Raises
    ------
    ValueError
        If ``norm`` (one of ``config.NORMS``) has no twin here.
    """
    if norm not in NORM_TWINS:
        raise ValueError(f"norm {norm!r} has no PyTorch twin in {__name__} (the twins: "
                         f"{', '.join(NORM_TWINS)})")
    return NORM_TWINS[norm](width)


# ============================================================================ blocks
class EncoderBlock(nn.Module):
    """Pre-LN or post-LN: self-attention, then the feed-forward network, each with a residual."""

    def __init__(self, width, heads, ffn_width, *, kv_heads=None, norm="layernorm",
                 activation="gelu", norm_first=True, dropout=0.0, attn_dropout=0.0, rope=False,
                 alibi=False, max_len=None, bias=True) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.norm1 = make_norm(norm, width)
        self.attn = MultiHeadAttention(width, heads, kv_heads=kv_heads, rope=rope, alibi=alibi,
                                       max_len=max_len, bias=bias, dropout=attn_dropout)
        self.drop1 = nn.Dropout(dropout)
        self.norm2 = make_norm(norm, width)
        self.ffn = FeedForward(width, ffn_width, activation, bias)
        self.drop2 = nn.Dropout(dropout)

    def forward(self, x, mask=None):
        if self.norm_first:
            x = x + self.drop1(self.attn(self.norm1(x), mask=mask))
            return x + self.drop2(self.ffn(self.norm2(x)))
        x = self.norm1(x + self.drop1(self.attn(x, mask=mask)))
        return self.norm2(x + self.drop2(self.ffn(x)))


class DecoderBlock(nn.Module):
    """Causal self-attention, optional cross-attention to a memory, the feed-forward network."""

    def __init__(self, width, heads, ffn_width, *, kv_heads=None, cross=False,
                 norm="layernorm", activation="gelu", norm_first=True, dropout=0.0,
                 attn_dropout=0.0, rope=False, alibi=False, max_len=None, bias=True) -> None:
        super().__init__()
        self.norm_first, self.cross = norm_first, cross
        self.norm1 = make_norm(norm, width)
        self.attn = MultiHeadAttention(width, heads, kv_heads=kv_heads, rope=rope, alibi=alibi,
                                       max_len=max_len, bias=bias, dropout=attn_dropout)
        self.drop1 = nn.Dropout(dropout)
        if cross:
            self.cross_norm = make_norm(norm, width)
            self.cross_attn = MultiHeadAttention(width, heads, kv_heads=kv_heads, bias=bias,
                                                 dropout=attn_dropout)
            self.cross_drop = nn.Dropout(dropout)
        self.norm2 = make_norm(norm, width)
        self.ffn = FeedForward(width, ffn_width, activation, bias)
        self.drop2 = nn.Dropout(dropout)

    def forward(self, x, memory=None, memory_mask=None, mask=None):
        self_mask = causal_mask(x.shape[1])
        if mask is not None:
            self_mask = self_mask & mask
        if self.norm_first:
            x = x + self.drop1(self.attn(self.norm1(x), mask=self_mask))
            if self.cross:
                x = x + self.cross_drop(self.cross_attn(self.cross_norm(x), memory,
                                                        mask=memory_mask))
            return x + self.drop2(self.ffn(self.norm2(x)))
        x = self.norm1(x + self.drop1(self.attn(x, mask=self_mask)))
        if self.cross:
            x = self.cross_norm(x + self.cross_drop(self.cross_attn(x, memory,
                                                                    mask=memory_mask)))
        return self.norm2(x + self.drop2(self.ffn(x)))


# ============================================================================ models
# The positional schemes of config.POSITIONS: a table added to the tokens, or one acting in
# the attention (a rotation of queries and keys, a bias of the scores)
POSITION_TABLES = {"sinusoidal": SinusoidalPositions, "learned": LearnedPositions}
ATTENTION_POSITIONS = ("rope", "alibi")


def _block_options(c: TransformerConfig) -> dict:
    return dict(kv_heads=c.kv_heads, norm=c.norm, activation=c.activation,
                norm_first=c.norm_first,
                dropout=c.dropout, attn_dropout=c.attn_dropout, rope=c.positions == "rope",
                alibi=c.positions == "alibi",
                max_len=c.max_len, bias=c.bias)


class Embeddings(nn.Module):
    """tokens -> tokens[ids] * (sqrt(C) if embed_scale) + positions, then dropout."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(c.vocab, c.width)
        self.scale = float(np.sqrt(c.width)) if c.embed_scale else 1.0
        if c.positions not in (*POSITION_TABLES, *ATTENTION_POSITIONS, "none"):
            raise ValueError(f"positions {c.positions!r} have no PyTorch twin in {__name__}")
        table = POSITION_TABLES.get(c.positions)
        self.positions = None if table is None else table(c.max_len, c.width)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, ids):
        x = self.tokens(ids) * self.scale
        if self.positions is not None:
            x = self.positions(x)
        return self.drop(x)


class Encoder(nn.Module):
    """Embeddings, encoder blocks, and a final norm when pre-LN."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.embed = Embeddings(c)
        self.blocks = nn.ModuleList([EncoderBlock(c.width, c.heads, c.ffn_width,
                                                  **_block_options(c)) for _ in range(c.layers)])
        self.final_norm = make_norm(c.norm, c.width) if c.norm_first else None

    def forward(self, ids, mask=None):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, mask)
        return x if self.final_norm is None else self.final_norm(x)


class Decoder(nn.Module):
    """Embeddings, decoder blocks (with cross-attention if ``cross``), final norm if pre-LN."""

    def __init__(self, c: TransformerConfig, cross: bool = False) -> None:
        super().__init__()
        self.embed = Embeddings(c)
        self.blocks = nn.ModuleList([DecoderBlock(c.width, c.heads, c.ffn_width, cross=cross,
                                                  **_block_options(c)) for _ in range(c.layers)])
        self.final_norm = make_norm(c.norm, c.width) if c.norm_first else None

    def forward(self, ids, memory=None, memory_mask=None):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, memory, memory_mask)
        return x if self.final_norm is None else self.final_norm(x)


class EncoderClassifier(nn.Module):
    """Twin of ``nn.EncoderClassifier``; ``config`` is the config it was built from."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.config = c
        self.encoder = Encoder(c)
        self.head = nn.Linear(c.width, c.num_classes, bias=c.bias)

    def forward(self, tokens, lengths=None):
        mask = None if lengths is None else key_padding_mask(lengths, tokens.shape[-1])
        return self.head(self.encoder(tokens, mask))


class DecoderLM(nn.Module):
    """With ``tie_embeddings`` the head is ``x @ table^T`` and owns no parameter (as ours)."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.config = c
        self.decoder = Decoder(c)
        self.head = None if c.tie_embeddings else nn.Linear(c.width, c.vocab, bias=c.bias)

    def forward(self, tokens):
        x = self.decoder(tokens)
        return F.linear(x, self.decoder.embed.tokens.weight) if self.head is None else self.head(x)


class EncoderDecoder(nn.Module):
    """Twin of ``nn.EncoderDecoder``; the head is tied as in :class:`DecoderLM`."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.config = c
        self.encoder = Encoder(c)
        self.decoder = Decoder(c, cross=True)
        self.head = None if c.tie_embeddings else nn.Linear(c.width, c.vocab, bias=c.bias)

    def forward(self, src, tgt, src_lengths=None):
        src_mask = None if src_lengths is None else key_padding_mask(src_lengths, src.shape[-1])
        x = self.decoder(tgt, self.encoder(src, src_mask), src_mask)
        return F.linear(x, self.decoder.embed.tokens.weight) if self.head is None else self.head(x)


class LSTMLM(nn.Module):
    """Embedding, ``nn.LSTM`` (batch first), linear head: the twin of our ``LSTMLM``."""

    def __init__(self, c: LSTMConfig) -> None:
        super().__init__()
        self.config = c
        self.embed = nn.Embedding(c.vocab, c.embed_width)
        self.lstm = nn.LSTM(c.embed_width, c.hidden, c.layers, batch_first=True)
        self.head = nn.Linear(c.hidden, c.vocab)

    def forward(self, tokens, state=None):
        out, _ = self.lstm(self.embed(tokens), state)
        return self.head(out)

"""PyTorch twins of every op, layer, block and model of ``numpy_transformer``.

A twin computes the same function as our code with PyTorch's own building blocks, so that
torch autograd can check every hand-written backward, and so that a model trained here can be
trained further in PyTorch (``numpy_transformer.interop`` moves the weights).

* Ops: functions of torch tensors with the signatures of our ``*_forward`` functions
  (``linear(x, w, b)`` with ``w`` in our (C_in, C_out) layout, ``sdpa(q, k, v, mask, bias)``
  with our mask convention, True = may attend, and our zero output for a fully masked row).
* Modules: ``torch.nn.Module`` trees whose children carry exactly our child names
  (``decoder.blocks.0.attn``, ``...ffn.up``, ``head``), made of ``nn.Linear``, ``nn.Embedding``,
  ``nn.LayerNorm`` and ``nn.RMSNorm``. Our dotted name maps to the twin's by
  ``interop.torch_names`` (``attn.wq`` -> ``attn.q_proj.weight``, transposed).
* :func:`twin_of` builds the twin of any of our modules and copies our weights into it.

Positions, RoPE angles and ALiBi slopes are recomputed here from their formulas, not imported,
so a wrong table on our side would show up as a mismatch.

This file imports torch: import it only after ``pytest.importorskip("torch")``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from numpy_transformer import interop
from numpy_transformer import nn as ours
from numpy_transformer.config import TransformerConfig

TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}


def to_torch(a, requires_grad: bool = False) -> torch.Tensor:
    """A torch copy of a NumPy array (float arrays may require a gradient)."""
    t = torch.from_numpy(np.array(a, copy=True))
    return t.requires_grad_(True) if requires_grad else t


# ============================================================================ ops
def linear(x, w, b=None):
    """``x @ w + b`` with ``w`` of shape (C_in, C_out), our layout (``F.linear`` takes w.T)."""
    return F.linear(x, w.T, b)


def embedding(ids, table):
    return F.embedding(ids, table)


def relu(x):
    return F.relu(x)


def gelu(x):
    return F.gelu(x, approximate="none")


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def silu(x):
    return F.silu(x)


def swiglu(gate, up):
    return F.silu(gate) * up


def softmax(x):
    return torch.softmax(x, dim=-1)


def log_softmax(x):
    return torch.log_softmax(x, dim=-1)


def cross_entropy(logits, targets, ignore_index: int = -100, mask=None):
    """Mean NLL over the counted targets; a ``mask`` (True = counted) becomes ignore_index."""
    if mask is not None:
        targets = torch.where(mask, targets, ignore_index)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=ignore_index)


def layer_norm(x, w, b, eps: float = 1e-5):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def rms_norm(x, w, eps: float | None = None):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def sdpa(q, k, v, mask=None, bias=None, scale=None):
    """Attention with our conventions: mask True = may attend; a fully masked row gives 0.

    ``F.scaled_dot_product_attention`` returns NaN for such a row; here the row's scores are
    replaced by zeros before the softmax and its weights multiplied by 0 afterwards, so
    neither the output nor any gradient sees a NaN.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale  # (B, H, T_q, T_k)
    if bias is not None:
        s = s + bias
    if mask is None:
        return torch.softmax(s, dim=-1) @ v
    visible = mask.any(dim=-1, keepdim=True)  # (..., T_q, 1) does the row see any key?
    s = s.masked_fill(~mask, -math.inf).masked_fill(~visible, 0.0)
    return (torch.softmax(s, dim=-1) * visible) @ v


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
    return torch.ones(t, t, dtype=torch.bool).tril()


def key_padding_mask(lengths, t_k: int) -> torch.Tensor:
    """(B, 1, 1, T_k), True where key j < lengths[b]."""
    return (torch.arange(t_k)[None, :] < lengths[:, None])[:, None, None, :]


# ============================================================================ layers
class FeedForward(nn.Module):
    """C -> F -> C with children ``up``, ``down`` (and ``gate`` for SwiGLU)."""

    def __init__(self, width: int, hidden: int, activation: str = "gelu") -> None:
        super().__init__()
        self.activation = activation
        if activation == "swiglu":
            self.gate = nn.Linear(width, hidden)
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x):
        if self.activation == "swiglu":
            return self.down(swiglu(self.gate(x), self.up(x)))
        act = {"relu": relu, "gelu": gelu, "gelu_tanh": gelu_tanh}[self.activation]
        return self.down(act(self.up(x)))


class MultiHeadAttention(nn.Module):
    """Separate q/k/v/out projections; optional RoPE or ALiBi; our mask convention."""

    def __init__(self, width: int, heads: int, *, rope: bool = False, alibi: bool = False,
                 max_len: int | None = None) -> None:
        super().__init__()
        self.heads, self.rope, self.alibi = heads, rope, alibi
        self.q_proj = nn.Linear(width, width)
        self.k_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.out_proj = nn.Linear(width, width)
        if rope:
            cos, sin = rope_tables(max_len, width // heads)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x, context=None, mask=None):
        src = x if context is None else context
        (b, t_q, c), t_k, h = x.shape, src.shape[1], self.heads
        q = self.q_proj(x).view(b, t_q, h, c // h).transpose(1, 2)  # (B, H, T_q, D)
        k = self.k_proj(src).view(b, t_k, h, c // h).transpose(1, 2)
        v = self.v_proj(src).view(b, t_k, h, c // h).transpose(1, 2)
        if self.rope:
            cos, sin = self.rope_cos[:t_q].to(x.dtype), self.rope_sin[:t_q].to(x.dtype)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
        bias = alibi_bias(h, t_q, t_k, x.dtype) if self.alibi else None
        o = sdpa(q, k, v, mask, bias)  # (B, H, T_q, D)
        return self.out_proj(o.transpose(1, 2).reshape(b, t_q, c))


class SinusoidalPositions(nn.Module):
    def __init__(self, max_len: int, width: int) -> None:
        super().__init__()
        self.register_buffer("table", sinusoidal_table(max_len, width), persistent=False)

    def forward(self, x):
        return x + self.table[: x.shape[1]].to(x.dtype)


class LearnedPositions(nn.Module):
    def __init__(self, max_len: int, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(0.02 * torch.randn(max_len, width))

    def forward(self, x):
        return x + self.weight[: x.shape[1]]


def make_norm(norm: str, width: int) -> nn.Module:
    return nn.LayerNorm(width, eps=1e-5) if norm == "layernorm" else nn.RMSNorm(width, eps=None)


# ============================================================================ blocks
class EncoderBlock(nn.Module):
    def __init__(self, width, heads, ffn_width, *, norm="layernorm", activation="gelu",
                 norm_first=True, dropout=0.0, rope=False, alibi=False, max_len=None) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.norm1 = make_norm(norm, width)
        self.attn = MultiHeadAttention(width, heads, rope=rope, alibi=alibi, max_len=max_len)
        self.drop1 = nn.Dropout(dropout)
        self.norm2 = make_norm(norm, width)
        self.ffn = FeedForward(width, ffn_width, activation)
        self.drop2 = nn.Dropout(dropout)

    def forward(self, x, mask=None):
        if self.norm_first:
            x = x + self.drop1(self.attn(self.norm1(x), mask=mask))
            return x + self.drop2(self.ffn(self.norm2(x)))
        x = self.norm1(x + self.drop1(self.attn(x, mask=mask)))
        return self.norm2(x + self.drop2(self.ffn(x)))


class DecoderBlock(nn.Module):
    def __init__(self, width, heads, ffn_width, *, cross=False, norm="layernorm",
                 activation="gelu", norm_first=True, dropout=0.0, rope=False, alibi=False,
                 max_len=None) -> None:
        super().__init__()
        self.norm_first, self.cross = norm_first, cross
        self.norm1 = make_norm(norm, width)
        self.attn = MultiHeadAttention(width, heads, rope=rope, alibi=alibi, max_len=max_len)
        self.drop1 = nn.Dropout(dropout)
        if cross:
            self.cross_norm = make_norm(norm, width)
            self.cross_attn = MultiHeadAttention(width, heads)
            self.cross_drop = nn.Dropout(dropout)
        self.norm2 = make_norm(norm, width)
        self.ffn = FeedForward(width, ffn_width, activation)
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
def _block_options(c: TransformerConfig) -> dict:
    return dict(norm=c.norm, activation=c.activation, norm_first=c.norm_first,
                dropout=c.dropout, rope=c.positions == "rope", alibi=c.positions == "alibi",
                max_len=c.max_len)


class Embeddings(nn.Module):
    """tokens -> tokens[ids] * (sqrt(C) if embed_scale) + positions, then dropout."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(c.vocab, c.width)
        self.scale = float(np.sqrt(c.width)) if c.embed_scale else 1.0
        if c.positions == "sinusoidal":
            self.positions = SinusoidalPositions(c.max_len, c.width)
        elif c.positions == "learned":
            self.positions = LearnedPositions(c.max_len, c.width)
        else:
            self.positions = None
        self.drop = nn.Dropout(c.dropout)

    def forward(self, ids):
        x = self.tokens(ids) * self.scale
        if self.positions is not None:
            x = self.positions(x)
        return self.drop(x)


class Encoder(nn.Module):
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
    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.encoder = Encoder(c)
        self.head = nn.Linear(c.width, c.num_classes)

    def forward(self, tokens, lengths=None):
        mask = None if lengths is None else key_padding_mask(lengths, tokens.shape[-1])
        return self.head(self.encoder(tokens, mask))


class DecoderLM(nn.Module):
    """With ``tie_embeddings`` the head is ``x @ table^T`` and owns no parameter (as ours)."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.decoder = Decoder(c)
        self.head = None if c.tie_embeddings else nn.Linear(c.width, c.vocab)

    def forward(self, tokens):
        x = self.decoder(tokens)
        return F.linear(x, self.decoder.embed.tokens.weight) if self.head is None else self.head(x)


class EncoderDecoder(nn.Module):
    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.encoder = Encoder(c)
        self.decoder = Decoder(c, cross=True)
        self.head = None if c.tie_embeddings else nn.Linear(c.width, c.vocab)

    def forward(self, src, tgt, src_lengths=None):
        src_mask = None if src_lengths is None else key_padding_mask(src_lengths, src.shape[-1])
        x = self.decoder(tgt, self.encoder(src, src_mask), src_mask)
        return F.linear(x, self.decoder.embed.tokens.weight) if self.head is None else self.head(x)


class LSTMLM(nn.Module):
    """Embedding, ``nn.LSTM`` (batch first), linear head: the twin of our ``LSTMLM``."""

    def __init__(self, c) -> None:
        super().__init__()
        self.embed = nn.Embedding(c.vocab, c.embed_width)
        self.lstm = nn.LSTM(c.embed_width, c.hidden, c.layers, batch_first=True)
        self.head = nn.Linear(c.hidden, c.vocab)

    def forward(self, tokens, state=None):
        out, _ = self.lstm(self.embed(tokens), state)
        return self.head(out)


# ============================================================================ twin_of
def _norm_name(norm) -> str:
    return "layernorm" if isinstance(norm, ours.LayerNorm) else "rmsnorm"


def _block_kwargs(block) -> dict:
    attn = block.attn
    return dict(norm=_norm_name(block.norm1), activation=block.ffn.activation,
                norm_first=block.norm_first, dropout=block.drop1.p, rope=attn.rope,
                alibi=attn.alibi, max_len=attn.max_len)


def build_twin(module) -> nn.Module:
    """An untrained twin with the architecture of ``module`` (weights not copied)."""
    if isinstance(module, (ours.EncoderClassifier, ours.DecoderLM, ours.EncoderDecoder,
                           ours.LSTMLM)):
        return globals()[type(module).__name__](module.config)
    if isinstance(module, ours.Linear):
        c_in, c_out = module.params["w"].shape
        return nn.Linear(c_in, c_out, bias="b" in module.params)
    if isinstance(module, ours.LSTM):
        c_in = module.params["w_ih_l0"].shape[0]
        return nn.LSTM(c_in, module.hidden, module.layers, batch_first=True)
    if isinstance(module, ours.Embedding):
        return nn.Embedding(*module.params["table"].shape)
    if isinstance(module, ours.LayerNorm):
        return nn.LayerNorm(module.params["w"].shape[0], eps=module.eps)
    if isinstance(module, ours.RMSNorm):
        return nn.RMSNorm(module.params["w"].shape[0], eps=module.eps)
    if isinstance(module, ours.FeedForward):
        width, hidden = module.up.params["w"].shape
        return FeedForward(width, hidden, module.activation)
    if isinstance(module, ours.MultiHeadAttention):
        return MultiHeadAttention(module.width, module.heads, rope=module.rope,
                                  alibi=module.alibi, max_len=module.max_len)
    if isinstance(module, ours.SinusoidalPositions):
        return SinusoidalPositions(module.max_len, module.width)
    if isinstance(module, ours.LearnedPositions):
        return LearnedPositions(module.max_len, module.width)
    if isinstance(module, (ours.EncoderBlock, ours.DecoderBlock)):
        attn = module.attn
        width, ffn_width = module.ffn.up.params["w"].shape
        if isinstance(module, ours.EncoderBlock):
            return EncoderBlock(width, attn.heads, ffn_width, **_block_kwargs(module))
        return DecoderBlock(width, attn.heads, ffn_width, cross=module.cross,
                            **_block_kwargs(module))
    raise ValueError(f"no twin for {type(module).__name__}")


def dtype_of(module) -> np.dtype:
    """The dtype of the module's first parameter (or buffer; float64 if it has neither)."""
    for _, p, _ in module.named_parameters():
        return p.dtype
    for b in module.buffers.values():
        return b.dtype
    return np.dtype(np.float64)


def twin_of(module) -> nn.Module:
    """The twin of ``module`` in its dtype, holding a copy of its weights."""
    twin = build_twin(module).to(TORCH_DTYPES[dtype_of(module)])
    state = {k: torch.from_numpy(a) for k, a in interop.to_torch_state_dict(module).items()}
    twin.load_state_dict(state, strict=True)
    return twin


def gradient_pairs(module, twin: nn.Module):
    """Yield ``(our name, our grad, twin grad in our layout)`` for every parameter."""
    grads = {name: g for name, _, g in module.named_parameters()}
    twin_params = dict(twin.named_parameters())
    for name, (torch_name, transpose) in interop.torch_names(module).items():
        tg = twin_params[torch_name].grad
        tg = np.zeros(grads[name].shape[::-1] if transpose else grads[name].shape) \
            if tg is None else tg.detach().numpy()
        yield name, grads[name], tg.T if transpose else tg

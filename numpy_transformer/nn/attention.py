"""Multi-head attention, self or cross, with optional RoPE or ALiBi.

The projections and the scaled dot-product core are operations of the module's backend
(``numpy_transformer.backend``): ``linear_heads_forward``, ``sdpa_forward``,
``sdpa_backward``, ``linear_forward``, ``linear_backward``. The same forward serves training
and cached decoding: given a ``KVCache`` (``nn/decoding.py``), the keys and values of the new
positions join those of the earlier ones there, and the queries attend to all of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .._checks import check_float, check_last_dim, check_positive
from ..backend import get_backend
from ..config import DEFAULT_BACKEND
from ..functional.linear import LinearCache
from ..functional.positional import alibi_bias, rope_backward, rope_forward, rope_tables
from .module import Module

if TYPE_CHECKING:
    from ..backend import Backend
    from .decoding import KVCache


def split_heads(x: np.ndarray, heads: int) -> np.ndarray:
    """(B, T, C) -> (B, H, T, D) with D = C / H: head h owns features h*D .. (h+1)*D - 1."""
    b, t, c = x.shape
    return x.reshape(b, t, heads, c // heads).transpose(0, 2, 1, 3)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(B, H, T, D) -> (B, T, H*D): the inverse of :func:`split_heads` (and its backward)."""
    b, h, t, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, t, h * d)


class AttentionCache(NamedTuple):
    projections: tuple  # LinearCache of each stacked projection (1), see _groups
    sdpa: object  # the backend's own cache
    out: LinearCache  # output projection of the merged heads (B, T_q, C)
    cross: bool  # keys and values came from a context
    t_q: int
    t_k: int


def _groups(cross: bool) -> tuple[str, ...]:
    """The projections of (1) done as one product each; sources: x, or x and the context."""
    return ("q", "kv") if cross else ("qkv",)


class MultiHeadAttention(Module):
    """Multi-head scaled dot-product attention with output projection.

    Parameters
    ----------
    width : int
        C, the model width; split into ``heads`` heads of width D = C / H.
    heads : int
        H; must divide ``width``.
    rope : bool, default False
        Rotate queries and keys by their positions (self-attention only; D must be even).
    alibi : bool, default False
        Add the ALiBi distance bias to the scores (self-attention only).
    max_len : int, optional
        Longest sequence; required with ``rope`` (the angle tables are precomputed).
    bias : bool, default True
        Whether the four projections add a bias (LLaMA's have none).
    backend : str or Backend, default ``config.DEFAULT_BACKEND``
        Where the projections and the attention core come from (numba: the fused kernel of
        ``kernels/attention.py``).
    keep_weights : bool, default False
        If True, every forward stores the attention weights (B, H, T_q, T_k) in
        ``self.weights`` for plotting (computed again, outside the gradient path).
    dtype : dtype, default float64
    rng : np.random.Generator, optional

    Attributes
    ----------
    params : wq, bq, wk, bk, wv, bv, wo, bo
        Each w is (C, C) in the ``x @ w`` layout, each b is (C,): 4C^2 + 4C numbers whatever
        the head count (4C^2 and no b without ``bias``). Initialised like four
        ``nn.Linear(C, C)``: U(-1/sqrt(C), 1/sqrt(C)).

    Notes
    -----
    With ``src = x`` (self-attention) or ``src = context`` (cross-attention):

    (1) q = x wq + bq,  k = src wk + bk,  v = src wv + bv          (B, T, C)
        (without ``bias``, here and in (6), no b is added)
        computed as one product per source with the weights side by side: x [wq | wk | wv]
        (C, 3C) in self-attention, x wq and context [wk | wv] in cross-attention
    (2) split into heads                                           (B, H, T, D)
        (1) and (2) are one call, ``linear_heads_forward``: the product copied head by head
        in NumPy, written head by head in the numba kernel
    (3) q, k = rope(q), rope(k)                                    (if rope)
        at the positions start .. start + T - 1, start = 0 unless decoding with a cache
    (4) o = softmax(q k^T / sqrt(D) + alibi, masked) v             (B, H, T_q, D)
        with a ``kv_cache`` (decoding), k and v are those of every position so far
    (5) merge heads                                                (B, T_q, C)
    (6) out = o wo + bo                                            (B, T_q, C)

    References
    ----------
    Vaswani et al., "Attention Is All You Need", 2017.
    Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", 2021.
    Press, Smith & Lewis, "Train Short, Test Long: Attention with Linear Biases", 2022.
    """

    def __init__(self, width: int, heads: int, *, rope: bool = False, alibi: bool = False,
                 max_len: int | None = None, bias: bool = True,
                 backend: str | Backend = DEFAULT_BACKEND, keep_weights: bool = False,
                 dtype=np.float64,
                 rng: np.random.Generator | None = None) -> None:
        super().__init__()
        self.ops = get_backend(backend)
        check_positive("width", width, integer=True)
        check_positive("heads", heads, integer=True)
        if width % heads:
            raise ValueError(f"heads={heads} does not divide width={width}")
        self.width, self.heads, self.head_width = width, heads, width // heads
        self.rope, self.alibi, self.max_len, self.bias = rope, alibi, max_len, bias
        self.keep_weights = keep_weights
        if rope:
            if max_len is None:
                raise ValueError("rope needs max_len (the length of its angle tables)")
            check_positive("max_len", max_len, integer=True)
            cos, sin = rope_tables(max_len, self.head_width, dtype=dtype)  # (max_len, D/2)
            self.buffers["rope_cos"], self.buffers["rope_sin"] = cos, sin
        rng = np.random.default_rng() if rng is None else rng
        bound = 1.0 / np.sqrt(width)
        for name in ("q", "k", "v", "o"):
            self.add_param("w" + name, rng.uniform(-bound, bound, (width, width)).astype(dtype))
            if bias:
                self.add_param("b" + name, rng.uniform(-bound, bound, width).astype(dtype))
        self.cache = None
        self.weights = None

    def _check_inputs(self, x: np.ndarray, context: np.ndarray | None) -> None:
        check_float("x", x, ndim=3)
        check_last_dim("x", x, self.width)
        if context is None:
            if self.max_len is not None and x.shape[1] > self.max_len:
                raise ValueError(f"sequence length {x.shape[1]} exceeds max_len {self.max_len}")
            return
        check_float("context", context, ndim=3)
        check_last_dim("context", context, self.width)
        if context.shape[0] != x.shape[0]:
            raise ValueError(f"context batch {context.shape[0]} differs from x batch {x.shape[0]}")
        if self.rope or self.alibi:
            raise ValueError("rope and alibi encode positions within one sequence; they are "
                             "undefined for cross-attention (pass context=None)")

    def _rope_rows(self, start: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        """The RoPE tables' rows of the positions start .. start + length - 1, (length, D/2)."""
        return (self.buffers["rope_cos"][start:start + length],
                self.buffers["rope_sin"][start:start + length])

    def forward(self, x: np.ndarray, context: np.ndarray | None = None,
                mask: np.ndarray | None = None, kv_cache: KVCache | None = None) -> np.ndarray:
        """Self-attention (``context=None``) or cross-attention to ``context``.

        Parameters
        ----------
        x : ndarray of shape (B, T_q, C)
            Source of the queries (and of keys and values in self-attention).
        context : ndarray of shape (B, T_k, C), optional
            Source of keys and values for cross-attention (an encoder's output).
        mask : ndarray of bool, broadcastable to (B, H, T_q, T_k), optional
            ``True`` = may attend. Build it with ``functional.masks``. A query that may
            attend nothing gets a zero output and zero gradient.
        kv_cache : KVCache, optional
            Decoding (inference only, see ``nn/decoding.py``). Self-attention: x holds the
            positions after the cached ones; their keys and values are appended and the
            queries attend to every cached position (T_k = all so far; ``mask`` must fit
            that). Cross-attention: the context's keys and values are computed on the first
            call and read from the cache after. No backward cache is kept.

        Returns
        -------
        out : ndarray of shape (B, T_q, C)
        """
        self._check_inputs(x, context)
        p = self.params
        cross = context is not None
        kept = cross and kv_cache is not None and kv_cache.length > 0  # the context's k, v
        sources = (x,) if context is None else (x, context)
        heads, caches = {}, []
        for names, source in zip(("q",) if kept else _groups(cross), sources, strict=False):
            w = np.concatenate([p["w" + n] for n in names], axis=1)  # (C, len(names) C)
            b = np.concatenate([p["b" + n] for n in names]) if self.bias else None
            # (1) and (2): y[i] holds the heads of names[i], (B, H, T, D)
            y, y_cache = self.ops.linear_heads_forward(source, w, b, len(names), self.heads)
            caches.append(y_cache)
            heads.update(zip(names, y, strict=True))
        q, k, v = heads["q"], heads.get("k"), heads.get("v")
        if self.rope:  # (3) self-attention: position p of q and of k is the same p
            cos, sin = self._rope_rows(0 if kv_cache is None else kv_cache.length, q.shape[2])
            q, k = rope_forward(q, cos, sin), rope_forward(k, cos, sin)
        if kv_cache is not None:  # every position so far: (B, H, T_k, D)
            k, v = kv_cache.kept() if kept else kv_cache.append(k, v)
        t_q, t_k = q.shape[2], k.shape[2]
        bias = alibi_bias(self.heads, t_q, t_k, dtype=x.dtype) if self.alibi else None
        o, sdpa_cache = self.ops.sdpa_forward(q, k, v, mask=mask, bias=bias)  # (4)
        if self.keep_weights:
            self.weights = self.ops.attention_weights(q, k, mask=mask, bias=bias)
        out, out_cache = self.ops.linear_forward(merge_heads(o), p["wo"],
                                                 p.get("bo"))  # (5), (6)
        self.cache = None if kv_cache is not None else AttentionCache(
            tuple(caches), sdpa_cache, out_cache, cross, t_q, t_k)
        return out

    def backward(self, dout: np.ndarray):
        """Gradients of the last forward; adds into every ``grads`` entry.

        Returns
        -------
        dx : ndarray of shape (B, T_q, C)
            Self-attention: the sum of the three paths through q, k and v.
        (dx, dcontext) : tuple, for cross-attention
            ``dcontext`` (B, T_k, C) sums the paths through k and v.
        """
        c = self.cache
        if c is None:
            raise ValueError("MultiHeadAttention.backward needs a forward first (a forward "
                             "with a kv_cache keeps nothing for a backward)")
        # (6) out = o wo + bo
        do, dwo, dbo = self.ops.linear_backward(dout, c.out)
        self.grads["wo"] += dwo
        if self.bias:
            self.grads["bo"] += dbo
        # (5) merge heads  =>  split the gradient the same way
        do = split_heads(do, self.heads)  # (B, H, T_q, D)
        # (2) split heads  =>  merge the gradients: dq, dk, dv go side by side into one buffer
        # per stacked product of (1), (B, T, n, H, D); slots[name] is its (B, H, T, D) view
        b, d = do.shape[0], self.head_width
        dys, slots = [], {}
        for names, t in zip(_groups(c.cross), (c.t_q, c.t_k), strict=False):
            dy = np.empty((b, t, len(names), self.heads, d), dtype=do.dtype)
            dys.append(dy)
            slots.update((n, dy[:, :, i].transpose(0, 2, 1, 3)) for i, n in enumerate(names))
        slots = (slots["q"], slots["k"], slots["v"])
        if not self.rope:  # (4) attention core, written straight into the slots
            self.ops.sdpa_backward(do, c.sdpa, out=slots)
        else:  # (4) attention core, then (3) rotation  =>  inverse rotation
            dq, dk, dv = self.ops.sdpa_backward(do, c.sdpa)
            cos, sin = self._rope_rows(0, c.t_q)
            for slot, grad in zip(slots, (rope_backward(dq, cos, sin),
                                          rope_backward(dk, cos, sin), dv), strict=True):
                slot[...] = grad
        dsources = []
        for names, dy, y_cache in zip(_groups(c.cross), dys, c.projections, strict=True):
            # (1) y = source [w_1 | .. | w_n] + [b_1 | .. | b_n]
            dsource, dw, db = self.ops.linear_backward(dy.reshape(b, dy.shape[1], -1), y_cache)
            for i, n in enumerate(names):
                self.grads["w" + n] += dw[:, i * self.width:(i + 1) * self.width]
                if self.bias:
                    self.grads["b" + n] += db[i * self.width:(i + 1) * self.width]
            dsources.append(dsource)
        # self-attention: x fed q, k and v, and the stacked product already summed the paths
        return tuple(dsources) if c.cross else dsources[0]

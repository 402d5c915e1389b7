"""Multi-head attention, self or cross, with optional RoPE or ALiBi.

The projections and the scaled dot-product core are operations of the module's backend
(``numpy_transformer.backend``): ``linear_heads_forward``, ``sdpa_forward``, ``linear_forward``
and their backwards. The self-attention, the cross-attention and the cached (decoding) paths
are separate methods; with a ``KVCache`` (``nn/decoding.py``) the keys and values of the new
positions join those of the earlier ones there, and the queries attend to all of them.
"""

from __future__ import annotations

from itertools import groupby
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .._checks import check_float, check_kv_heads, check_last_dim, check_number, check_positive
from ..backend import get_backend
from ..config import DEFAULT_BACKEND
from ..functional.activations import dropout_mask
from ..functional.linear import merge_heads, split_heads
from ..functional.positional import alibi_bias, rope_backward, rope_forward, rope_tables
from .layers import Dropout
from .module import Module, drawn

if TYPE_CHECKING:
    from ..backend import Backend
    from .decoding import KVCache

class AttentionCache(NamedTuple):
    projections: tuple  # the backend's caches of (1)-(2): per source, (x,) or (x, context), a
    #   tuple of one cache per head count (see MultiHeadAttention._project)
    sdpa: object  # the backend's cache of (4)
    out: object  # the backend's cache of (6), the output projection
    cross: bool  # keys and values came from a context
    t_q: int  # T_q, for the rows of the RoPE tables


class MultiHeadAttention(Module):
    """Multi-head scaled dot-product attention with output projection.

    Parameters
    ----------
    width : int
        C, the model width; split into ``heads`` heads of width D = C / H.
    heads : int
        H; must divide ``width``.
    kv_heads : int, optional
        H_kv, the heads of the keys and values; must divide ``heads``. None (the default)
        is H: multi-head attention. Fewer is grouped-query attention (LLaMA 2 70B, Mistral):
        query head h reads kv head h // (H / H_kv), and wk, wv shrink to (C, H_kv D).
    rope : bool, default False
        Rotate queries and keys by their positions (self-attention only; D must be even).
    alibi : bool, default False
        Add the ALiBi distance bias to the scores (self-attention only).
    max_len : int, optional
        Longest sequence; required with ``rope`` (the angle tables are precomputed).
    bias : bool, default True
        Whether the four projections add a bias (LLaMA's have none).
    dropout : float, default 0.0
        Probability of zeroing each attention weight in training, after the softmax (GPT-2's
        ``attn_pdrop``, LLaMA's ``attention_dropout``); the survivors are scaled by
        1 / (1 - p). Above 0 the module has a child ``drop``, a :class:`Dropout` whose
        generator draws the masks: ``rng.spawn(1)``, which leaves the draws of the weights
        as they are without it.
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
        ``nn.Linear(C, C)``: U(-1/sqrt(C), 1/sqrt(C)). With H_kv < H, wk and wv are
        (C, H_kv D) and bk, bv (H_kv D,), drawn from the same U(-1/sqrt(C), 1/sqrt(C)).

    Notes
    -----
    With ``src = x`` (self-attention) or ``src = context`` (cross-attention); without
    ``bias``, here and in (6), no b is added:

    (1) q = x wq + bq,  k = src wk + bk,  v = src wv + bv    (B, T, C), k, v (B, T, H_kv D)
    (2) q, k, v = split_heads(q), split_heads(k), split_heads(v)    (B, H, T, D), (B, H_kv, T, D)
    (3) q, k = rope(q), rope(k)                                         (if rope)
        at the positions start .. start + T - 1, start = 0 unless decoding with a cache
    (4) o = (softmax(q k^T / sqrt(D) + alibi, masked) * m) v            (B, H, T_q, D)
        with a ``kv_cache`` (decoding), k and v are those of every position so far; with
        H_kv < H, query head h reads kv head h // (H / H_kv) (the backend's ``sdpa_forward``);
        m is the dropout's mask of the weights in training (``dropout_mask``), 1 otherwise
        and in decoding
    (5) o = merge_heads(o)                                              (B, T_q, C)
    (6) out = o wo + bo                                                 (B, T_q, C)

    (1) and (2) are one backend operation per source and head count,
    ``linear_heads_forward``: the NumPy reference writes each projection out; the numba kernel
    makes one product of the source and its weights side by side and writes it head by head.
    Grouped-query self-attention makes two: q with H heads, k and v with H_kv.

    References
    ----------
    Vaswani et al., "Attention Is All You Need", 2017.
    Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", 2021.
    Press, Smith & Lewis, "Train Short, Test Long: Attention with Linear Biases", 2022.
    Ainslie et al., "GQA: Training Generalized Multi-Query Transformer Models from Multi-Head
    Checkpoints", 2023.
    """

    def __init__(self, width: int, heads: int, *, kv_heads: int | None = None,
                 rope: bool = False, alibi: bool = False, max_len: int | None = None,
                 bias: bool = True, dropout: float = 0.0,
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
        self.kv_heads = check_kv_heads(heads, kv_heads)
        self.rope, self.alibi, self.max_len, self.bias = rope, alibi, max_len, bias
        self.keep_weights = keep_weights
        if rope:
            if max_len is None:
                raise ValueError("rope needs max_len (the length of its angle tables)")
            check_positive("max_len", max_len, integer=True)
            cos, sin = rope_tables(max_len, self.head_width, dtype=dtype)  # (max_len, D/2)
            self.buffers["rope_cos"], self.buffers["rope_sin"] = cos, sin
        rng = np.random.default_rng() if rng is None else rng
        self.drop = None
        if check_number("dropout", dropout, 0.0, 1.0):  # a child generator: the weights'
            # draws below stay those of the same rng without dropout
            self.drop = self.add("drop", Dropout(dropout, seed=rng.spawn(1)[0]))
        bound = 1.0 / np.sqrt(width)
        kv_width = self.kv_heads * self.head_width  # H_kv D, C in multi-head attention
        for name, out in (("q", width), ("k", kv_width), ("v", kv_width), ("o", width)):
            self.add_param("w" + name, drawn((width, out), dtype,
                                             lambda s: rng.uniform(-bound, bound, s)))
            if bias:
                self.add_param("b" + name, rng.uniform(-bound, bound, out).astype(dtype))
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
        if kv_cache is not None:
            self.cache = None  # decoding keeps nothing for a backward
            out = self._forward_cached(x, context, mask, kv_cache)
        elif context is None:
            out = self._forward_self(x, mask, self.keeps_cache)
        else:
            out = self._forward_cross(x, context, mask, self.keeps_cache)
        return self.expect_grad_like(out)

    def _forward_self(self, x: np.ndarray, mask: np.ndarray | None, keep: bool) -> np.ndarray:
        """Equations (1)-(6) with src = x, keeping the cache for :meth:`_backward_self` (with
        ``keep``)."""
        # (1), (2): q (B, H, T, D), k, v (B, H_kv, T, D) from the one source
        (q, k, v), projection = self._project(x, "qkv", keep)
        if self.rope:  # (3) position p of q and of k is the same p
            cos, sin = self._rope_rows(0, q.shape[2])  # (T, D/2)
            q, k = rope_forward(q, cos, sin), rope_forward(k, cos, sin)
        o, sdpa = self._attend(q, k, v, mask, x.dtype, keep)  # (4) (B, H, T, D)
        o = merge_heads(o)  # (5) (B, T, C)
        out, out_cache = self.ops.linear_forward(o, self.params["wo"], self.params.get("bo"),
                                                 keep=keep)  # (6)
        self.cache = AttentionCache((projection,), sdpa, out_cache, False,
                                    q.shape[2]) if keep else None
        return out

    def _forward_cross(self, x: np.ndarray, context: np.ndarray,
                       mask: np.ndarray | None, keep: bool) -> np.ndarray:
        """Equations (1), (2), (4)-(6) with src = context, for :meth:`_backward_cross`."""
        # (1), (2): q (B, H, T_q, D) from x; k, v (B, H_kv, T_k, D) from the context
        (q,), q_cache = self._project(x, "q", keep)
        (k, v), context_cache = self._project(context, "kv", keep)
        o, sdpa = self._attend(q, k, v, mask, x.dtype, keep)  # (4) (B, H, T_q, D)
        o = merge_heads(o)  # (5) (B, T_q, C)
        out, out_cache = self.ops.linear_forward(o, self.params["wo"], self.params.get("bo"),
                                                 keep=keep)  # (6)
        self.cache = AttentionCache((q_cache, context_cache), sdpa, out_cache, True,
                                    q.shape[2]) if keep else None
        return out

    def _forward_cached(self, x: np.ndarray, context: np.ndarray | None,
                        mask: np.ndarray | None, kv_cache: KVCache) -> np.ndarray:
        """Equations (1)-(6) for decoding: k and v of every position so far, from the cache."""
        if context is None:  # self-attention: the new positions' k and v join the cache
            (q, k, v), _ = self._project(x, "qkv", keep=False)  # (1), (2)
            if self.rope:  # (3) at the positions after the cached ones
                cos, sin = self._rope_rows(kv_cache.length, q.shape[2])
                q, k = rope_forward(q, cos, sin), rope_forward(k, cos, sin)
            k, v = kv_cache.append(k, v)  # (B, H_kv, T_k, D), T_k = every position so far
        else:  # cross-attention: the context's k and v, computed on the first call only
            (q,), _ = self._project(x, "q", keep=False)  # (1), (2)
            if kv_cache.length > 0:
                k, v = kv_cache.kept()
            else:
                (k, v), _ = self._project(context, "kv", keep=False)  # (1), (2)
                k, v = kv_cache.append(k, v)
        o, _ = self._attend(q, k, v, mask, x.dtype, keep=False, decoding=True)  # (4)
        o = merge_heads(o)  # (5) (B, T_q, C)
        return self.ops.linear_forward(o, self.params["wo"], self.params.get("bo"),
                                       keep=False)[0]  # (6)

    def _head_groups(self, names: str) -> list[tuple[str, int]]:
        """The projections ``names`` (e.g. "qkv") in runs of one head count, with the count.

        Queries have H heads, keys and values H_kv: "qkv" is one run in multi-head attention,
        ``[("qkv", H)]``, and two in grouped-query attention, ``[("q", H), ("kv", H_kv)]``.
        """
        count = {"q": self.heads, "k": self.kv_heads, "v": self.kv_heads}
        return [("".join(run), h) for h, run in groupby(names, key=count.__getitem__)]

    def _project(self, src: np.ndarray, names: str, keep: bool) -> tuple[tuple, tuple]:
        """(1), (2) for the projections ``names`` of one source: one backend operation per
        run of :meth:`_head_groups`. Returns the heads, one (B, H or H_kv, T, D) array per
        name, and the operations' caches (None each without ``keep``)."""
        ys, caches = (), ()
        for run, heads in self._head_groups(names):
            ws = tuple(self.params["w" + n] for n in run)  # (C, H D) or (C, H_kv D) each
            bs = tuple(self.params["b" + n] for n in run) if self.bias else None
            y, cache = self.ops.linear_heads_forward(src, ws, bs, heads, keep=keep)
            ys, caches = ys + y, caches + (cache,)
        return ys, caches

    def _project_backward(self, dys: tuple, caches: tuple, names: str) -> np.ndarray:
        """The backward of :meth:`_project`: adds dw, db into ``grads``; returns dsrc, the sum
        of the paths through every projection of ``names`` (B, T, C)."""
        dsrc, i = None, 0
        for (run, _), cache in zip(self._head_groups(names), caches, strict=True):
            d, dws, dbs = self.ops.linear_heads_backward(dys[i:i + len(run)], cache)
            i += len(run)
            for j, n in enumerate(run):  # (1) => dw, db of each projection
                self.add_grad("w" + n, dws[j])
                if self.bias:
                    self.add_grad("b" + n, dbs[j])
            dsrc = d if dsrc is None else dsrc + d  # (1) src fed every run
        return dsrc

    def _attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
                dtype, keep: bool, decoding: bool = False) -> tuple[np.ndarray, object]:
        """(4) the attention core with the ALiBi bias and the dropout if asked; keeps the
        weights if asked."""
        bias = alibi_bias(self.heads, q.shape[2], k.shape[2], dtype=dtype) if self.alibi else None
        drop = None  # m of (4): (B, H, T_q, T_k), in training only
        if self.drop is not None and self.training and not decoding:
            drop = dropout_mask(q.shape[:3] + k.shape[2:3], self.drop.p, self.drop.rng, dtype)
        o, cache = self.ops.sdpa_forward(q, k, v, mask=mask, bias=bias, dropout=drop,
                                         keep=keep)  # (4)
        if self.keep_weights:
            self.weights = self.ops.attention_weights(q, k, mask=mask, bias=bias)
        return o, cache

    def _rope_rows(self, start: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        """The RoPE tables' rows of the positions start .. start + length - 1, (length, D/2)."""
        return (self.buffers["rope_cos"][start:start + length],
                self.buffers["rope_sin"][start:start + length])

    def backward(self, dout: np.ndarray):
        """Gradients of the last forward; adds into every ``grads`` entry.

        Returns
        -------
        dx : ndarray of shape (B, T_q, C)
            Self-attention: the sum of the three paths through q, k and v.
        (dx, dcontext) : tuple, for cross-attention
            ``dcontext`` (B, T_k, C) sums the paths through k and v.
        """
        self.check_grad("dout", dout)
        if self.cache is None:
            raise ValueError("MultiHeadAttention.backward needs a forward first (a forward "
                             "with a kv_cache, in evaluation mode or inside no_grad() keeps "
                             "nothing for a backward)")
        return self._backward_cross(dout) if self.cache.cross else self._backward_self(dout)

    def _backward_self(self, dout: np.ndarray) -> np.ndarray:
        """The backward of :meth:`_forward_self`, equations (6) down to (1)."""
        c = self.cache
        do = self._output_backward(dout)  # (6), (5) (B, H, T, D)
        dq, dk, dv = self.ops.sdpa_backward(do, c.sdpa)  # (4) (B, H, T, D) each
        if self.rope:  # (3) rotation  =>  the inverse rotation
            cos, sin = self._rope_rows(0, c.t_q)
            dq, dk = rope_backward(dq, cos, sin), rope_backward(dk, cos, sin)
        # (2), (1): x fed q, k and v, so dx sums the three paths (B, T, C)
        return self._project_backward((dq, dk, dv), c.projections[0], "qkv")

    def _backward_cross(self, dout: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The backward of :meth:`_forward_cross`, equations (6) down to (1)."""
        c = self.cache
        do = self._output_backward(dout)  # (6), (5) (B, H, T_q, D)
        dq, dk, dv = self.ops.sdpa_backward(do, c.sdpa)  # (4)
        # (2), (1): x fed q; the context fed k and v, so dcontext sums two paths
        dx = self._project_backward((dq,), c.projections[0], "q")  # (B, T_q, C)
        dcontext = self._project_backward((dk, dv), c.projections[1], "kv")  # (B, T_k, C)
        return dx, dcontext

    def _output_backward(self, dout: np.ndarray) -> np.ndarray:
        """(6) out = o wo + bo and (5) o = merge_heads(o), backwards: do (B, H, T_q, D)."""
        # (6) out = o wo + bo   =>   do = dout wo^T,  dwo = o^T dout,  dbo = sum dout
        do, dwo, dbo = self.ops.linear_backward(dout, self.cache.out)  # (B, T_q, C)
        self.add_grad("wo", dwo)
        if self.bias:
            self.add_grad("bo", dbo)
        return split_heads(do, self.heads)  # (5) merge heads  =>  split the gradient

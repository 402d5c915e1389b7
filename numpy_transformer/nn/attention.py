"""Multi-head attention, self or cross, with optional RoPE or ALiBi, on a selectable backend.

The scaled dot-product core comes from a backend with one contract,
``out, cache = sdpa_forward(q, k, v, mask, bias)`` and ``dq, dk, dv = sdpa_backward(dout,
cache)``: ``"numpy"`` is the readable reference in ``functional/attention.py``, ``"numba"``
the fused kernel in ``kernels/attention.py`` (imported only when asked for).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import check_float, check_last_dim, check_positive
from ..functional import attention as numpy_attention
from ..functional.linear import LinearCache
from ..functional.masks import causal_mask
from ..functional.positional import alibi_bias, rope_backward, rope_forward, rope_tables
from .layers import linear_backend, linear_heads_backend
from .module import Module

BACKENDS = ("numpy", "numba")


def sdpa_backend(name: str):
    """``(sdpa_forward, sdpa_backward)`` of the backend ``"numpy"`` or ``"numba"``."""
    if name == "numpy":
        return numpy_attention.sdpa_forward, numpy_attention.sdpa_backward
    if name == "numba":
        from ..kernels import attention as numba_attention  # lazy: compiles on first import

        return numba_attention.sdpa_forward, numba_attention.sdpa_backward
    raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")


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
    backend : {"numpy", "numba"}, default "numpy"
    keep_weights : bool, default False
        If True, every forward stores the attention weights (B, H, T_q, T_k) in
        ``self.weights`` for plotting (computed again, outside the gradient path).
    dtype : dtype, default float64
    rng : np.random.Generator, optional

    Attributes
    ----------
    params : wq, bq, wk, bk, wv, bv, wo, bo
        Each w is (C, C) in the ``x @ w`` layout, each b is (C,): 4C^2 + 4C numbers whatever
        the head count. Initialised like four ``nn.Linear(C, C)``: U(-1/sqrt(C), 1/sqrt(C)).

    Notes
    -----
    With ``src = x`` (self-attention) or ``src = context`` (cross-attention):

    (1) q = x wq + bq,  k = src wk + bk,  v = src wv + bv          (B, T, C)
        computed as one product per source with the weights side by side: x [wq | wk | wv]
        (C, 3C) in self-attention, x wq and context [wk | wv] in cross-attention
    (2) split into heads                                           (B, H, T, D)
        (1) and (2) are one call, ``linear_heads_forward``: views of the product in NumPy,
        a product written head by head in the numba kernel
    (3) q, k = rope(q), rope(k)                                    (if rope)
    (4) o = softmax(q k^T / sqrt(D) + alibi, masked) v             (B, H, T_q, D)
    (5) merge heads                                                (B, T_q, C)
    (6) out = o wo + bo                                            (B, T_q, C)

    References
    ----------
    Vaswani et al., "Attention Is All You Need", 2017.
    Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", 2021.
    Press, Smith & Lewis, "Train Short, Test Long: Attention with Linear Biases", 2022.
    """

    def __init__(self, width: int, heads: int, *, rope: bool = False, alibi: bool = False,
                 max_len: int | None = None, backend: str = "numpy", keep_weights: bool = False,
                 dtype=np.float64, rng: np.random.Generator | None = None) -> None:
        super().__init__()
        check_positive("width", width, integer=True)
        check_positive("heads", heads, integer=True)
        if width % heads:
            raise ValueError(f"heads={heads} does not divide width={width}")
        self.width, self.heads, self.head_width = width, heads, width // heads
        self.rope, self.alibi, self.max_len = rope, alibi, max_len
        self.backend, self.keep_weights = backend, keep_weights
        self.sdpa_forward, self.sdpa_backward = sdpa_backend(backend)
        self.affine_forward, self.affine_backward = linear_backend(backend)
        self.heads_forward = linear_heads_backend(backend)
        if rope:
            if self.head_width % 2:
                raise ValueError(f"rope needs an even head width, got width {width} / "
                                 f"heads {heads} = {self.head_width}")
            if max_len is None:
                raise ValueError("rope needs max_len (the length of its angle tables)")
            check_positive("max_len", max_len, integer=True)
            cos, sin = rope_tables(max_len, self.head_width, dtype=dtype)  # (max_len, D/2)
            self.buffers["rope_cos"], self.buffers["rope_sin"] = cos, sin
        rng = np.random.default_rng() if rng is None else rng
        bound = 1.0 / np.sqrt(width)
        for name in ("q", "k", "v", "o"):
            self.add_param("w" + name, rng.uniform(-bound, bound, (width, width)).astype(dtype))
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

    def forward(self, x: np.ndarray, context: np.ndarray | None = None,
                mask: np.ndarray | None = None) -> np.ndarray:
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

        Returns
        -------
        out : ndarray of shape (B, T_q, C)
        """
        self._check_inputs(x, context)
        p = self.params
        sources = (x,) if context is None else (x, context)
        heads, caches = {}, []
        for names, source in zip(_groups(context is not None), sources, strict=True):
            w = np.concatenate([p["w" + n] for n in names], axis=1)  # (C, len(names) C)
            b = np.concatenate([p["b" + n] for n in names])
            # (1) and (2): y[i] holds the heads of names[i], (B, H, T, D)
            y, y_cache = self.heads_forward(source, w, b, len(names), self.heads)
            caches.append(y_cache)
            heads.update(zip(names, y, strict=True))
        q, k, v = heads["q"], heads["k"], heads["v"]
        t_q, t_k = q.shape[2], k.shape[2]
        if self.rope:  # (3) self-attention: position p of q and of k is the same p
            cos, sin = self.buffers["rope_cos"][:t_q], self.buffers["rope_sin"][:t_q]
            q, k = rope_forward(q, cos, sin), rope_forward(k, cos, sin)
        bias = alibi_bias(self.heads, t_q, t_k, dtype=x.dtype) if self.alibi else None
        o, sdpa_cache = self.sdpa_forward(q, k, v, mask=mask, bias=bias)  # (4) (B, H, T_q, D)
        if self.keep_weights:
            self.weights = numpy_attention.attention_weights(q, k, mask=mask, bias=bias)
        out, out_cache = self.affine_forward(merge_heads(o), p["wo"], p["bo"])  # (5), (6)
        self.cache = AttentionCache(tuple(caches), sdpa_cache, out_cache, context is not None,
                                    t_q, t_k)
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
        # (6) out = o wo + bo
        do, dwo, dbo = self.affine_backward(dout, c.out)
        self.grads["wo"] += dwo
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
            self.sdpa_backward(do, c.sdpa, out=slots)
        else:  # (4) attention core, then (3) rotation  =>  inverse rotation
            dq, dk, dv = self.sdpa_backward(do, c.sdpa)
            cos, sin = self.buffers["rope_cos"][: c.t_q], self.buffers["rope_sin"][: c.t_q]
            for slot, grad in zip(slots, (rope_backward(dq, cos, sin),
                                          rope_backward(dk, cos, sin), dv), strict=True):
                slot[...] = grad
        dsources = []
        for names, dy, y_cache in zip(_groups(c.cross), dys, c.projections, strict=True):
            # (1) y = source [w_1 | .. | w_n] + [b_1 | .. | b_n]
            dsource, dw, db = self.affine_backward(dy.reshape(b, dy.shape[1], -1), y_cache)
            for i, n in enumerate(names):
                self.grads["w" + n] += dw[:, i * self.width:(i + 1) * self.width]
                self.grads["b" + n] += db[i * self.width:(i + 1) * self.width]
            dsources.append(dsource)
        # self-attention: x fed q, k and v, and the stacked product already summed the paths
        return tuple(dsources) if c.cross else dsources[0]

    # --- incremental decoding (inference only, no backward) ---
    # Generating one token at a time, a causal self-attention would recompute the keys and
    # values of every earlier position at every step. They never change (earlier positions
    # cannot see the new token), so a ``KVCache`` keeps them and each new token costs one
    # query row. These methods store no backward cache and leave ``self.cache`` alone.

    def new_cache(self, batch: int, capacity: int | None = None, dtype=None) -> KVCache:
        """An empty :class:`KVCache` for this self-attention (capacity defaults to max_len)."""
        capacity = self.max_len if capacity is None else capacity
        if capacity is None:
            raise ValueError("this attention has no max_len: pass the cache capacity")
        dtype = self.params["wq"].dtype if dtype is None else dtype
        return KVCache(batch, self.heads, capacity, self.head_width, dtype=dtype)

    def forward_cached(self, x: np.ndarray, cache: KVCache) -> np.ndarray:
        """Causal self-attention of T_new new positions against everything in ``cache``.

        The new positions are ``cache.length .. cache.length + T_new - 1``; their keys and
        values are appended to the cache. T_new is the prompt length when prefilling and 1
        per generated token. The result equals the last T_new rows of ``forward`` over the
        whole sequence with a causal mask.

        Parameters
        ----------
        x : ndarray of shape (B, T_new, C)
        cache : KVCache

        Returns
        -------
        out : ndarray of shape (B, T_new, C)

        Notes
        -----
        Steps (1)-(6) of the forward, except that in (3) RoPE rotates by the *absolute*
        positions start .. start + T_new - 1, that ALiBi's bias and the causal mask are those
        of the last T_new queries over all T_so_far keys, and that k, v come from the cache.
        """
        p = self.params
        start, t_new = cache.length, x.shape[1]
        q = x @ p["wq"] + p["bq"]  # (1) as linear_forward, without its cache (B, T_new, C)
        k = x @ p["wk"] + p["bk"]
        v = x @ p["wv"] + p["bv"]
        q, k, v = (split_heads(a, self.heads) for a in (q, k, v))  # (2) (B, H, T_new, D)
        if self.rope:  # (3) rotate at the absolute positions of the new tokens
            cos = self.buffers["rope_cos"][start:start + t_new]
            sin = self.buffers["rope_sin"][start:start + t_new]
            q, k = rope_forward(q, cos, sin), rope_forward(k, cos, sin)
        keys, values = cache.append(k, v)  # (B, H, T_so_far, D), T_so_far = start + T_new
        t_k = keys.shape[2]
        bias = alibi_bias(self.heads, t_new, t_k, dtype=x.dtype) if self.alibi else None
        if t_new == 1:  # (4) one generated token: see one_query_attention
            o = one_query_attention(q, keys, values, bias)  # (B, H, 1, D)
        else:  # (4) prefill: the backend, with the causal mask of the last T_new queries
            o, _ = self.sdpa_forward(q, keys, values, mask=causal_mask(t_new, t_k), bias=bias)
        return merge_heads(o) @ p["wo"] + p["bo"]  # (5), (6) (B, T_new, C)

    def context_kv(self, context: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values (B, H, T_s, D) of a cross-attention's ``context`` (B, T_s, C).

        During decoding the encoder's memory does not change: compute these once and pass
        them to :meth:`forward_cross_cached` at every step.
        """
        p = self.params
        k = context @ p["wk"] + p["bk"]  # (1) (B, T_s, C)
        v = context @ p["wv"] + p["bv"]
        return split_heads(k, self.heads), split_heads(v, self.heads)  # (2) (B, H, T_s, D)

    def forward_cross_cached(self, x: np.ndarray, k: np.ndarray, v: np.ndarray,
                             mask: np.ndarray | None = None) -> np.ndarray:
        """Cross-attention of x (B, T_new, C) to keys/values from :meth:`context_kv`.

        ``mask`` (True = may attend) broadcasts to (B, H, T_new, T_s), e.g. the source padding.
        """
        p = self.params
        q = split_heads(x @ p["wq"] + p["bq"], self.heads)  # (1), (2) (B, H, T_new, D)
        o, _ = self.sdpa_forward(q, k, v, mask=mask, bias=None)  # (4) (B, H, T_new, D)
        return merge_heads(o) @ p["wo"] + p["bo"]  # (5), (6)


def one_query_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                        bias: np.ndarray | None = None) -> np.ndarray:
    """Attention of the newest position alone: ``softmax(q k^T / sqrt(D) + bias) v``.

    The step (4) of cached decoding, written out because it is this simple: the newest
    query may attend every key (no mask, so no fully masked row), and it needs no backward.
    Same arithmetic as ``functional.attention.scores_forward``, without the input checks and
    masking that cost more than the math at this size.

    Parameters
    ----------
    q : ndarray of shape (B, H, 1, D)
    k, v : ndarray of shape (B, H, T_k, D)
    bias : ndarray broadcastable to (B, H, 1, T_k), optional (ALiBi)

    Returns
    -------
    out : ndarray of shape (B, H, 1, D)
    """
    s = (q @ k.swapaxes(-1, -2)) * q.dtype.type(1.0 / np.sqrt(q.shape[-1]))  # (B, H, 1, T_k)
    if bias is not None:
        s = s + bias
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v


class KVCache:
    """Keys and values of the positions seen so far by one self-attention layer (inference).

    The arrays are allocated once for ``capacity`` positions and filled from the left, so a
    step copies only its new row instead of re-allocating the whole history.

    Parameters
    ----------
    batch, heads, capacity, head_width : int
        B, H, the most positions the cache can hold (the model's ``max_len``), and D.
    dtype : dtype, default float64

    Attributes
    ----------
    k, v : ndarray of shape (B, H, capacity, D)
        Only the first ``length`` positions are meaningful.
    length : int
        T_so_far, the positions held; the next appended position has this index.
    """

    def __init__(self, batch: int, heads: int, capacity: int, head_width: int,
                 dtype=np.float64) -> None:
        self.capacity = capacity
        self.k = np.zeros((batch, heads, capacity, head_width), dtype=dtype)  # (B, H, T_max, D)
        self.v = np.zeros((batch, heads, capacity, head_width), dtype=dtype)
        self.length = 0

    def append(self, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store ``k``, ``v`` (B, H, T_new, D) after the held positions; return all of them.

        Returns
        -------
        keys, values : ndarray of shape (B, H, T_so_far + T_new, D)
            Views into the cache, valid until the next ``append`` or ``reset``.
        """
        start, stop = self.length, self.length + k.shape[2]
        if stop > self.capacity:
            raise ValueError(f"the KV cache holds {self.length} of {self.capacity} positions: "
                             f"{k.shape[2]} more do not fit (reset it and prefill a window)")
        self.k[:, :, start:stop] = k
        self.v[:, :, start:stop] = v
        self.length = stop
        return self.k[:, :, :stop], self.v[:, :, :stop]

    def reset(self) -> None:
        """Forget every position (the arrays are reused)."""
        self.length = 0


def zero_gradient_names(module, prefix: str = "") -> set[str]:
    """Dotted names of parameters whose true gradient is exactly zero: key biases without RoPE.

    The key bias ``bk`` adds ``q . bk`` to every score of a query row: the same number across
    the row, which softmax ignores. Its gradient is therefore exactly zero, and a gradient
    check must judge it by absolute error (both sides are rounding noise). With RoPE the bias
    is rotated differently at each key position, and the gradient is real.
    """
    names = set()
    if isinstance(module, MultiHeadAttention) and not module.rope:
        names.add(prefix + "bk")
    for name, child in module.children.items():
        names |= zero_gradient_names(child, prefix + name + ".")
    return names

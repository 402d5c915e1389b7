"""Cached decoding: the keys and values a decoder keeps so that a new token costs one row.

Generating one token at a time, a causal self-attention would recompute the keys and values
of every earlier position at every step. They never change (earlier positions cannot see the
new token), so a :class:`KVCache` keeps them, and the model's ordinary ``forward`` is called
with only the new positions and a :class:`DecoderCache` (``model.forward(tokens,
cache=cache)``): every attention appends the new keys and values and attends to all of them,
RoPE rotates and the position tables add at the absolute positions, and the causal mask is that
of the new queries over every position so far. The logits equal the last rows of a full
forward over the whole sequence (``tests/test_generate.py``); nothing is rewritten for
decoding, so the two cannot drift apart.

An encoder-decoder's cross-attentions compute the keys and values of the encoder's output once,
on the first call, and read them from their caches after; the encoder runs once.

Sampling, and what happens when the sequence outgrows the model's ``max_len``, are in
``numpy_transformer/generate.py``.

References
----------
Pope et al., "Efficiently Scaling Transformer Inference", 2022 (the key/value cache).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class KVCache:
    """Keys and values of the positions seen so far by one attention layer (inference).

    The arrays are allocated once for ``capacity`` positions and filled from the left, so a
    step copies only its new rows instead of re-allocating the whole history.

    Parameters
    ----------
    batch, heads, capacity, head_width : int
        B, the heads of the keys and values (H_kv: H, or fewer in grouped-query attention),
        the most positions the cache can hold, and D.
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

        Raises
        ------
        ValueError
            If the new positions do not fit in the capacity.
        """
        start, stop = self.length, self.length + k.shape[2]
        if stop > self.capacity:
            raise ValueError(f"the KV cache holds {self.length} of {self.capacity} positions: "
                             f"{k.shape[2]} more do not fit (reset it and prefill a window)")
        self.k[:, :, start:stop] = k
        self.v[:, :, start:stop] = v
        self.length = stop
        return self.kept()

    def kept(self) -> tuple[np.ndarray, np.ndarray]:
        """The held keys and values, (B, H, T_so_far, D) views into the cache."""
        return self.k[:, :, :self.length], self.v[:, :, :self.length]

    def reset(self) -> None:
        """Forget every position (the arrays are reused)."""
        self.length = 0


class BlockCache(NamedTuple):
    """What one decoder block keeps: its self-attention's cache, and its cross-attention's."""

    attn: KVCache
    cross_attn: KVCache | None


class DecoderCache:
    """Everything cached decoding keeps for one batch of sequences.

    Build it with :func:`new_cache`; pass it to ``model.forward(..., cache=cache)`` with the
    positions that follow those it holds.

    Attributes
    ----------
    blocks : list of BlockCache
        One per decoder block.
    memory, memory_mask : ndarray or None
        An encoder-decoder's encoder output (B, T_s, C) and source mask, kept from the first
        call (``None`` before it, and for a decoder-only model).
    """

    def __init__(self, blocks: list[BlockCache]) -> None:
        self.blocks = blocks
        self.memory = self.memory_mask = None

    @property
    def length(self) -> int:
        """Positions held: the next new position has this index."""
        return self.blocks[0].attn.length

    def reset(self) -> None:
        """Forget every target position (an encoder-decoder keeps its encoded source)."""
        for block in self.blocks:
            block.attn.reset()


def new_cache(model, batch: int) -> DecoderCache:
    """An empty :class:`DecoderCache` for ``batch`` sequences of up to ``max_len`` positions.

    The source of an encoder-decoder may be as long as ``max_len`` too.

    Parameters
    ----------
    model : DecoderLM or EncoderDecoder
        The models that decode say how, by their class attribute ``decodes``: ``"self"`` (a
        cache per self-attention) or ``"cross"`` (one per cross-attention too). This module
        does not import them: they import it.
    batch : int

    Raises
    ------
    ValueError
        If ``model`` is neither a DecoderLM nor an EncoderDecoder, or ``batch`` < 1.
    """
    if getattr(type(model), "decodes", None) not in ("self", "cross"):
        raise ValueError(f"cached decoding needs a DecoderLM or an EncoderDecoder, got "
                         f"{type(model).__name__}")
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    config = model.config
    dtype = next(model.parameters())[0].dtype  # the weights' (a model may have been cast)

    def kv() -> KVCache:
        kv_heads = config.heads if config.kv_heads is None else config.kv_heads  # H_kv
        return KVCache(batch, kv_heads, config.max_len, config.width // config.heads,
                       dtype=dtype)

    cross = type(model).decodes == "cross"
    return DecoderCache([BlockCache(kv(), kv() if cross else None)
                         for _ in range(config.layers)])

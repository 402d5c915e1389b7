"""The three Transformer families, all built from the same blocks.

* :class:`EncoderClassifier`: bidirectional encoder and a per-position classifier (tagging,
  the course chapter's sorter).
* :class:`DecoderLM`: causal decoder-only language model (the chapter's character model).
* :class:`EncoderDecoder`: encoder, decoder with cross-attention, vocabulary logits
  (Vaswani et al.'s translation model).

Each model is a few named parts: ``Embeddings`` (token lookup, optional sqrt(C) scale,
absolute positions), an ``Encoder`` and/or ``Decoder`` stack (blocks, then ``final_norm`` for
pre-LN models; a post-LN stack already ends in a norm), and a ``head`` to logits.
"""

from __future__ import annotations

import numpy as np

from .._checks import check_ids
from ..functional.masks import key_padding_mask
from .attention import KVCache
from .blocks import DecoderBlock, EncoderBlock
from .config import TransformerConfig
from .layers import Dropout, Embedding, Linear, TiedOutput, make_norm
from .module import Module, ModuleList
from .positional import LearnedPositions, SinusoidalPositions


def _block_options(config: TransformerConfig, rng: np.random.Generator) -> dict:
    """The keyword arguments every block of a model shares."""
    return dict(norm=config.norm, activation=config.activation, norm_first=config.norm_first,
                dropout=config.dropout, rope=config.positions == "rope",
                alibi=config.positions == "alibi", max_len=config.max_len,
                backend=config.backend, dtype=np.dtype(config.dtype), rng=rng)


class Embeddings(Module):
    """Token ids to the residual stream: lookup, optional sqrt(C) scale, positions, dropout.

    Notes
    -----
    (1) e = tokens[ids]   (2) e = e * sqrt(C) (if ``embed_scale``)
    (3) e = e + PE[:T]   (sinusoidal or learned positions)   (4) x = drop(e)

    With the numba backend, (1)-(3) are one pass (``kernels/embedding.py``), and the token
    table's gradient takes the scale (2) on the way.
    """

    def __init__(self, config: TransformerConfig, rng: np.random.Generator) -> None:
        super().__init__()
        dtype, width = np.dtype(config.dtype), config.width
        self.vocab, self.width = config.vocab, width
        std = 1.0 / np.sqrt(width) if config.embed_std is None else config.embed_std
        self.tokens = self.add("tokens", Embedding(config.vocab, width, std, dtype=dtype, rng=rng,
                                                   backend=config.backend))
        self.scale = float(np.sqrt(width)) if config.embed_scale else 1.0
        self.positions = None  # rope, alibi and none add nothing here
        if config.positions == "sinusoidal":
            self.positions = self.add("positions",
                                      SinusoidalPositions(config.max_len, width, dtype=dtype))
        elif config.positions == "learned":
            self.positions = self.add("positions", LearnedPositions(config.max_len, width,
                                                                    dtype=dtype, rng=rng))
        self.drop = self.add("drop", Dropout(config.dropout, seed=int(rng.integers(2**32))))
        self.fused_forward = self.fused_backward = None  # numba: (1)-(3) in one pass
        if config.backend == "numba":
            from ..kernels import embedding as fused  # lazy: compiles on first import

            self.fused_forward = fused.embeddings_forward
            self.fused_backward = fused.embedding_backward
        self.cache = None

    def forward(self, tokens: np.ndarray) -> np.ndarray:
        """tokens : int (B, T) -> x : (B, T, C)."""
        tokens = check_ids("tokens", tokens, self.vocab)
        if tokens.ndim != 2:
            raise ValueError(f"tokens must have shape (B, T), got {tokens.shape}")
        if self.fused_forward is not None:  # (1)-(3) in one pass
            rows = None if self.positions is None else self.positions.addend(tokens.shape[1])
            x, self.cache = self.fused_forward(tokens, self.tokens.params["table"], self.scale,
                                               rows)
            return self.drop(x)  # (4)
        x = self.tokens(tokens) * self.scale  # (1), (2)
        if self.positions is not None:
            x = self.positions(x)  # (3)
        return self.drop(x)  # (4)

    def backward(self, dx: np.ndarray) -> None:
        """Adds into the token (and learned position) tables; token ids have no gradient."""
        dx = self.drop.backward(dx)  # (4)
        if self.positions is not None:
            dx = self.positions.backward(dx)  # (3)
        if self.fused_backward is not None:  # (2), (1)
            self.tokens.grads["table"] += self.fused_backward(dx, self.cache, self.scale)
            return
        self.tokens.backward(dx * self.scale)  # (2), (1)

    # --- incremental decoding (inference only, no backward) ---
    def forward_at(self, tokens: np.ndarray, start: int) -> np.ndarray:
        """tokens : int (B, T) at absolute positions start .. start + T - 1 -> x : (B, T, C).

        Steps (1)-(3) with the position rows ``start .. start + T - 1``; dropout (4) is
        skipped (evaluation semantics) and no backward cache is kept.
        """
        tokens = check_ids("tokens", tokens, self.vocab)
        if tokens.ndim != 2:
            raise ValueError(f"tokens must have shape (B, T), got {tokens.shape}")
        x = self.tokens.params["table"][tokens] * self.scale  # (1), (2)
        if self.positions is not None:
            x = self.positions.forward_at(x, start)  # (3) the absolute positions
        return x


class Encoder(Module):
    """Embeddings, ``layers`` encoder blocks, and a final norm when pre-LN.

    ``forward(tokens, mask=None) -> (B, T, C)``; ``backward(dout) -> None``.
    """

    def __init__(self, config: TransformerConfig, rng: np.random.Generator) -> None:
        super().__init__()
        c = config
        self.embed = self.add("embed", Embeddings(c, rng))
        self.blocks = self.add("blocks", ModuleList(
            [EncoderBlock(c.width, c.heads, c.ffn_width, **_block_options(c, rng))
             for _ in range(c.layers)]))
        self.final_norm = None  # post-LN blocks already end in a norm
        if c.norm_first:
            self.final_norm = self.add("final_norm", make_norm(c.norm, c.width,
                                                               dtype=np.dtype(c.dtype),
                                                               backend=c.backend))

    def forward(self, tokens: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        x = self.embed(tokens)  # (B, T, C)
        for block in self.blocks:
            x = block(x, mask)
        return x if self.final_norm is None else self.final_norm(x)

    def backward(self, dout: np.ndarray) -> None:
        dx = dout if self.final_norm is None else self.final_norm.backward(dout)
        for block in reversed(self.blocks):
            dx = block.backward(dx)
        self.embed.backward(dx)


class Decoder(Module):
    """Embeddings, ``layers`` causal decoder blocks (with cross-attention if ``cross``), and a
    final norm when pre-LN.

    ``forward(tokens, memory=None, memory_mask=None) -> (B, T, C)``;
    ``backward(dout)`` returns ``dmemory`` (B, T_s, C) when ``cross``, else ``None``.
    """

    def __init__(self, config: TransformerConfig, rng: np.random.Generator,
                 cross: bool = False) -> None:
        super().__init__()
        c = config
        self.cross = cross
        self.embed = self.add("embed", Embeddings(c, rng))
        self.blocks = self.add("blocks", ModuleList(
            [DecoderBlock(c.width, c.heads, c.ffn_width, cross=cross, **_block_options(c, rng))
             for _ in range(c.layers)]))
        self.final_norm = None
        if c.norm_first:
            self.final_norm = self.add("final_norm", make_norm(c.norm, c.width,
                                                               dtype=np.dtype(c.dtype),
                                                               backend=c.backend))

    def forward(self, tokens: np.ndarray, memory: np.ndarray | None = None,
                memory_mask: np.ndarray | None = None) -> np.ndarray:
        x = self.embed(tokens)  # (B, T, C)
        for block in self.blocks:
            x = block(x, memory, memory_mask)
        return x if self.final_norm is None else self.final_norm(x)

    def backward(self, dout: np.ndarray) -> np.ndarray | None:
        dx = dout if self.final_norm is None else self.final_norm.backward(dout)
        dmemory = None
        for block in reversed(self.blocks):
            if self.cross:  # every block read the same memory: its gradients add up
                dx, dmem = block.backward(dx)
                dmemory = dmem if dmemory is None else dmemory + dmem
            else:
                dx = block.backward(dx)
        self.embed.backward(dx)
        return dmemory

    # --- incremental decoding (inference only, no backward) ---
    def new_caches(self, batch: int) -> list[KVCache]:
        """One empty :class:`KVCache` per block, each for ``max_len`` positions."""
        return [block.attn.new_cache(batch) for block in self.blocks]

    def memory_kv(self, memory: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each block's cross-attention keys and values of ``memory``, computed once."""
        return [block.cross_attn.context_kv(memory) for block in self.blocks]

    def forward_cached(self, tokens: np.ndarray, caches: list[KVCache], memory_kv=None,
                       memory_mask: np.ndarray | None = None) -> np.ndarray:
        """tokens : int (B, T_new), the positions after those in ``caches`` -> (B, T_new, C).

        Appends the new positions to every block's cache. Equals the last T_new rows of
        ``forward`` over the whole sequence (in eval mode).
        """
        x = self.embed.forward_at(tokens, caches[0].length)  # (B, T_new, C)
        for i, block in enumerate(self.blocks):
            x = block.forward_cached(x, caches[i], None if memory_kv is None else memory_kv[i],
                                     memory_mask)
        return x if self.final_norm is None else self.final_norm(x)


class EncoderClassifier(Module):
    """Bidirectional encoder with a linear classifier at every position.

    Parameters
    ----------
    config : TransformerConfig
        Needs ``num_classes``; ``tie_embeddings`` must be False (there is no vocabulary output).

    Examples
    --------
    >>> cfg = TransformerConfig(vocab=10, width=8, heads=2, layers=1, ffn_width=16,
    ...                         max_len=6, num_classes=10)
    >>> EncoderClassifier(cfg).forward(np.zeros((2, 6), dtype=int)).shape
    (2, 6, 10)
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config.validate()
        if config.num_classes is None:
            raise ValueError("EncoderClassifier needs config.num_classes")
        if config.tie_embeddings:
            raise ValueError("tie_embeddings needs a vocabulary output; EncoderClassifier "
                             "predicts num_classes classes")
        rng = np.random.default_rng(config.seed)
        self.encoder = self.add("encoder", Encoder(config, rng))
        self.head = self.add("head", Linear(config.width, config.num_classes,
                                            dtype=np.dtype(config.dtype), rng=rng,
                                            backend=config.backend))

    def forward(self, tokens: np.ndarray, lengths: np.ndarray | None = None) -> np.ndarray:
        """tokens : int (B, T), lengths : int (B,) optional -> logits (B, T, num_classes).

        With ``lengths``, key j of sequence b is attended only if j < lengths[b]; the logits
        at padded positions are still computed (exclude them from the loss).
        """
        mask = None if lengths is None else key_padding_mask(lengths, np.shape(tokens)[-1])
        return self.head(self.encoder(tokens, mask))

    def backward(self, dlogits: np.ndarray) -> None:
        """Adds into every parameter's gradient."""
        self.encoder.backward(self.head.backward(dlogits))


def _vocab_head(config: TransformerConfig, decoder: Decoder,
                rng: np.random.Generator) -> Linear | TiedOutput:
    """The output projection to the vocabulary: the decoder's token table reused, or a Linear."""
    if config.tie_embeddings:
        return TiedOutput(decoder.embed.tokens, backend=config.backend)
    return Linear(config.width, config.vocab, dtype=np.dtype(config.dtype), rng=rng,
                  backend=config.backend)


class DecoderLM(Module):
    """Causal decoder-only language model: tokens (B, T) -> next-token logits (B, T, V).

    Parameters
    ----------
    config : TransformerConfig
        With ``tie_embeddings`` the head is ``x @ table^T`` on the decoder's token table (no
        bias); otherwise a ``Linear(C, V)`` with bias, as in the chapter's character model.

    Examples
    --------
    The chapter's character model has 132,488 parameters:

    >>> cfg = TransformerConfig(vocab=104, width=84, heads=4, layers=2, ffn_width=168,
    ...                         max_len=100, activation="relu", embed_scale=True)
    >>> DecoderLM(cfg).num_parameters()
    132488
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config.validate()
        rng = np.random.default_rng(config.seed)
        self.decoder = self.add("decoder", Decoder(config, rng))
        self.head = self.add("head", _vocab_head(config, self.decoder, rng))

    def forward(self, tokens: np.ndarray) -> np.ndarray:
        """tokens : int (B, T) -> logits (B, T, V); position t sees tokens 0 .. t only."""
        return self.head(self.decoder(tokens))

    def backward(self, dlogits: np.ndarray) -> None:
        """Adds into every parameter's gradient (the tied table gets both of its shares)."""
        self.decoder.backward(self.head.backward(dlogits))

    # --- incremental decoding (inference only, no backward) ---
    def new_caches(self, batch: int) -> list[KVCache]:
        """Empty key/value caches, one per block, for ``batch`` sequences of up to max_len."""
        return self.decoder.new_caches(batch)

    def forward_cached(self, tokens: np.ndarray, caches: list[KVCache]) -> np.ndarray:
        """Logits (B, T_new, V) of T_new new tokens (B, T_new) that follow those in ``caches``.

        Prefill with the prompt (T_new = T), then feed one token per step (T_new = 1). The
        logits equal the last T_new rows of ``forward`` over the whole sequence (eval mode).
        See ``numpy_transformer.generate``.
        """
        return self.head(self.decoder.forward_cached(tokens, caches))


class EncoderDecoder(Module):
    """Encoder over the source, decoder over the target that cross-attends the encoder.

    Parameters
    ----------
    config : TransformerConfig
        Source and target share ``vocab``; each has its own token table. With
        ``tie_embeddings`` the head reuses the decoder's table.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config.validate()
        rng = np.random.default_rng(config.seed)
        self.encoder = self.add("encoder", Encoder(config, rng))
        self.decoder = self.add("decoder", Decoder(config, rng, cross=True))
        self.head = self.add("head", _vocab_head(config, self.decoder, rng))

    def forward(self, src: np.ndarray, tgt: np.ndarray,
                src_lengths: np.ndarray | None = None) -> np.ndarray:
        """src : int (B, T_s), tgt : int (B, T_t), src_lengths : int (B,) -> logits (B, T_t, V).

        ``src_lengths`` masks padded source positions in the encoder's self-attention and in
        every cross-attention.
        """
        src_mask = None if src_lengths is None else key_padding_mask(src_lengths,
                                                                     np.shape(src)[-1])
        memory = self.encoder(src, src_mask)  # (B, T_s, C)
        return self.head(self.decoder(tgt, memory, src_mask))  # (B, T_t, V)

    def backward(self, dlogits: np.ndarray) -> None:
        """Adds into every parameter's gradient; the memory's gradient flows into the encoder."""
        dmemory = self.decoder.backward(self.head.backward(dlogits))
        self.encoder.backward(dmemory)

    # --- incremental decoding (inference only, no backward) ---
    def new_caches(self, batch: int) -> list[KVCache]:
        """Empty self-attention caches of the decoder, one per block."""
        return self.decoder.new_caches(batch)

    def encode_memory(self, src: np.ndarray, src_lengths: np.ndarray | None = None):
        """Run the encoder once; returns ``(memory_kv, memory_mask)`` for :meth:`forward_cached`.

        ``memory_kv`` holds every decoder block's cross-attention keys and values
        (B, H, T_s, D); ``memory_mask`` (B, 1, 1, T_s) hides padded source positions, or None.
        """
        src_mask = None if src_lengths is None else key_padding_mask(src_lengths,
                                                                     np.shape(src)[-1])
        memory = self.encoder(src, src_mask)  # (B, T_s, C)
        return self.decoder.memory_kv(memory), src_mask

    def forward_cached(self, tgt: np.ndarray, caches: list[KVCache], memory_kv,
                       memory_mask: np.ndarray | None = None) -> np.ndarray:
        """Logits (B, T_new, V) of the target tokens (B, T_new) that follow those in ``caches``.

        Equals the last T_new rows of ``forward(src, tgt_so_far, src_lengths)`` (eval mode).
        """
        return self.head(self.decoder.forward_cached(tgt, caches, memory_kv, memory_mask))

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

from typing import TYPE_CHECKING

import numpy as np

from .._checks import check_ids
from ..backend import get_backend
from ..config import TransformerConfig
from ..functional.masks import key_padding_mask
from .blocks import DecoderBlock, EncoderBlock
from .layers import Dropout, Embedding, Linear, TiedOutput, make_norm
from .module import Module, ModuleList
from .positional import LearnedPositions, SinusoidalPositions

if TYPE_CHECKING:
    from .decoding import DecoderCache


def _block_options(config: TransformerConfig, rng: np.random.Generator) -> dict:
    """The keyword arguments every block of a model shares (the backend: its namespace)."""
    return dict(kv_heads=config.kv_heads, norm=config.norm, norm_eps=config.norm_eps,
                activation=config.activation, norm_first=config.norm_first,
                dropout=config.dropout, attn_dropout=config.attn_dropout,
                rope=config.positions == "rope", alibi=config.positions == "alibi",
                max_len=config.max_len, bias=config.bias,
                backend=get_backend(config.backend), dtype=np.dtype(config.dtype), rng=rng)


class Embeddings(Module):
    """Token ids to the residual stream: lookup, optional sqrt(C) scale, positions, dropout.

    Notes
    -----
    (1) e = tokens[ids]   (2) e = e * sqrt(C) (if ``embed_scale``)
    (3) e = e + PE[start:start + T]   (sinusoidal or learned positions)   (4) x = drop(e)

    (1)-(3) are the backend's ``embeddings_forward`` (``functional/embedding.py``), and the
    token table's gradient takes the scale (2) on the way back. ``start`` is 0
    except in cached decoding, where the new tokens follow ``start`` earlier ones.
    """

    def __init__(self, config: TransformerConfig, rng: np.random.Generator) -> None:
        super().__init__()
        dtype, width = np.dtype(config.dtype), config.width
        self.ops = get_backend(config.backend)
        self.vocab, self.width = config.vocab, width
        std = 1.0 / np.sqrt(width) if config.embed_std is None else config.embed_std
        self.tokens = self.add("tokens", Embedding(config.vocab, width, std, dtype=dtype, rng=rng,
                                                   backend=self.ops))
        self.scale = float(np.sqrt(width)) if config.embed_scale else 1.0
        self.positions = None  # rope, alibi and none add nothing here
        if config.positions == "sinusoidal":
            self.positions = self.add("positions",
                                      SinusoidalPositions(config.max_len, width, dtype=dtype))
        elif config.positions == "learned":
            self.positions = self.add("positions", LearnedPositions(config.max_len, width,
                                                                    dtype=dtype, rng=rng))
        self.drop = self.add("drop", Dropout(config.dropout, seed=int(rng.integers(2**32))))
        self.cache = None

    def forward(self, tokens: np.ndarray, start: int = 0) -> np.ndarray:
        """tokens : int (B, T) at positions start .. start + T - 1 -> x : (B, T, C)."""
        tokens = check_ids("tokens", tokens, self.vocab)
        if tokens.ndim != 2 or tokens.size == 0:
            raise ValueError(f"tokens must have shape (B, T) with B, T >= 1, got {tokens.shape}")
        rows = None if self.positions is None else self.positions.addend(tokens.shape[1], start)
        x, self.cache = self.ops.embeddings_forward(tokens, self.tokens.params["table"],
                                                    self.scale, rows,
                                                    keep=self.keeps_cache)  # (1)-(3)
        return self.expect_grad_like(self.drop(x))  # (4)

    def backward(self, dx: np.ndarray) -> None:
        """Adds into the token (and learned position) tables; token ids have no gradient."""
        self.check_grad("dx", dx)
        dx = self.drop.backward(dx)  # (4)
        if self.positions is not None:
            dx = self.positions.backward(dx)  # (3)
        self.tokens.add_grad("table", self.ops.embeddings_backward(dx, self.cache,
                                                                   self.scale))  # (2), (1)


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
            self.final_norm = self.add("final_norm", make_norm(
                c.norm, c.width, c.norm_eps, dtype=np.dtype(c.dtype),
                backend=get_backend(c.backend)))

    def forward(self, tokens: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        x = self.embed(tokens)  # (B, T, C)
        for block in self.blocks:
            x = block(x, mask)
        return self.expect_grad_like(x if self.final_norm is None else self.final_norm(x))

    def backward(self, dout: np.ndarray) -> None:
        self.check_grad("dout", dout)
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
            self.final_norm = self.add("final_norm", make_norm(
                c.norm, c.width, c.norm_eps, dtype=np.dtype(c.dtype),
                backend=get_backend(c.backend)))

    def forward(self, tokens: np.ndarray, memory: np.ndarray | None = None,
                memory_mask: np.ndarray | None = None,
                cache: DecoderCache | None = None) -> np.ndarray:
        start = 0 if cache is None else cache.length  # cached decoding: positions so far
        x = self.embed(tokens, start)  # (B, T, C)
        for i, block in enumerate(self.blocks):
            x = block(x, memory, memory_mask, kv_cache=None if cache is None else cache.blocks[i])
        return self.expect_grad_like(x if self.final_norm is None else self.final_norm(x))

    def backward(self, dout: np.ndarray) -> np.ndarray | None:
        self.check_grad("dout", dout)
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
        self.ops = get_backend(config.backend)
        self.encoder = self.add("encoder", Encoder(config, rng))
        self.head = self.add("head", Linear(config.width, config.num_classes, config.bias,
                                            dtype=np.dtype(config.dtype), rng=rng,
                                            backend=self.ops))

    def forward(self, tokens: np.ndarray, lengths: np.ndarray | None = None) -> np.ndarray:
        """tokens : int (B, T), lengths : int (B,) optional -> logits (B, T, num_classes).

        With ``lengths``, key j of sequence b is attended only if j < lengths[b]; the logits
        at padded positions are still computed (exclude them from the loss).
        """
        mask = None if lengths is None else key_padding_mask(lengths, np.shape(tokens)[-1])
        return self.expect_grad_like(self.head(self.encoder(tokens, mask)))

    def backward(self, dlogits: np.ndarray) -> None:
        """Adds into every parameter's gradient."""
        self.check_grad("dlogits", dlogits)
        self.encoder.backward(self.head.backward(dlogits))

    def loss_and_backward(self, tokens: np.ndarray, lengths: np.ndarray | None = None, *,
                          targets: np.ndarray, mask: np.ndarray | None = None) -> float:
        """The mean cross-entropy of the logits against ``targets``, every gradient added; see
        :meth:`DecoderLM.loss_and_backward`."""
        padding = None if lengths is None else key_padding_mask(lengths, np.shape(tokens)[-1])
        with self.ops.forward_and_backward(self):
            loss = self.head.loss_forward(self.encoder(tokens, padding), targets, mask)
            self.encoder.backward(self.head.loss_backward())
        return loss


def _vocab_head(config: TransformerConfig, decoder: Decoder,
                rng: np.random.Generator) -> Linear | TiedOutput:
    """The output projection to the vocabulary: the decoder's token table reused, or a Linear."""
    if config.tie_embeddings:
        return TiedOutput(decoder.embed.tokens)
    return Linear(config.width, config.vocab, config.bias, dtype=np.dtype(config.dtype),
                  rng=rng, backend=get_backend(config.backend))


class DecoderLM(Module):
    """Causal decoder-only language model: tokens (B, T) -> next-token logits (B, T, V).

    Parameters
    ----------
    config : TransformerConfig
        With ``tie_embeddings`` the head is ``x @ table^T`` on the decoder's token table (no
        bias); otherwise a ``Linear(C, V)``, with a bias unless ``config.bias`` is False (the
        chapter's character model has one).

    Examples
    --------
    The chapter's character model has 132,488 parameters:

    >>> cfg = TransformerConfig(vocab=104, width=84, heads=4, layers=2, ffn_width=168,
    ...                         max_len=100, activation="relu", embed_scale=True)
    >>> DecoderLM(cfg).num_parameters()
    132488
    """

    decodes = "self"  # cached decoding (nn/decoding.py): self-attention caches only

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config.validate()
        rng = np.random.default_rng(config.seed)
        self.ops = get_backend(config.backend)
        self.decoder = self.add("decoder", Decoder(config, rng))
        self.head = self.add("head", _vocab_head(config, self.decoder, rng))

    def forward(self, tokens: np.ndarray, cache: DecoderCache | None = None) -> np.ndarray:
        """tokens : int (B, T) -> logits (B, T, V); position t sees tokens 0 .. t only.

        With ``cache`` (``nn/decoding.py``, inference only), ``tokens`` are the positions that
        follow the cached ones, which they also see; the logits equal the last T rows of a
        forward over the whole sequence (eval mode).
        """
        return self.expect_grad_like(self.head(self.decoder(tokens, cache=cache)))

    def backward(self, dlogits: np.ndarray) -> None:
        """Adds into every parameter's gradient (the tied table gets both of its shares)."""
        self.check_grad("dlogits", dlogits)
        self.decoder.backward(self.head.backward(dlogits))

    def loss_and_backward(self, tokens: np.ndarray, *, targets: np.ndarray,
                          mask: np.ndarray | None = None) -> float:
        """Forward, loss and backward in one call: what a training step needs of the model.

        Parameters
        ----------
        tokens : int (B, T)
        targets : int (B, T)
            The next token of each position.
        mask : bool (B, T), optional
            ``True`` = this position's target is counted.

        Returns
        -------
        float
            The mean cross-entropy of the next-token logits, as ``cross_entropy_forward`` of
            :meth:`forward`'s logits gives it. Every parameter's gradient has been added into.

        Notes
        -----
        The head and the loss are one operation (``linear_cross_entropy_forward``): the
        (B, T, V) logits are not returned, and on the numba backend never made whole
        (``kernels/head_loss.py``). The forward and the backward run inside the backend's
        ``forward_and_backward`` (``numpy_transformer/backend.py``): nothing writes into a
        weight in between, so the numba kernels' caches keep the weights uncopied, and give
        them back when the block ends.
        """
        with self.ops.forward_and_backward(self):
            loss = self.head.loss_forward(self.decoder(tokens), targets, mask)
            self.decoder.backward(self.head.loss_backward())
        return loss


class EncoderDecoder(Module):
    """Encoder over the source, decoder over the target that cross-attends the encoder.

    Parameters
    ----------
    config : TransformerConfig
        Source and target share ``vocab``; each has its own token table. With
        ``tie_embeddings`` the head reuses the decoder's table.
    """

    decodes = "cross"  # cached decoding: self-attention caches and the encoded source

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config.validate()
        rng = np.random.default_rng(config.seed)
        self.ops = get_backend(config.backend)
        self.encoder = self.add("encoder", Encoder(config, rng))
        self.decoder = self.add("decoder", Decoder(config, rng, cross=True))
        self.head = self.add("head", _vocab_head(config, self.decoder, rng))

    def forward(self, src: np.ndarray, tgt: np.ndarray, src_lengths: np.ndarray | None = None,
                cache: DecoderCache | None = None) -> np.ndarray:
        """src : int (B, T_s), tgt : int (B, T_t), src_lengths : int (B,) -> logits (B, T_t, V).

        ``src_lengths`` masks padded source positions in the encoder's self-attention and in
        every cross-attention. With ``cache`` (``nn/decoding.py``, inference only), ``tgt``
        holds the target positions that follow the cached ones; the source is encoded on the
        first call only, and its keys and values kept.
        """
        if cache is not None and cache.memory is not None:  # encoded on an earlier call
            memory, src_mask = cache.memory, cache.memory_mask
        else:
            src_mask = None if src_lengths is None else key_padding_mask(src_lengths,
                                                                         np.shape(src)[-1])
            memory = self.encoder(src, src_mask)  # (B, T_s, C)
            if cache is not None:
                cache.memory, cache.memory_mask = memory, src_mask
        logits = self.head(self.decoder(tgt, memory, src_mask, cache=cache))  # (B, T_t, V)
        return self.expect_grad_like(logits)

    def backward(self, dlogits: np.ndarray) -> None:
        """Adds into every parameter's gradient; the memory's gradient flows into the encoder."""
        self.check_grad("dlogits", dlogits)
        dmemory = self.decoder.backward(self.head.backward(dlogits))
        self.encoder.backward(dmemory)

    def loss_and_backward(self, src: np.ndarray, tgt: np.ndarray,
                          src_lengths: np.ndarray | None = None, *, targets: np.ndarray,
                          mask: np.ndarray | None = None) -> float:
        """The mean cross-entropy of the target logits against ``targets``, every gradient
        added; see :meth:`DecoderLM.loss_and_backward`."""
        src_mask = None if src_lengths is None else key_padding_mask(src_lengths,
                                                                     np.shape(src)[-1])
        with self.ops.forward_and_backward(self):
            memory = self.encoder(src, src_mask)  # (B, T_s, C)
            loss = self.head.loss_forward(self.decoder(tgt, memory, src_mask), targets, mask)
            self.encoder.backward(self.decoder.backward(self.head.loss_backward()))
        return loss

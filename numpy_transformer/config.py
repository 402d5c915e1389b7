"""``TransformerConfig``, ``LSTMConfig`` and the names of every choice they offer: the one place
they are defined.

The lists below are the registries of the library: the modules, the backend seam, the command
line, the gradient-check tables, the PyTorch twins and the tests all iterate over them; none
keeps a list of its own. Adding a choice starts here (``docs/architecture.md``, "Where a new
piece goes", has the recipes; ``tests/test_registry.py`` fails while a registered name lacks
one of its parts).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# The feed-forward network takes the pair ``<name>_forward`` / ``<name>_backward`` of its
# backend (``functional/activations.py``, a kernel where one is written) and the PyTorch twin
# the function ``<name>`` of ``torch_twins/ops.py``: an elementwise activation is those two
# functions and its name here.
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "swiglu")
# The gated ones: their pair takes two inputs, ``<name>_forward(gate, up)``, and the feed-forward
# network gives them a third matrix, ``gate`` (Shazeer 2020).
GATED_ACTIVATIONS = ("swiglu",)
ELEMENTWISE_ACTIVATIONS = tuple(a for a in ACTIVATIONS if a not in GATED_ACTIVATIONS)
# Each norm, and the stem of its functional pair (``layer_norm_forward`` / ``_backward``); its
# module is chosen in ``nn/layers.py``'s ``make_norm``, its twin in ``torch_twins/modules.py``
NORM_PAIRS = {"layernorm": "layer_norm", "rmsnorm": "rms_norm"}
NORMS = tuple(NORM_PAIRS)
# Where each acts is the scheme itself (a table added to the tokens, a rotation of queries and
# keys, a bias of the scores): ``nn/models.py`` and ``nn/attention.py`` wire them
POSITIONS = ("sinusoidal", "learned", "rope", "alibi", "none")
DTYPES = ("float32", "float64")
BACKENDS = ("numpy", "numba")  # numpy_transformer.backend builds each one's operations
# The modules of numpy_transformer/kernels whose ``__all__`` the "numba" backend lays over the
# references (kernels under their references' names); every other file of that folder is a
# helper the kernels compile into themselves (``kernels/_jit.py``)
KERNEL_MODULES = ("activations", "adam", "attention", "embedding", "feedforward", "head_loss",
                  "linear", "lstm", "norms", "softmax")
EXPORT_FORMATS = ("safetensors", "hf")  # what numpy_transformer.export writes: PyTorch, HF
# a language model's tokens: characters, or a byte-level BPE (numpy_transformer/bpe.py) of at
# least the 256 bytes and one merge
TOKENIZERS = ("char", "bpe")
BPE_MIN_VOCAB = 257
# the training-step benchmarks' configurations (numpy_transformer/bench/configs.py)
BENCH_CONFIGS = ("chapter", "small", "wide", "long", "gpt2", "lstm")
# Limits the "numba" backend to the kernels it names (numpy_transformer/backend.py)
KERNELS_VARIABLE = "NUMPY_TRANSFORMER_KERNELS"
DEFAULT_BACKEND = "numba"  # the fused kernels: training faster than PyTorch on a CPU; "numpy"
#   runs the readable references of numpy_transformer/functional everywhere instead


def _rope_shapes(width: int, heads: int) -> str:
    """The nearest head counts for ``width``, and widths for ``heads``, whose head width is
    even: what a refusal of RoPE's odd head width suggests instead."""
    near = sorted((h for h in range(1, width // 2 + 1) if width % h == 0 and width // h % 2 == 0),
                  key=lambda h: (abs(h - heads), -h))[:2]
    below = width - width % (2 * heads)
    widths = [w for w in (below, below + 2 * heads) if w > 0]
    return (f"use heads {' or '.join(map(str, sorted(near)))}, or width "
            f"{' or '.join(map(str, widths))}") if near else (
            f"use width {' or '.join(map(str, widths))}")


@dataclass
class TransformerConfig:
    """Hyperparameters of :class:`EncoderClassifier`, :class:`DecoderLM`, :class:`EncoderDecoder`.

    The defaults of the fields are the library's: float64, in which the gradients are checked,
    and GPT-2's GELU. The chapter's character model, which ``numpy-transformer train`` trains,
    is the preset :meth:`chapter`.
    """

    vocab: int  # V: token ids lie in [0, vocab)
    width: int  # C: the residual stream's width (d_model)
    heads: int  # H: must divide width; each head has width C / H
    layers: int  # blocks in each stack (the encoder-decoder has this many in both)
    ffn_width: int  # F: hidden width of the feed-forward network (4C is the classic choice)
    max_len: int  # longest sequence accepted; rows of the sinusoidal/learned/rope tables
    #   (ALiBi has no table: to test on longer inputs, load the weights into a larger max_len)
    norm: str = "layernorm"  # or "rmsnorm" (LLaMA); the original and GPT-2 use LayerNorm
    norm_eps: float | None = None  # every norm's epsilon; None: LayerNorm's 1e-5 (PyTorch's,
    #   GPT-2's), RMSNorm's the dtype's machine epsilon (torch.nn.RMSNorm(eps=None)); an
    #   imported model takes its checkpoint's (LLaMA's are 1e-5 or 1e-6)
    activation: str = "gelu"  # exact GELU as BERT/GPT-2; "relu" (Vaswani), ...: ACTIVATIONS
    positions: str = "sinusoidal"  # Vaswani's fixed table; "learned", "rope", "alibi", "none"
    norm_first: bool = True  # pre-LN: trains without warmup (Xiong et al.); False = post-LN
    dropout: float = 0.0  # off: makes runs exactly repeatable, as in the chapter's experiment
    attn_dropout: float = 0.0  # dropout on the attention weights (GPT-2's attn_pdrop); off
    embed_scale: bool = False  # multiply token embeddings by sqrt(C) (Vaswani; the char model)
    embed_std: float | None = None  # token embedding init std; None = 1/sqrt(C), the chapter's
    #   choice: with embed_scale the scaled coordinates then start at unit size, like the sines
    tie_embeddings: bool = False  # decoder output projection reuses the token embedding table
    bias: bool = True  # every linear layer adds a bias (Vaswani, GPT-2); False drops them all,
    #   in attention, feed-forward network and head, as LLaMA does (the norms keep theirs)
    kv_heads: int | None = None  # H_kv, heads of the keys and values; None = heads: multi-head
    #   attention, as the original and GPT-2. Fewer, dividing heads, is grouped-query attention
    #   (Ainslie et al. 2023; LLaMA 2 70B, LLaMA 3, Mistral): G = H / H_kv query heads share
    #   each kv head, so wk, wv and a decoding cache shrink by G
    num_classes: int | None = None  # classes per position of EncoderClassifier; unused otherwise
    backend: str = DEFAULT_BACKEND  # which implementation of the operations runs: see BACKENDS
    dtype: str = "float64"  # float64 for gradient checks; float32 for faster training
    seed: int = 0  # one seed fixes every initial tensor and every dropout mask

    @classmethod
    def chapter(cls, vocab: int = 104, **changes: object) -> TransformerConfig:
        """The chapter's character model: the defaults of ``numpy-transformer train``
        (``runs/options.py`` reads them here), 132,488 parameters at the chapter's vocabulary
        of 104 characters.

        Parameters
        ----------
        vocab : int, default 104
            The characters of the text it models (the chapter's corpus has 104).
        **changes
            Fields to change, as ``TransformerConfig.chapter(vocab, dtype="float64")``.
        """
        return replace(cls(
            vocab=vocab,
            width=84,  # C = 4 heads of 21: with the FFN below, the model has 0.55% fewer
            #   parameters than the LSTM it is compared with (133,224), so size explains no
            #   difference between them
            heads=4,
            layers=2,  # two pre-LN blocks (norm_first's default)
            ffn_width=168,  # F = 2C, where 4C is the classic choice: the size above
            max_len=100,  # T: a window of 100 characters, the LSTM's context
            activation="relu",  # Vaswani et al.'s feed-forward network, the chapter's
            embed_scale=True,  # E[token] * sqrt(C) with embed_std's 1/sqrt(C): the token's
            #   coordinates start on the scale of the sinusoidal table's
            dtype="float32",  # trains faster than float64, which the checks use
        ), **changes)

    def validate(self) -> TransformerConfig:
        """Raise ``ValueError`` naming the first bad value; returns ``self`` when all is well.

        Sizes whose weights cannot fit in the memory available are bad values too
        (``numpy_transformer.memory``): ``max_len=10**12`` is refused here, not while its
        tables are being filled.
        """
        # imported here, not above: the command line reads the names of this module before
        # it imports NumPy (its --help answers without it), and _checks needs NumPy
        from ._checks import (
            check_choice,
            check_even,
            check_kv_heads,
            check_positive,
            check_seed,
        )
        from .memory import check_config_fits

        for name in ("vocab", "width", "heads", "layers", "ffn_width", "max_len"):
            check_positive(name, getattr(self, name), integer=True)
        if self.width % self.heads:
            raise ValueError(f"heads={self.heads} does not divide width={self.width}")
        check_kv_heads(self.heads, self.kv_heads)
        for name, allowed in (("norm", NORMS), ("activation", ACTIVATIONS),
                              ("positions", POSITIONS), ("backend", BACKENDS),
                              ("dtype", DTYPES)):
            check_choice(name, getattr(self, name), allowed)
        if self.positions == "sinusoidal":
            check_even("the sinusoidal table", "width", self.width)
        if self.positions == "rope" and (self.width // self.heads) % 2:
            raise ValueError(f"rope needs an even head width (width / heads), got "
                             f"{self.width} / {self.heads} = {self.width // self.heads}: "
                             f"{_rope_shapes(self.width, self.heads)}")
        for name in ("dropout", "attn_dropout"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0.0 <= value < 1.0):
                raise ValueError(f"{name} must lie in [0, 1), got {value!r}")
        for name in ("embed_std", "norm_eps"):
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name))
        if self.num_classes is not None:
            check_positive("num_classes", self.num_classes, integer=True)
        if not isinstance(self.bias, bool):
            raise ValueError(f"bias must be True or False, got {self.bias!r}")
        check_seed(self.seed)
        check_config_fits(self)  # a size that cannot fit is refused before anything is made
        return self


@dataclass
class LSTMConfig:
    """Hyperparameters of :class:`LSTMLM`: token embedding, stacked LSTM, linear head.

    It offers the trainer, checkpoints and generation what ``TransformerConfig`` does
    (``vocab``, ``max_len``, ``backend``, ``dtype``, ``seed``). An LSTM has no position table:
    ``max_len`` is the length of the training windows (and of the fixed windows of the
    held-out loss), not a limit on what the model can read.

    The LSTM of the chapter's comparison, the size of its Transformer, is the preset
    :meth:`chapter`.
    """

    vocab: int  # V: token ids lie in [0, vocab)
    hidden: int  # H: width of the hidden and cell states; the gates are 4H wide
    max_len: int  # T of the training windows (the chapter's context of 100 characters)
    embed: int | None = None  # E: width of the token embedding; None = hidden
    layers: int = 1  # stacked LSTM layers; layer k > 0 reads layer k - 1's hidden states
    #   (every weight and both biases start U(-1/sqrt(H), 1/sqrt(H)), torch.nn.LSTM's init,
    #   the forget gate's bias included: the chapter adds no forget-gate offset)
    embed_std: float = 1.0  # token embedding init N(0, std^2): torch.nn.Embedding's default
    backend: str = DEFAULT_BACKEND  # which implementation of the operations runs: see BACKENDS
    dtype: str = "float64"  # float64 for gradient checks; float32 for faster training
    seed: int = 0  # one seed fixes every initial tensor

    @classmethod
    def chapter(cls, vocab: int = 104, **changes: object) -> LSTMConfig:
        """The LSTM the chapter's Transformer is compared with (``experiments/charlm.py``), and
        the defaults of ``numpy-transformer train --model lstm``: 132,336 parameters at the
        chapter's vocabulary of 104, the Transformer's :meth:`TransformerConfig.chapter` less
        0.11% (the chapter's own LSTM had 133,224, in other shapes).

        Parameters
        ----------
        vocab : int, default 104
            The characters of the text it models.
        **changes
            Fields to change, as ``LSTMConfig.chapter(vocab, backend="numpy")``.
        """
        return replace(cls(
            vocab=vocab,
            hidden=128,  # H: with the embedding below, about the Transformer's size
            max_len=100,  # T: the Transformer's window of 100 characters
            embed=85,
            layers=1,
            dtype="float32",  # trains faster than float64, which the checks use
        ), **changes)

    @property
    def embed_width(self) -> int:
        """E, the embedding width actually used (``embed``, or ``hidden`` when None)."""
        return self.hidden if self.embed is None else self.embed

    def validate(self) -> LSTMConfig:
        """Raise ``ValueError`` naming the first bad value; returns ``self`` when all is well.

        As for ``TransformerConfig``, sizes whose weights cannot fit in the memory available
        are bad values (``numpy_transformer.memory``).
        """
        from ._checks import check_choice, check_positive, check_seed  # as in TransformerConfig
        from .memory import LSTM_KIND, check_config_fits

        for name in ("vocab", "hidden", "max_len", "layers"):
            check_positive(name, getattr(self, name), integer=True)
        if self.embed is not None:
            check_positive("embed", self.embed, integer=True)
        check_positive("embed_std", self.embed_std)
        for name, allowed in (("backend", BACKENDS), ("dtype", DTYPES)):
            check_choice(name, getattr(self, name), allowed)
        check_seed(self.seed)
        check_config_fits(self, (LSTM_KIND,))  # refused before anything is made
        return self

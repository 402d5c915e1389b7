"""``TransformerConfig``: every architectural choice of the three models, in one place."""

from __future__ import annotations

from dataclasses import dataclass

from .._checks import check_positive
from .attention import BACKENDS
from .layers import ACTIVATION_NAMES, NORM_NAMES

POSITION_NAMES = ("sinusoidal", "learned", "rope", "alibi", "none")
DTYPE_NAMES = ("float32", "float64")


@dataclass
class TransformerConfig:
    """Hyperparameters of :class:`EncoderClassifier`, :class:`DecoderLM`, :class:`EncoderDecoder`.

    The chapter's character model is ``TransformerConfig(vocab=104, width=84, heads=4,
    layers=2, ffn_width=168, max_len=100, activation="relu", embed_scale=True)``.
    """

    vocab: int  # V: token ids lie in [0, vocab)
    width: int  # C: the residual stream's width (d_model)
    heads: int  # H: must divide width; each head has width C / H
    layers: int  # blocks in each stack (the encoder-decoder has this many in both)
    ffn_width: int  # F: hidden width of the feed-forward network (4C is the classic choice)
    max_len: int  # longest sequence accepted; rows of the sinusoidal/learned/rope tables
    #   (ALiBi has no table: to test on longer inputs, load the weights into a larger max_len)
    norm: str = "layernorm"  # or "rmsnorm" (LLaMA); the original and GPT-2 use LayerNorm
    activation: str = "gelu"  # exact GELU as BERT/GPT-2; "relu" (Vaswani), "gelu_tanh", "swiglu"
    positions: str = "sinusoidal"  # Vaswani's fixed table; "learned", "rope", "alibi", "none"
    norm_first: bool = True  # pre-LN: trains without warmup (Xiong et al.); False = post-LN
    dropout: float = 0.0  # off: makes runs exactly repeatable, as in the chapter's experiment
    embed_scale: bool = False  # multiply token embeddings by sqrt(C) (Vaswani; the char model)
    embed_std: float | None = None  # token embedding init std; None = 1/sqrt(C), the chapter's
    #   choice: with embed_scale the scaled coordinates then start at unit size, like the sines
    tie_embeddings: bool = False  # decoder output projection reuses the token embedding table
    num_classes: int | None = None  # classes per position of EncoderClassifier; unused otherwise
    backend: str = "numba"  # "numpy": the readable references everywhere; "numba": the fused
    #   kernels of numpy_transformer/kernels (attention, norms, ReLU/GELU, embedding backward,
    #   and, in Trainer, the cross-entropy), each checked against its reference
    dtype: str = "float64"  # float64 for gradient checks; float32 for faster training
    seed: int = 0  # one seed fixes every initial tensor and every dropout mask

    def validate(self) -> TransformerConfig:
        """Raise ``ValueError`` naming the first bad value; returns ``self`` when all is well."""
        for name in ("vocab", "width", "heads", "layers", "ffn_width", "max_len"):
            check_positive(name, getattr(self, name), integer=True)
        if self.width % self.heads:
            raise ValueError(f"heads={self.heads} does not divide width={self.width}")
        for name, value, allowed in (("norm", self.norm, NORM_NAMES),
                                     ("activation", self.activation, ACTIVATION_NAMES),
                                     ("positions", self.positions, POSITION_NAMES),
                                     ("backend", self.backend, BACKENDS),
                                     ("dtype", self.dtype, DTYPE_NAMES)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if self.positions == "sinusoidal" and self.width % 2:
            raise ValueError(f"sinusoidal positions need an even width, got {self.width}")
        if self.positions == "rope" and (self.width // self.heads) % 2:
            raise ValueError(f"rope needs an even head width, got width {self.width} / "
                             f"heads {self.heads} = {self.width // self.heads}")
        if not (isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0):
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout!r}")
        if self.embed_std is not None:
            check_positive("embed_std", self.embed_std)
        if self.num_classes is not None:
            check_positive("num_classes", self.num_classes, integer=True)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        return self

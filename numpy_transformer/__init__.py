"""numpy_transformer: a Transformer in NumPy with a hand-written backward for every forward.

``numpy_transformer.functional`` holds the math as pure forward/backward pairs,
``numpy_transformer.nn`` the modules and models built on it, and
``numpy_transformer.gradcheck`` the finite-difference checks a user can run on any of them.
"""

from . import functional, gradcheck

__version__ = "0.1.0"

__all__ = ["functional", "gradcheck"]

# --- nn exports (module layer) ---
from . import nn  # noqa: E402
from .nn import (  # noqa: E402
    LSTMLM,
    Decoder,
    DecoderBlock,
    DecoderLM,
    Dropout,
    Embedding,
    Embeddings,
    Encoder,
    EncoderBlock,
    EncoderClassifier,
    EncoderDecoder,
    FeedForward,
    LayerNorm,
    LearnedPositions,
    Linear,
    LSTMConfig,
    Module,
    ModuleList,
    MultiHeadAttention,
    RMSNorm,
    SinusoidalPositions,
    TiedOutput,
    TransformerConfig,
)

__all__ += ["nn", "Decoder", "DecoderBlock", "DecoderLM", "Dropout", "Embedding", "Embeddings",
            "Encoder", "EncoderBlock", "EncoderClassifier", "EncoderDecoder", "FeedForward",
            "LayerNorm", "LearnedPositions", "Linear", "LSTMConfig", "LSTMLM", "Module",
            "ModuleList",
            "MultiHeadAttention", "RMSNorm", "SinusoidalPositions", "TiedOutput",
            "TransformerConfig"]
# --- end nn exports ---

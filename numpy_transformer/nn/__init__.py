"""Modules: parameters and gradients in dicts with the same keys, one cache, forward/backward."""

from ..config import LSTMConfig, TransformerConfig
from .attention import MultiHeadAttention
from .blocks import DecoderBlock, EncoderBlock
from .layers import (
    Dropout,
    Embedding,
    FeedForward,
    LayerNorm,
    Linear,
    RMSNorm,
    TiedOutput,
)
from .lstm import LSTM, LSTMLM, LSTMState, new_state
from .models import Decoder, DecoderLM, Embeddings, Encoder, EncoderClassifier, EncoderDecoder
from .module import Module, ModuleList
from .positional import LearnedPositions, SinusoidalPositions

__all__ = [
    "Decoder",
    "DecoderBlock",
    "DecoderLM",
    "Dropout",
    "Embedding",
    "Embeddings",
    "Encoder",
    "EncoderBlock",
    "EncoderClassifier",
    "EncoderDecoder",
    "FeedForward",
    "LayerNorm",
    "LearnedPositions",
    "Linear",
    "LSTM",
    "LSTMConfig",
    "LSTMLM",
    "LSTMState",
    "Module",
    "ModuleList",
    "MultiHeadAttention",
    "RMSNorm",
    "SinusoidalPositions",
    "TiedOutput",
    "TransformerConfig",
    "new_state",
]

"""Modules: parameters and gradients in dicts with the same keys, one cache, forward/backward."""

from ..config import TransformerConfig
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
    "Module",
    "ModuleList",
    "MultiHeadAttention",
    "RMSNorm",
    "SinusoidalPositions",
    "TiedOutput",
    "TransformerConfig",
]

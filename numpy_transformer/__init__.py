"""numpy_transformer: a Transformer in NumPy with a hand-written backward for every forward.

``numpy_transformer.functional`` holds the math as pure forward/backward pairs,
``numpy_transformer.nn`` the modules and models built on it, and
``numpy_transformer.gradcheck`` the finite-difference checks a user can run on any of them;
``numpy_transformer.load_run(folder)`` brings a run of ``numpy-transformer train`` back.
``docs/architecture.md`` shows how the pieces fit.

The submodules load when first used (``numpy_transformer.nn``, ``from numpy_transformer import
DecoderLM``), so that importing the package, or running the command line's ``--help``,
costs no NumPy import.
"""

from __future__ import annotations

import importlib

from ._version import __version__

_SUBMODULES = ("functional", "gradcheck", "nn")
_NN_EXPORTS = ("Decoder", "DecoderBlock", "DecoderLM", "Dropout", "Embedding", "Embeddings",
               "Encoder", "EncoderBlock", "EncoderClassifier", "EncoderDecoder", "FeedForward",
               "LayerNorm", "LearnedPositions", "Linear", "LSTMConfig", "LSTMLM", "Module",
               "ModuleList", "MultiHeadAttention", "RMSNorm", "SinusoidalPositions",
               "TiedOutput", "TransformerConfig")

__all__ = ["__version__", "load_run", *_SUBMODULES, *_NN_EXPORTS]


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _NN_EXPORTS:
        return getattr(importlib.import_module(".nn", __name__), name)
    if name == "load_run":  # a run folder of numpy-transformer train, back in Python
        return importlib.import_module(".runs.stored", __name__).load_run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

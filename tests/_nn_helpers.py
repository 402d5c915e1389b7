"""Shared by the tests of ``nn``: judging a gradcheck report of a module; a small model of
each family."""

from __future__ import annotations

import numpy as np

from numpy_transformer import nn
from numpy_transformer.gradcheck import GradcheckReport

TOL = 1e-6


def assert_gradcheck(report: GradcheckReport, module, tol: float = TOL) -> None:
    """Every tensor within ``tol`` relative error; the known-zero ones (attention key biases
    without RoPE, see ``zero_gradient_names``) within ``ZERO_TOL`` absolute."""
    assert report.ok(tol), f"gradient check failed\n{report}"


def float_inputs(rng: np.random.Generator, *shapes) -> list[np.ndarray]:
    """Standard normal float64 arrays of the given shapes."""
    return [rng.standard_normal(shape) for shape in shapes]


# the model families that have a loss_and_backward
FAMILIES = ("DecoderLM", "EncoderDecoder", "EncoderClassifier", "LSTMLM")


def small_family(name: str, backend: str):
    """(model, inputs, targets, mask) of a small model of each family: 3 sequences of 8."""
    rng = np.random.default_rng(4)
    cfg = dict(vocab=13, width=16, heads=2, layers=1, ffn_width=32, max_len=8,
               backend=backend)
    tokens, targets = rng.integers(0, 13, size=(2, 3, 8))
    mask = rng.random((3, 8)) > 0.2
    lengths = np.array([8, 5, 3])
    if name == "EncoderClassifier":
        return (nn.EncoderClassifier(nn.TransformerConfig(**cfg, num_classes=5)),
                (tokens, lengths), targets % 5, mask)
    if name == "EncoderDecoder":
        return (nn.EncoderDecoder(nn.TransformerConfig(**cfg)),
                (tokens, rng.integers(0, 13, size=(3, 8)), lengths), targets, mask)
    if name == "LSTMLM":
        config = nn.LSTMConfig(vocab=13, hidden=8, embed=6, max_len=8, backend=backend)
        return nn.LSTMLM(config), (tokens,), targets, mask
    return nn.DecoderLM(nn.TransformerConfig(**cfg)), (tokens,), targets, mask

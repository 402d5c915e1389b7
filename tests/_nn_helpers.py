"""Shared by the ``test_nn_*`` files: judging a gradcheck report of a module."""

from __future__ import annotations

import numpy as np

from numpy_transformer.gradcheck import GradcheckReport

TOL = 1e-6


def assert_gradcheck(report: GradcheckReport, module, tol: float = TOL) -> None:
    """Every tensor within ``tol`` relative error; the known-zero ones (attention key biases
    without RoPE, see ``zero_gradient_names``) within ``ZERO_TOL`` absolute."""
    assert report.ok(tol), f"gradient check failed\n{report}"


def float_inputs(rng: np.random.Generator, *shapes) -> list[np.ndarray]:
    """Standard normal float64 arrays of the given shapes."""
    return [rng.standard_normal(shape) for shape in shapes]

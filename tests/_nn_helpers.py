"""Shared by the ``test_nn_*`` files: judging a gradcheck report of a module.

One tensor needs care. Without RoPE, the key bias ``bk`` of an attention has a true gradient
of exactly zero: it adds ``q . bk``, the same number, to every score of a query row, and
softmax ignores a constant shift. Both the analytic and the numeric gradient are then pure
rounding noise, and a *relative* error of noise against noise is about 1, whatever the
backward does. For those tensors we assert instead that both are zero to within noise
(``max abs err <= 1e-8``), which still fails if the backward produced a real value there.
"""

from __future__ import annotations

import numpy as np

from numpy_transformer.gradcheck import GradcheckReport
from numpy_transformer.nn import MultiHeadAttention

TOL = 1e-6
ZERO_TOL = 1e-8


def zero_gradient_names(module, prefix: str = "") -> set[str]:
    """Dotted names of the key biases of attentions without RoPE (true gradient exactly 0)."""
    names = set()
    if isinstance(module, MultiHeadAttention) and not module.rope:
        names.add(prefix + "bk")
    for name, child in module.children.items():
        names |= zero_gradient_names(child, prefix + name + ".")
    return names


def assert_gradcheck(report: GradcheckReport, module, tol: float = TOL) -> None:
    """Every tensor within ``tol`` relative error; the known-zero ones within ``ZERO_TOL``."""
    zero = zero_gradient_names(module)
    bad = [row for row in report.rows
           if not (row.max_abs <= ZERO_TOL if row.name in zero else row.max_rel <= tol)]
    assert not bad, f"gradient check failed for {[r.name for r in bad]}\n{report}"


def float_inputs(rng: np.random.Generator, *shapes) -> list[np.ndarray]:
    """Standard normal float64 arrays of the given shapes."""
    return [rng.standard_normal(shape) for shape in shapes]

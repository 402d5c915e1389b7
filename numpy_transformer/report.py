"""The gradient-check report: every op, module and model family against finite differences.

``numpy-transformer gradcheck`` prints it. It is the first thing to run when studying the
gradients: each table row is one named tensor, with the worst absolute and relative error of
the hand-written backward against central differences in float64.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from . import functional as F
from .gradcheck import GradcheckReport, check_direction, check_module, check_op


def _ce_forward(targets: np.ndarray) -> Callable:
    def forward(logits):
        loss, cache = F.cross_entropy_forward(logits, targets)
        return np.array(loss), cache
    return forward


def op_checks(rng: np.random.Generator) -> Iterator[Callable[[], GradcheckReport]]:
    """One thunk per functional op; each returns its report when called."""
    x = rng.normal(size=(2, 3, 6))
    w, b = rng.normal(size=6), rng.normal(size=6)
    q, k, v = (rng.normal(size=(2, 2, 4, 4)) for _ in range(3))
    ids = np.array([[0, 2, 2], [4, 2, 1]])
    targets = rng.integers(0, 6, size=(2, 3))
    targets[0, 0] = -100
    cos, sin = F.rope_tables(4, 4)
    padded = F.combine_masks(F.causal_mask(4), F.key_padding_mask(np.array([4, 2]), 4))
    yield lambda: check_op(F.linear_forward, F.linear_backward,
                           {"x": x.copy(), "w": rng.normal(size=(6, 5)), "b": rng.normal(size=5)},
                           title="linear")
    yield lambda: check_op(lambda t: F.embedding_forward(ids, t), F.embedding_backward,
                           {"table": rng.normal(size=(5, 4))}, title="embedding (repeated ids)")
    for name in ("relu", "gelu", "gelu_tanh", "silu"):
        fwd, bwd = getattr(F, f"{name}_forward"), getattr(F, f"{name}_backward")
        yield lambda fwd=fwd, bwd=bwd, name=name: check_op(fwd, bwd, {"x": x.copy()}, title=name)
    yield lambda: check_op(F.swiglu_forward, F.swiglu_backward,
                           {"gate": x.copy(), "up": rng.normal(size=x.shape)}, title="swiglu")
    yield lambda: check_op(F.softmax_forward, F.softmax_backward, {"x": x.copy()}, title="softmax")
    yield lambda: check_op(_ce_forward(targets), F.cross_entropy_backward, {"logits": x.copy()},
                           title="cross-entropy (one ignored target)")
    yield lambda: check_op(F.layer_norm_forward, F.layer_norm_backward,
                           {"x": x.copy(), "w": w, "b": b}, title="layer norm")
    yield lambda: check_op(F.rms_norm_forward, F.rms_norm_backward, {"x": x.copy(), "w": w},
                           title="rms norm")
    yield lambda: check_op(lambda x: (F.rope_forward(x, cos, sin), None),
                           lambda d, _: F.rope_backward(d, cos, sin), {"x": q.copy()},
                           title="rope")
    yield lambda: check_op(lambda q, k, v: F.sdpa_forward(q, k, v, padded, F.alibi_bias(2, 4, 4)),
                           F.sdpa_backward, {"q": q, "k": k, "v": v},
                           title="attention (causal + padding + alibi)")


def print_report(checks: Iterator[Callable[[], GradcheckReport]], tol: float = 1e-6) -> bool:
    """Run the checks, print each table with a verdict; returns True when all pass."""
    all_ok = True
    for check in checks:
        report = check()
        verdict = "ok" if report.ok(tol) else f"FAILED (tolerance {tol:g})"
        print(f"{report}\n  -> {verdict}\n", flush=True)
        all_ok &= report.ok(tol)
    return all_ok


__all__ = ["op_checks", "print_report", "check_module", "check_direction"]

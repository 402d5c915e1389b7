"""Why attention divides by sqrt(d_k), measured (chapter 001's table).

For each head width d_k in {4, 16, 64, 256, 1024}: draw 4,000 queries and, for each, 8 keys,
every coordinate N(0, 1). Measure

* the standard deviation of the raw scores q.k over all 4,000 x 8 of them (theory: sqrt(d_k));
* the mean, over the 4,000 rows, of the largest softmax weight among the 8 keys;
* the mean Frobenius norm of the softmax Jacobian J = diag(a) - a a^T (d a_i / d s_j, an
  8 x 8 matrix per row), the factor through which gradients reach the scores;

each with the raw scores s and with s / sqrt(d_k). This is the chapter's protocol (4,000
rows, 8 keys, Frobenius norm over the 8 x 8 Jacobian, averaged over rows); its draws come
from torch's generator, ours from NumPy's, so the third decimals differ.

Here the Jacobian IS built (4,000 small 8 x 8 matrices): its size is the thing measured. The
tempting closed form ||J||_F^2 = sum a_i^2 - 2 sum a_i^3 + (sum a_i^2)^2 cancels
catastrophically when a is nearly one-hot (1 - 2 + 1), exactly the unscaled large-d_k case,
and can even go negative in float64.

Run: ``python experiments/scaling.py`` (seconds).
"""

from __future__ import annotations

import common  # first: pins BLAS to one thread before numpy loads
import numpy as np

from numpy_transformer.functional.softmax import softmax_forward

SEED, ROWS, KEYS = 0, 4000, 8
D_K = (4, 16, 64, 256, 1024)
CHAPTER = {  # d_k: std(q.k), max weight raw / scaled, |Jacobian| raw / scaled
    4: (1.99, 0.526, 0.342, 0.342, 0.360),
    16: (3.97, 0.741, 0.352, 0.260, 0.364),
    64: (8.00, 0.878, 0.362, 0.148, 0.366),
    256: (16.14, 0.939, 0.364, 0.081, 0.366),
    1024: (32.10, 0.967, 0.362, 0.045, 0.366),
}


def jacobian_frobenius(a: np.ndarray) -> np.ndarray:
    """Frobenius norm of J = diag(a) - a a^T, J_ij = d a_i / d s_j, per row: (N, n) -> (N,)."""
    n = a.shape[-1]
    jac = np.eye(n) * a[:, :, None] - a[:, :, None] * a[:, None, :]  # (N, n, n)
    return np.linalg.norm(jac, axis=(1, 2))


def main() -> None:
    timer = common.Timer()
    rng = np.random.default_rng(SEED)
    print(f"seed {SEED}; {ROWS} queries x {KEYS} keys per d_k; float64")
    print(f"{'d_k':>5} {'std(q.k)':>9} {'sqrt(d_k)':>9} | {'max weight':>10} {'(scaled)':>9} "
          f"| {'|Jacobian|':>10} {'(scaled)':>9} || chapter: std, max w, max w sc, |J|, |J| sc")
    rows = {}
    for d_k in D_K:
        q = rng.standard_normal((ROWS, 1, d_k))
        k = rng.standard_normal((ROWS, KEYS, d_k))
        s = (q @ k.transpose(0, 2, 1))[:, 0]  # (ROWS, KEYS) raw scores
        stats = {}
        for name, scores in (("raw", s), ("scaled", s / np.sqrt(d_k))):
            a, _ = softmax_forward(scores)  # (ROWS, KEYS)
            jac = jacobian_frobenius(a)
            stats[name] = {"max_weight": float(a.max(-1).mean()),
                           "jacobian_frobenius": float(jac.mean())}
        rows[d_k] = {"std_qk": float(s.std()), "sqrt_dk": float(np.sqrt(d_k)), **stats}
        c = CHAPTER[d_k]
        print(f"{d_k:>5} {s.std():9.2f} {np.sqrt(d_k):9.2f} | "
              f"{stats['raw']['max_weight']:10.3f} {stats['scaled']['max_weight']:9.3f} | "
              f"{stats['raw']['jacobian_frobenius']:10.3f} "
              f"{stats['scaled']['jacobian_frobenius']:9.3f} || "
              f"{c[0]:.2f}, {c[1]:.3f}, {c[2]:.3f}, {c[3]:.3f}, {c[4]:.3f}")

    fig, axes = common.plt.subplots(1, 3, figsize=(13, 3.6))
    d = np.array(D_K)
    axes[0].loglog(d, [rows[x]["std_qk"] for x in D_K], "o-", label="measured std(q.k)")
    axes[0].loglog(d, np.sqrt(d), "k--", lw=0.8, label="sqrt(d_k)")
    axes[0].set_title("Raw score spread")
    for ax, key, title in ((axes[1], "max_weight", "Mean largest weight (8 keys)"),
                           (axes[2], "jacobian_frobenius", "Mean softmax Jacobian ||J||_F")):
        ax.semilogx(d, [rows[x]["raw"][key] for x in D_K], "o-", label="q.k (unscaled)")
        ax.semilogx(d, [rows[x]["scaled"][key] for x in D_K], "s-", label="q.k / sqrt(d_k)")
        ax.set_title(title)
    axes[1].axhline(1 / KEYS, color="gray", ls=":", lw=0.8, label="uniform 1/8")
    for ax in axes:
        ax.set_xlabel("d_k")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    common.save_figure(fig, "scaling")

    common.save_json("scaling", {
        "command": "python experiments/scaling.py",
        "protocol": {"seed": SEED, "rows": ROWS, "keys": KEYS,
                     "jacobian_norm": "Frobenius over the 8x8 matrix, mean over rows"},
        "results": {str(k): v for k, v in rows.items()},
        "chapter": {str(k): dict(zip(("std_qk", "max_weight_raw", "max_weight_scaled",
                                      "jacobian_raw", "jacobian_scaled"), v, strict=True))
                    for k, v in CHAPTER.items()},
        "wall_seconds": round(timer.seconds, 1),
    })


if __name__ == "__main__":
    main()

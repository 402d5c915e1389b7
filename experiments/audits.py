"""The chapters' audits, run on the library's own functions and drawn as figures.

1. Permutation equivariance: bare self-attention, and whole encoders with and without
   positions. Without positions, permuting the input tokens permutes the outputs the same way
   (error at rounding level); with positions it does not.
2. Sinusoidal clocks: the table as a heatmap, a few of its columns, its Gram matrix (which
   depends only on the offset), and the rotation identity PE[p + k] = R_k PE[p].
3. RoPE: after rotating a fixed query and key to every position, the score depends only on
   the offset; rotation preserves norms.
4. Causal mask: an untrained causal multi-head attention gives future keys exactly zero
   weight, every row sums to one, and perturbing a future token leaves earlier outputs
   bit-for-bit unchanged.
5. LayerNorm vs BatchNorm: doubling a batchmate leaves a token's LayerNorm output unchanged
   but moves BatchNorm's pooled mean (the chapter's 4-feature audit tensor).

Everything runs in float64 except the causal audit, which is float32 as in the chapter (so its
row-sum error is float32 rounding). Seeds: 6050 (the chapter's) unless stated.

Run: ``python experiments/audits.py`` (seconds).
"""

from __future__ import annotations

import common  # first: pins BLAS to one thread before numpy loads
import numpy as np

from numpy_transformer.functional.attention import sdpa_forward
from numpy_transformer.functional.masks import causal_mask
from numpy_transformer.functional.norms import layer_norm_forward
from numpy_transformer.functional.positional import rope_forward, rope_tables, sinusoidal_table
from numpy_transformer.nn import EncoderClassifier, TransformerConfig
from numpy_transformer.nn.attention import MultiHeadAttention
from numpy_transformer.plots import show_mask

SEED = 6050
plt = common.plt


def bare_attention(x: np.ndarray) -> np.ndarray:
    """softmax(x x^T / sqrt(C)) x, no projections: (T, C) -> (T, C)."""
    out, _ = sdpa_forward(x[None, None], x[None, None], x[None, None])
    return out[0, 0]


def audit_permutation() -> dict:
    rng = np.random.default_rng(SEED)
    x = rng.normal(size=(5, 8))
    perm = np.array([2, 4, 0, 1, 3])
    pe = sinusoidal_table(5, 8)
    res = {"bare_attention": float(np.abs(bare_attention(x[perm])
                                          - bare_attention(x)[perm]).max()),
           "bare_attention_plus_positions": float(np.abs(
               bare_attention(x[perm] + pe) - bare_attention(x + pe)[perm]).max())}
    # Whole encoders (2 pre-LN blocks, width 16) on a token sequence and its permutation.
    tokens = rng.integers(0, 10, size=(1, 12))
    perm12 = rng.permutation(12)
    outputs = {}
    for positions in ("none", "sinusoidal", "learned"):
        model = EncoderClassifier(TransformerConfig(
            vocab=10, width=16, heads=4, layers=2, ffn_width=32, max_len=12,
            positions=positions, num_classes=10, seed=SEED))
        y, y_perm = model.forward(tokens)[0], model.forward(tokens[:, perm12])[0]
        res[f"encoder_{positions}"] = float(np.abs(y_perm - y[perm12]).max())
        outputs[positions] = (y[perm12], y_perm)
    for k, v in res.items():
        print(f"  permutation error, {k:30s} {v:.2e}")

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [1.2, 1]})
    names = list(res)
    axes[0].barh(names, [max(res[n], 1e-17) for n in names],
                 color=["C0" if "none" in n or n == "bare_attention" else "C3" for n in names])
    axes[0].set_xscale("log")
    axes[0].set_xlabel("max |f(Px) - P f(x)|")
    axes[0].axvline(1e-12, color="gray", ls=":", lw=0.8)
    axes[0].set_title("Permutation equivariance error (blue: no positions)")
    for i, n in enumerate(names):
        axes[0].text(max(res[n], 1e-17) * 1.5, i, f"{res[n]:.1e}", va="center", fontsize=8)
    diff = np.abs(outputs["sinusoidal"][1] - outputs["sinusoidal"][0])
    im = axes[1].imshow(diff, aspect="auto", cmap="magma")
    axes[1].set_title("Encoder with sinusoidal positions:\n|f(Px) - P f(x)| per position, logit")
    axes[1].set_xlabel("logit")
    axes[1].set_ylabel("position")
    fig.colorbar(im, ax=axes[1], shrink=0.8)
    common.save_figure(fig, "audit_permutation")
    return res


def audit_sinusoidal() -> dict:
    res, fig = sinusoidal_clocks()
    common.save_figure(fig, "audit_sinusoidal")
    return res


def sinusoidal_clocks() -> tuple[dict, object]:
    """The sinusoidal audit's numbers and its figure (the site draws it too)."""
    length, width, delta, j = 100, 32, 7, 5
    pe = sinusoidal_table(length, width)  # (100, 32)
    omega = np.arctan2(pe[1, 0::2], pe[1, 1::2])  # row 1 holds (sin w_j, cos w_j): the w_j
    # Pair (sin, cos) of frequency w advanced by delta: [[cos, sin], [-sin, cos]] (angle addition).
    c, s = np.cos(delta * omega), np.sin(delta * omega)
    rot = np.zeros((width, width))
    for i in range(width // 2):
        rot[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[c[i], s[i]], [-s[i], c[i]]]
    # One fixed matrix maps EVERY position's encoding to the encoding delta steps later.
    all_error = float(np.abs(pe[:-delta] @ rot.T - pe[delta:]).max())
    pair_error = float(np.abs(rot[2 * j:2 * j + 2, 2 * j:2 * j + 2] @ pe[13, 2 * j:2 * j + 2]
                              - pe[13 + delta, 2 * j:2 * j + 2]).max())
    norm_error = float(np.abs(np.linalg.norm(pe, axis=1) - np.sqrt(width / 2)).max())
    gram = pe @ pe.T  # (100, 100): depends only on p - q
    toeplitz_error = float(max(np.ptp(np.diagonal(gram, k)) for k in range(-length + 1, length)))
    res = {"rotation_pair_13_j5_offset7": pair_error, "rotation_all_positions": all_error,
           "norm_error": norm_error, "gram_toeplitz_error": toeplitz_error}
    for k, v in res.items():
        print(f"  sinusoidal {k:30s} {v:.2e}")

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8), layout="constrained")
    im = axes[0].imshow(pe.T, aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1)
    axes[0].set_xlabel("position p")
    axes[0].set_ylabel("feature (2j: sin, 2j+1: cos)")
    axes[0].set_title(f"Sinusoidal table, width {width}")
    fig.colorbar(im, ax=axes[0], shrink=0.8, label="PE[p, i] (unitless)")
    for jj in (0, 2, 5, 10):
        axes[1].plot(pe[:, 2 * jj], label=f"sin, j={jj} (w={omega[jj]:.3g} rad/position)")
    axes[1].set_xlabel("position p")
    axes[1].set_ylabel("PE[p, 2j] = sin(w_j p)")
    axes[1].set_title("Clocks: fast to slow")
    axes[1].legend(fontsize=7, loc="lower left")
    im = axes[2].imshow(gram, cmap="viridis")
    axes[2].set_title(f"PE[p] . PE[q]: constant along diagonals\n"
                      f"R_{delta} PE[p] = PE[p+{delta}] for all p: max err {all_error:.1e}",
                      fontsize=9)
    axes[2].set_xlabel("position q")
    axes[2].set_ylabel("position p")
    fig.colorbar(im, ax=axes[2], shrink=0.8, label="PE[p] . PE[q] (unitless)")
    return res, fig


def audit_rope() -> dict:
    res, fig = rope_offsets()
    common.save_figure(fig, "audit_rope")
    return res


def rope_offsets() -> tuple[dict, object]:
    """The RoPE audit's numbers and its figure (the site draws it too)."""
    rng = np.random.default_rng(0)
    d, length = 16, 64
    q, k = rng.standard_normal(d), rng.standard_normal(d)
    cos, sin = rope_tables(length, d)
    rq = rope_forward(np.broadcast_to(q, (1, 1, length, d)).copy(), cos, sin)[0, 0]  # (T, D)
    rk = rope_forward(np.broadcast_to(k, (1, 1, length, d)).copy(), cos, sin)[0, 0]
    scores = rq @ rk.T  # (T, T): score of q at m with k at n
    pairs = {f"q at {m}, k at {n} (offset {m - n})": float(scores[m, n])
             for m, n in ((5, 2), (20, 17), (60, 57), (10, 2))}
    for name, v in pairs.items():
        print(f"  rope {name:32s} score {v: .4f}")
    spread = float(max(np.ptp(np.diagonal(scores, o)) for o in range(-length + 1, length)))
    norm_error = float(np.abs(np.linalg.norm(rq, axis=1) - np.linalg.norm(q)).max())
    print(f"  rope max spread of the score along one offset {spread:.2e}; "
          f"norm error {norm_error:.2e}")

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
    im = axes[0].imshow(scores, cmap="RdBu_r")
    axes[0].set_title("RoPE: score(q at m, k at n)\nconstant along each diagonal m - n")
    axes[0].set_xlabel("key position n")
    axes[0].set_ylabel("query position m")
    fig.colorbar(im, ax=axes[0], shrink=0.8, label="score (R_m q) . (R_n k) (unitless)")
    offsets = np.arange(-length + 1, length)
    axes[1].plot(offsets, [np.diagonal(scores, -o).mean() for o in offsets], lw=1.2)
    axes[1].set_xlabel("offset m - n (positions)")
    axes[1].set_ylabel("mean score along the offset (unitless)")
    axes[1].set_title(f"Score as a function of the offset only\n(max spread per offset "
                      f"{spread:.1e})")
    axes[1].grid(alpha=0.3)
    return {"scores": pairs, "max_spread_per_offset": spread, "norm_error": norm_error}, fig


def audit_causal() -> dict:
    rng = np.random.default_rng(SEED)
    t = 12
    attn = MultiHeadAttention(32, 4, keep_weights=True, dtype=np.float32, rng=rng)
    x = rng.standard_normal((1, t, 32)).astype(np.float32)
    mask = causal_mask(t)  # (T, T) True = may attend
    y = attn.forward(x, mask=mask)
    w = attn.weights[0]  # (H, T, T)
    future = ~mask
    max_future = float(w[:, future].max())
    row_err = float(np.abs(w.sum(-1) - 1).max())
    x2 = x.copy()
    x2[:, 7] += 1.0  # perturb a future token
    y2 = attn.forward(x2, mask=mask)
    past_change = float(np.abs(y2[:, :7] - y[:, :7]).max())
    here_change = float(np.abs(y2[:, 7] - y[:, 7]).max())
    print(f"  causal: max future weight {max_future}, max row-sum error {row_err:.2e} "
          f"(float32); perturbing token 7 moves outputs 0-6 by {past_change}, "
          f"output 7 by {here_change:.3f}")

    fig, axes = plt.subplots(1, 5, figsize=(16, 3.4),
                             gridspec_kw={"width_ratios": [1, 1, 1, 1, 1]})
    show_mask(axes[0], mask, "causal mask")
    for h in range(4):
        ax = axes[h + 1]
        common.plot_attention(ax, w[h], vmax=None, title=f"untrained head {h}")
        for i, r in enumerate(w[h].sum(-1)):
            ax.text(t - 0.4, i, f"{r:.4f}", fontsize=5.5, va="center", ha="right",
                    color="white")
        ax.set_xlabel("key")
    axes[0].set_ylabel("query")
    fig.suptitle(f"Causal attention: future weight max {max_future}, row sums (printed "
                 f"at right) within {row_err:.1e} of 1", fontsize=10)
    common.save_figure(fig, "audit_causal")
    return {"max_future_weight": max_future, "max_row_sum_error": row_err,
            "perturb_token7_change_in_outputs_0_6": past_change,
            "perturb_token7_change_in_output_7": here_change}


def batch_norm_train(x: np.ndarray, eps: float = 1e-5):
    """Temporal BatchNorm in training mode: statistics per feature, pooled over (B, T)."""
    mean = x.mean(axis=(0, 1), keepdims=True)  # (1, 1, C)
    var = x.var(axis=(0, 1), keepdims=True)
    return (x - mean) / np.sqrt(var + eps), mean[0, 0]


def audit_norms() -> dict:
    audit = np.array([[[1.0, 3.0, 5.0, 7.0], [40.0, 50.0, 60.0, 70.0]],
                      [[-3.0, 1.0, 5.0, 9.0], [2.0, 2.5, 3.0, 3.5]]])  # (B=2, T=2, C=4)
    ones, zeros = np.ones(4), np.zeros(4)
    ln, _ = layer_norm_forward(audit, ones, zeros)
    doubled = audit.copy()
    doubled[0, 1] *= 2  # the first token's neighbour doubles: 40..70 -> 80..140
    ln2, _ = layer_norm_forward(doubled, ones, zeros)
    bn, mean = batch_norm_train(audit)
    bn2, mean2 = batch_norm_train(doubled)
    res = {"layernorm_max_token_mean": float(np.abs(ln.mean(-1)).max()),
           "layernorm_max_token_variance_error": float(np.abs(ln.var(-1) - 1).max()),
           "layernorm_first_token": ln[0, 0],
           "layernorm_first_token_change_after_doubling": float(np.abs(ln2[0, 0]
                                                                       - ln[0, 0]).max()),
           "batchnorm_feature1_pooled_mean": [float(mean[0]), float(mean2[0])],
           "batchnorm_first_token_change_after_doubling": float(np.abs(bn2[0, 0]
                                                                       - bn[0, 0]).max())}
    print(f"  layernorm: max |token mean| {res['layernorm_max_token_mean']:.1e}, max "
          f"variance error {res['layernorm_max_token_variance_error']:.2e}, first token "
          f"{np.round(ln[0, 0], 3).tolist()}")
    print(f"  doubling the neighbour: first token's LayerNorm output moves by "
          f"{res['layernorm_first_token_change_after_doubling']:.1e}; BatchNorm's pooled "
          f"feature-1 mean {mean[0]:.1f} -> {mean2[0]:.1f}, the first token's BatchNorm "
          f"output moves by {res['batchnorm_first_token_change_after_doubling']:.3f}")

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
    feats = np.arange(1, 5)
    axes[0].plot(feats, audit[0, 0], "o--", color="gray", label="raw token (1, 3, 5, 7)")
    axes[0].plot(feats, ln[0, 0], "o-", label="LayerNorm, before")
    axes[0].plot(feats, ln2[0, 0], "x", ms=10, label="LayerNorm, neighbour doubled")
    axes[0].set_title("First token: LayerNorm output unchanged")
    axes[0].set_xlabel("feature")
    axes[0].legend(fontsize=8)
    axes[1].plot(feats, bn[0, 0], "o-", label="BatchNorm, before")
    axes[1].plot(feats, bn2[0, 0], "x-", ms=10, label="BatchNorm, neighbour doubled")
    axes[1].set_title("First token: BatchNorm output moves")
    axes[1].set_xlabel("feature")
    axes[1].legend(fontsize=8)
    w = 0.38
    axes[2].bar(feats - w / 2, mean, w, label="before")
    axes[2].bar(feats + w / 2, mean2, w, label="neighbour doubled")
    axes[2].set_title("BatchNorm's pooled mean per feature (over B, T)")
    axes[2].set_xlabel("feature")
    axes[2].legend(fontsize=8)
    for ax in axes:
        ax.set_xticks(feats)
        ax.grid(alpha=0.3)
    common.save_figure(fig, "audit_norms")
    return res


def main() -> None:
    timer = common.Timer()
    results = {}
    for name, fn in (("permutation", audit_permutation), ("sinusoidal", audit_sinusoidal),
                     ("rope", audit_rope), ("causal", audit_causal), ("norms", audit_norms)):
        print(f"[{name}]")
        results[name] = fn()
    common.save_json("audits", {
        "command": "python experiments/audits.py", "seed": SEED, "results": results,
        "chapter": {"bare_permutation_error": 2.22e-16,
                    "fixed_slot_difference_with_positions": 1.581,
                    "rotation_identity_error": 1.11e-16, "norm_error": 0.0,
                    "rope_scores": {"offset 3": -4.2207, "offset 8": -0.9723},
                    "causal_max_future_weight": 0.0, "causal_max_row_sum_error": 1.19e-07,
                    "layernorm_max_token_mean": 0.0,
                    "layernorm_max_token_variance_error": 3.2e-05,
                    "layernorm_first_token": [-1.342, -0.447, 0.447, 1.342],
                    "batchnorm_feature1_pooled_mean": [10, 20]},
        "wall_seconds": round(timer.seconds, 1)})


if __name__ == "__main__":
    main()

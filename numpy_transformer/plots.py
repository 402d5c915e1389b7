"""The pictures of a run folder (``loss.png``, ``attention.png``) and of gradient statistics.

matplotlib is used through its object API (``Figure`` + the Agg canvas), so drawing never
touches pyplot's global state or needs a display.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .files import atomic_write_bytes


def _save(fig, path: Path) -> None:
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    atomic_write_bytes(path, buf.getvalue())


def loss_plot(records: list[dict], path: Path) -> None:
    """Training loss per step (faint), its 50-step running mean, and the held-out losses."""
    from matplotlib.figure import Figure

    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    if train:
        steps, loss = np.array(train).T
        ax.plot(steps, loss, color="C0", alpha=0.3, lw=0.8, label="training loss")
        k = max(1, min(50, len(loss) // 10))
        smooth = np.convolve(loss, np.ones(k) / k, mode="valid")
        ax.plot(steps[k - 1:], smooth, color="C0", label=f"training loss, mean of {k}")
    if val:
        steps, loss = np.array(val).T
        ax.plot(steps, loss, "o-", color="C1", label="held-out loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    _save(fig, path)


def tensor_stats_figure(stats: list[dict]):
    """Per-tensor gradient norm and update-to-weight ratio over training, one line a tensor.

    Parameters
    ----------
    stats : list of dict
        :attr:`numpy_transformer.train.Trainer.tensor_stats`: every ``stats_every`` steps,
        ``{"step": s, name: {"grad_norm": ..., "update_ratio": ...}, ...}``.

    Returns
    -------
    fig : matplotlib.figure.Figure
        Two panels; the right one is the classic health check of a run, ``||dW|| / ||W||``
        around 1e-3 per step. A notebook shows it with ``display(fig)``.

    Raises
    ------
    ValueError
        If ``stats`` is empty (the trainer was built without ``stats_every``).
    """
    from matplotlib.figure import Figure

    if not stats:
        raise ValueError("no tensor statistics to plot: train with Trainer(stats_every=N)")
    steps = [s["step"] for s in stats]
    names = [n for n in stats[0] if n != "step"]
    fig = Figure(figsize=(11, 4.5))
    axes = fig.subplots(1, 2)
    for key, ax, label in (("grad_norm", axes[0], "gradient norm (after clipping)"),
                           ("update_ratio", axes[1], "update / weight  ||dW|| / ||W||")):
        for i, name in enumerate(names):
            ax.plot(steps, [s[name][key] for s in stats], lw=1, color=f"C{i % 10}",
                    label=name if key == "grad_norm" and len(names) <= 12 else None)
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    if len(names) <= 12:
        axes[0].legend(fontsize=6)
    fig.tight_layout()
    return fig


def tensor_stats_plot(stats: list[dict], path: Path) -> None:
    """Save :func:`tensor_stats_figure` of ``stats`` as a PNG at ``path``."""
    _save(tensor_stats_figure(stats), path)


def _snippet(run):
    """(attention module, model inputs, query labels, key labels) for the picture."""
    model = run.model
    if run.task == "lm":
        ids = np.asarray(run.val_ids[:min(run.config.max_len, 40)])
        chars = [repr(run.tokenizer.decode(ids[i:i + 1]))[1:-1] for i in range(len(ids))]
        return model.decoder.blocks[-1].attn, (ids[None, :],), chars, chars
    inputs = tuple(a[:1] for a in run.eval_set.inputs)
    if run.task == "reverse":  # cross-attention: target positions read the source
        src, tgt = inputs
        return (model.decoder.blocks[-1].cross_attn, inputs,
                [str(t) for t in tgt[0]], [str(t) for t in src[0]])
    labels = [str(t) for t in inputs[0][0]]
    stack = model.encoder if run.task == "sort" else model.decoder
    return stack.blocks[-1].attn, inputs, labels, labels


def attention_plot(run, path: Path) -> None:
    """The last layer's attention weights on a held-out snippet, one panel per head."""
    from matplotlib.figure import Figure

    attn, inputs, q_labels, k_labels = _snippet(run)
    attn.keep_weights = True
    run.model.eval()
    try:
        run.model.forward(*inputs)
        weights = np.asarray(attn.weights[0], dtype=np.float64)  # (H, T_q, T_k)
    finally:
        attn.keep_weights, attn.weights = False, None
        run.model.train()
    heads = weights.shape[0]
    cols = min(heads, 4)
    rows = -(-heads // cols)
    fig = Figure(figsize=(3.2 * cols, 3.2 * rows + 0.4))
    for h in range(heads):
        ax = fig.add_subplot(rows, cols, h + 1)
        ax.imshow(weights[h], cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_title(f"head {h}", fontsize=9)
        ax.set_xticks(range(len(k_labels)), k_labels, fontsize=5, rotation=90)
        ax.set_yticks(range(len(q_labels)), q_labels, fontsize=5)
    kind = "cross-attention" if run.task == "reverse" else "self-attention"
    fig.suptitle(f"last layer {kind} on a held-out example (rows: queries, columns: keys)",
                 fontsize=9)
    fig.tight_layout()
    _save(fig, path)

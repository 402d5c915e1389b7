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


def loss_figure(records: list[dict], clip: float | None = None):
    """The dynamics of a run from its ``log.jsonl`` records, three panels over the steps.

    1. The training loss (faint), its running mean over up to 50 steps, the held-out losses.
    2. The learning rate of each step (the schedule, warmup included).
    3. The global gradient norm before clipping, on a log scale, with the clipping threshold
       ``clip`` drawn and the share of the steps it clipped in the legend.

    Parameters
    ----------
    records : list of dict
        The run's log: per step ``{"step", "loss", "lr", "grad_norm", ...}``, per evaluation
        ``{"step", "val_loss", ...}``.
    clip : float, optional
        The run's ``--clip`` (None: no clipping, no threshold drawn).

    Returns
    -------
    fig : matplotlib.figure.Figure
    """
    from matplotlib.figure import Figure

    train = [r for r in records if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    fig = Figure(figsize=(7, 7.5))
    ax_loss, ax_lr, ax_norm = fig.subplots(3, 1, sharex=True,
                                           gridspec_kw={"height_ratios": (2, 1, 1.3)})
    if train:
        steps, loss = np.array([(r["step"], r["loss"]) for r in train]).T
        ax_loss.plot(steps, loss, color="C0", alpha=0.3, lw=0.8, label="training loss")
        k = max(1, min(50, len(loss) // 10))
        smooth = np.convolve(loss, np.ones(k) / k, mode="valid")
        ax_loss.plot(steps[k - 1:], smooth, color="C0", label=f"training loss, mean of {k}")
        ax_lr.plot(steps, [r["lr"] for r in train], color="C2")
        norms = np.array([r["grad_norm"] for r in train])
        ax_norm.plot(steps, norms, color="C3", lw=0.8, label="gradient norm, before clipping")
        if clip:
            ax_norm.axhline(clip, color="k", ls="--", lw=1,
                            label=f"clip {clip:g}: {np.mean(norms > clip):.0%} of steps clipped")
        ax_norm.set_yscale("log")
        ax_norm.legend(fontsize=8)
    if val:
        steps, loss = np.array(val).T
        ax_loss.plot(steps, loss, "o-", color="C1", label="held-out loss")
    ax_loss.set_ylabel("cross-entropy (nats)")
    ax_loss.legend()
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_ylim(bottom=0)
    ax_norm.set_ylabel("gradient norm")
    ax_norm.set_xlabel("step")
    for ax in (ax_loss, ax_lr, ax_norm):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def loss_plot(records: list[dict], path: Path, clip: float | None = None) -> None:
    """Save :func:`loss_figure` of a run's log as a PNG at ``path``."""
    _save(loss_figure(records, clip), path)


def tensor_groups(names: list[str]) -> dict[str, list[str]]:
    """The tensors of a model by layer: ``"decoder.blocks.0"`` for each block's (the encoder's
    and decoder's apart), and one group for the rest (embeddings, final norms, head), in the
    model's order."""
    groups: dict[str, list[str]] = {}
    for name in names:
        parts = name.split(".")
        cut = next((i + 2 for i, part in enumerate(parts[:-2]) if part in ("blocks", "layers")
                    and parts[i + 1].isdigit()), 0)
        groups.setdefault(".".join(parts[:cut]) if cut else "", []).append(name)
    return groups


def tensor_stats_figure(stats: list[dict]):
    """Per-tensor gradient norm and update-to-weight ratio over training, one row of two
    panels per layer (:func:`tensor_groups`), one line a tensor, each row with its legend.

    Parameters
    ----------
    stats : list of dict
        :attr:`numpy_transformer.train.Trainer.tensor_stats`: every ``stats_every`` steps,
        ``{"step": s, name: {"grad_norm": ..., "update_ratio": ...}, ...}``.

    Returns
    -------
    fig : matplotlib.figure.Figure
        The right column is the classic health check of a run, ``||dW|| / ||W||`` around
        1e-3 per step. A notebook shows it with ``display(fig)``.

    Raises
    ------
    ValueError
        If ``stats`` is empty (the trainer was built without ``stats_every``).
    """
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    if not stats:
        raise ValueError("no tensor statistics to plot: train with Trainer(stats_every=N)")
    steps = [s["step"] for s in stats]
    groups = tensor_groups([n for n in stats[0] if n != "step"])
    fig = Figure(figsize=(13, 3.2 * len(groups)))
    axes = fig.subplots(len(groups), 2, squeeze=False)
    colors = colormaps["tab20"]
    for row, (group, names) in zip(axes, groups.items(), strict=True):
        for key, ax, label, unit in (
                ("grad_norm", row[0], "gradient norm (after clipping)", "||dL/dW|| (nats / unit)"),
                ("update_ratio", row[1], "update / weight  ||dW|| / ||W||",
                 "||dW|| / ||W|| per step")):
            for i, name in enumerate(names):
                ax.plot(steps, [s[name][key] for s in stats], lw=1, color=colors(i % 20),
                        ls="-" if i < 20 else "--", label=name[len(group):].lstrip("."))
            ax.set_yscale("log")
            ax.set_ylabel(unit, fontsize=8)
            ax.set_title(f"{group or 'embeddings, final norms, head'}: {label}", fontsize=10)
            ax.grid(alpha=0.3)
        row[1].legend(fontsize=7, ncol=1 + len(names) // 10, loc="center left",
                      bbox_to_anchor=(1.01, 0.5))
    for ax in axes[-1]:
        ax.set_xlabel("step")
    fig.tight_layout()
    return fig


def block_gradient_norms(stats: list[dict], blocks: int,
                         prefix: str = "decoder.blocks") -> np.ndarray:
    """Each block's gradient norm, all its tensors together, at every record of ``stats``
    (:attr:`numpy_transformer.train.Trainer.tensor_stats`): shape (records, blocks)."""
    return np.array([[np.sqrt(sum(v["grad_norm"] ** 2 for n, v in s.items()
                                  if n.startswith(f"{prefix}.{i}.")))
                      for i in range(blocks)] for s in stats])


def norm_placement_figure(runs: dict[str, tuple[list[float], np.ndarray]]):
    """Runs side by side: the training loss of each, then one panel per run with the
    gradient norm of every block over the steps (log10, one colour scale).

    Parameters
    ----------
    runs : dict of str to (list of float, ndarray of shape (steps, blocks))
        Per run (``"pre-LN"``, ``"post-LN"``): the loss of every step and
        :func:`block_gradient_norms` recorded every step.

    Returns
    -------
    fig : matplotlib.figure.Figure
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.7 * (len(runs) + 1), 3.8), layout="constrained")
    axes = fig.subplots(1, len(runs) + 1)
    for name, (losses, _) in runs.items():
        axes[0].plot(np.arange(1, len(losses) + 1), losses, label=name)
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("training loss (nats)")
    axes[0].legend()
    axes[0].grid(alpha=0.3)
    for ax, (name, (_, per_block)) in zip(axes[1:], runs.items(), strict=True):
        image = ax.imshow(np.log10(per_block.T + 1e-12), aspect="auto", origin="lower",
                          cmap="magma", vmin=-6, vmax=0,
                          extent=(0.5, per_block.shape[0] + 0.5, -0.5, per_block.shape[1] - 0.5))
        ax.set_title(f"{name}: gradient norm per block", fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel("block (0 = next to the embeddings)")
    fig.colorbar(image, ax=axes[1:], label="log10 ||dL/dW|| of the block (nats / unit)")
    return fig


def tensor_stats_plot(stats: list[dict], path: Path) -> None:
    """Save :func:`tensor_stats_figure` of ``stats`` as a PNG at ``path``."""
    _save(tensor_stats_figure(stats), path)


def show_mask(ax, mask: np.ndarray, title: str | None = None) -> None:
    """Draw a boolean attention mask (T_q, T_k) in the library's one convention: white = may
    attend (True), black = hidden, as ``functional/masks.py`` defines it. Every figure and
    notebook that shows a mask draws it here."""
    ax.imshow(np.asarray(mask, dtype=bool), cmap="Greys_r", vmin=0, vmax=1)
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    if title is not None:
        ax.set_title(f"{title} (white = may attend)", fontsize=9)


def _snippet(run):
    """(the attention module of every layer, model inputs, query labels, key labels)."""
    model = run.model
    if run.task == "lm":
        ids = np.asarray(run.data.val_ids[:min(run.config.max_len, 40)])
        chars = [repr(run.tokenizer.decode(ids[i:i + 1]))[1:-1] for i in range(len(ids))]
        return [b.attn for b in model.decoder.blocks], (ids[None, :],), chars, chars
    inputs = tuple(a[:1] for a in run.data.eval_set.inputs)
    if run.task == "reverse":  # cross-attention: target positions read the source
        src, tgt = inputs
        return ([b.cross_attn for b in model.decoder.blocks], inputs,
                [str(t) for t in tgt[0]], [str(t) for t in src[0]])
    labels = [str(t) for t in inputs[0][0]]
    stack = model.encoder if run.task == "sort" else model.decoder
    return [b.attn for b in stack.blocks], inputs, labels, labels


def _ticks(ax, labels: list[str], axis: str) -> None:
    """At most 20 tick labels (every k-th), 7 pt: readable at the figure's size."""
    every = -(-len(labels) // 20)
    where = range(0, len(labels), every)
    shown = [labels[i] for i in where]
    if axis == "x":
        ax.set_xticks(where, shown, fontsize=7, rotation=90)
    else:
        ax.set_yticks(where, shown, fontsize=7)


def attention_weights(run) -> tuple[np.ndarray, list[str], list[str]]:
    """The attention weights of every layer on a held-out example, in evaluation mode:
    ``(weights of shape (L, H, T_q, T_k), query labels, key labels)``."""
    attns, inputs, q_labels, k_labels = _snippet(run)
    for attn in attns:
        attn.keep_weights = True
    run.model.eval()
    try:
        run.model.forward(*inputs)
        weights = np.stack([np.asarray(a.weights[0], dtype=np.float64) for a in attns])
    finally:
        for attn in attns:
            attn.keep_weights, attn.weights = False, None
        run.model.train()
    return weights, q_labels, k_labels


def attention_figure(weights: np.ndarray, q_labels: list[str], k_labels: list[str],
                     kind: str = "self-attention"):
    """One panel per layer (rows) and head (columns), one colour scale from 0 to 1 with its
    colorbar; ``weights`` of shape (L, H, T_q, T_k)."""
    from matplotlib.figure import Figure

    layers, heads = weights.shape[:2]
    fig = Figure(figsize=(2.9 * heads + 1.0, 2.9 * layers + 0.6), layout="constrained")
    axes = fig.subplots(layers, heads, squeeze=False)
    for (layer, head), ax in np.ndenumerate(np.array(axes, dtype=object)):
        image = ax.imshow(weights[layer, head], cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_title(f"layer {layer}, head {head}", fontsize=8)
        _ticks(ax, k_labels, "x")
        _ticks(ax, q_labels, "y")
        if layer == layers - 1:
            ax.set_xlabel("key", fontsize=8)
        if head == 0:
            ax.set_ylabel("query", fontsize=8)
    fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    fig.suptitle(f"{kind} of every layer on a held-out example (rows of a panel: queries, "
                 f"columns: keys)", fontsize=9)
    return fig


def attention_plot(run, path: Path) -> None:
    """Save :func:`attention_figure` of the run's model on a held-out example at ``path``."""
    weights, q_labels, k_labels = attention_weights(run)
    kind = "cross-attention" if run.task == "reverse" else "self-attention"
    _save(attention_figure(weights, q_labels, k_labels, kind), path)

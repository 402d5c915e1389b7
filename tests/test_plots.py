"""The figures of a run folder, looked at through matplotlib's objects: ``attention.png``
shows every layer and head with one colour scale and its colorbar, and every figure or
notebook draws a mask in one convention (white = may attend)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _run_helpers import small_text

from numpy_transformer.functional.masks import causal_mask
from numpy_transformer.plots import attention_figure, attention_weights, show_mask
from numpy_transformer.runs.options import resolve_options
from numpy_transformer.runs.state import Run

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("layers, heads", [(2, 4), (3, 6), (1, 1)])
def test_attention_figure_has_a_panel_for_every_layer_and_head_and_a_colorbar(layers, heads):
    rng = np.random.default_rng(0)
    weights = rng.dirichlet(np.ones(9), size=(layers, heads, 9))  # rows sum to 1
    labels = list("abcdefghi")
    fig = attention_figure(weights, labels, labels)
    panels = [ax for ax in fig.axes if ax.images and ax.get_label() != "<colorbar>"]
    assert len(panels) == layers * heads  # no empty panel, none missing
    titles = {ax.get_title() for ax in panels}
    assert titles == {f"layer {lay}, head {h}" for lay in range(layers) for h in range(heads)}
    colorbars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(colorbars) == 1 and colorbars[0].get_ylabel() == "attention weight"
    for ax in panels:  # one colour scale, readable ticks
        assert ax.images[0].get_clim() == (0.0, 1.0)
        assert all(t.get_fontsize() >= 7 for t in ax.get_xticklabels())
    assert {panels[-1].get_xlabel(), panels[0].get_ylabel()} == {"key", "query"}


def test_long_labels_are_thinned_to_twenty_ticks():
    weights = np.full((1, 2, 40, 40), 1 / 40)
    fig = attention_figure(weights, [str(i) for i in range(40)], [str(i) for i in range(40)])
    assert len(fig.axes[0].get_xticks()) == 20


def test_the_run_figure_reads_every_layer(tmp_path):
    """The weights drawn are each layer's own, in evaluation mode: rows sum to 1, nothing
    above the causal diagonal, and the layers differ (negative control: not one layer
    drawn L times)."""
    fields, options = resolve_options("lm", {"text": str(small_text(tmp_path)), "layers": 2,
                                             "width": 16, "heads": 2, "ffn_width": 32,
                                             "max_len": 12, "backend": "numpy",
                                             "dropout": 0.2})
    run = Run(fields, options)
    weights, q_labels, k_labels = attention_weights(run)
    assert weights.shape == (2, 2, 12, 12) and len(q_labels) == len(k_labels) == 12
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)
    assert (weights[..., ~causal_mask(12)] == 0).all()
    assert not np.allclose(weights[0], weights[1])
    assert run.model.training  # left as it was found


def test_a_mask_is_white_where_it_may_attend():
    from matplotlib.figure import Figure

    ax = Figure().subplots()
    mask = causal_mask(4)
    show_mask(ax, mask, "causal")
    image = ax.images[0]
    rgba = image.cmap(image.norm(image.get_array()))
    assert (rgba[mask][:, :3] == 1.0).all() and (rgba[~mask][:, :3] == 0.0).all()
    assert "white = may attend" in ax.get_title()


def _sources() -> dict[str, str]:
    """The code of every figure: the package, the experiments and each notebook's cells."""
    texts = {str(p): p.read_text(encoding="utf-8") for folder in ("numpy_transformer",
                                                                   "experiments")
             for p in (ROOT / folder).rglob("*.py")}
    for nb in (ROOT / "docs" / "notebooks").rglob("*.ipynb"):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        texts[str(nb)] = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    return texts


def test_every_mask_is_drawn_by_show_mask():
    """A grey colour map anywhere but in ``show_mask`` is a mask drawn by hand, in whichever
    convention its author chose (the causal audit once drew "may attend" black, the notebook
    white). Negative control: such a line is found."""
    def by_hand(text: str) -> bool:
        return "Greys" in text

    offenders = [path for path, text in _sources().items()
                 if by_hand(text) and not path.endswith("numpy_transformer/plots.py")]
    assert offenders == []
    assert by_hand('ax.imshow(mask, cmap="Greys")')
    assert any("show_mask" in text for path, text in _sources().items() if "02_attention" in path)

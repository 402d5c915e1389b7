"""What a run shows of its dynamics: ``--stats-every N`` (per-tensor statistics in
``log.jsonl`` and ``stats.png``) and ``loss.png``'s learning-rate and gradient-norm panels."""

from __future__ import annotations

import numpy as np
import pytest
from _run_helpers import TINY, run_cli, small_text

from numpy_transformer.plots import loss_figure
from numpy_transformer.runs.folder import read_log
from numpy_transformer.runs.stored import load_run

PNG = b"\x89PNG\r\n\x1a\n"
CLOCK = ("tokens_per_s", "time")


def _train(*argv) -> None:
    code, _, err = run_cli(["train", "--quiet", "--eval-every", "0", *TINY, *argv])
    assert code == 0, err


def _logged(folder) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in CLOCK} for r in read_log(folder)]


def test_stats_every_logs_each_tensor_and_draws_them(tmp_path):
    text = small_text(tmp_path)
    _train("--text", text, "--steps", "6", "--stats-every", "2", "--out", tmp_path / "run")
    records = [r for r in read_log(tmp_path / "run") if "tensor_stats" in r]
    assert [r["step"] for r in records] == [2, 4, 6]
    names = {n for n, _, _ in load_run(tmp_path / "run").model.named_parameters()}
    for r in records:
        assert set(r["tensor_stats"]) == names
        assert all(s["grad_norm"] > 0 and 0 < s["update_ratio"] < 1
                   for s in r["tensor_stats"].values())
    assert (tmp_path / "run" / "stats.png").read_bytes()[:8] == PNG
    # without the option: no statistics, no figure
    _train("--text", text, "--steps", "2", "--out", tmp_path / "plain")
    assert not any("tensor_stats" in r for r in read_log(tmp_path / "plain"))
    assert not (tmp_path / "plain" / "stats.png").exists()


def test_the_statistics_of_an_extended_run_are_those_of_one_run(tmp_path):
    text = small_text(tmp_path)
    _train("--text", text, "--steps", "3", "--stats-every", "2", "--out", tmp_path / "short")
    code, _, err = run_cli(["train", "--resume", tmp_path / "short", "--steps", "6", "--quiet"])
    assert code == 0, err
    _train("--text", text, "--steps", "6", "--stats-every", "2", "--out", tmp_path / "long")
    short = [r for r in _logged(tmp_path / "short") if "val_loss" not in r]
    long = [r for r in _logged(tmp_path / "long") if "val_loss" not in r]
    assert short == long and sum("tensor_stats" in r for r in long) == 3


@pytest.mark.parametrize("clip", [1.0, None])
def test_the_loss_figure_draws_the_schedule_and_the_clipping(clip):
    lrs = [1e-3 * min(1, s / 3) for s in range(1, 11)]
    norms = [3.0, 2.0, 1.5, 0.9, 0.8, 0.7, 1.2, 0.5, 0.4, 0.3]
    records = [{"step": s, "loss": 4 - 0.1 * s, "lr": lr, "grad_norm": n}
               for s, lr, n in zip(range(1, 11), lrs, norms, strict=True)]
    records.append({"step": 10, "val_loss": 3.2})
    fig = loss_figure(records, clip)
    loss, lr, norm = fig.axes
    assert lr.get_ylabel() == "learning rate" and norm.get_yscale() == "log"
    np.testing.assert_array_equal(lr.lines[0].get_ydata(), lrs)
    np.testing.assert_array_equal(norm.lines[0].get_ydata(), norms)
    labels = [t.get_text() for t in norm.get_legend().get_texts()]
    if clip is None:
        assert len(norm.lines) == 1 and len(labels) == 1
    else:  # 4 of the 10 norms exceed the threshold
        assert list(norm.lines[1].get_ydata()) == [clip, clip]
        assert labels[1] == "clip 1: 40% of steps clipped"
    assert "held-out loss" in [t.get_text() for t in loss.get_legend().get_texts()]

"""``best.npz`` (the lowest held-out loss so far), ``--best`` and ``--early-stop K``."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from _run_helpers import TINY, one_line_error, run_cli, small_text

from numpy_transformer.checkpoint import load_checkpoint
from numpy_transformer.runs.evaluate import evaluate_run
from numpy_transformer.runs.folder import read_log


def _train(folder, *extra):
    code, out, err = run_cli(["train", "--text", small_text(folder.parent), *TINY, "--out",
                              folder, "--quiet", *extra])
    assert code == 0, err
    return out + err


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("best") / "run"
    _train(folder, "--steps", "8", "--eval-every", "2", "--lr", "0.05")
    return folder


def test_best_npz_holds_the_lowest_held_out_loss(run):
    losses = [(r["val_loss"], r["step"]) for r in read_log(run) if "val_loss" in r]
    loss, step = min(losses)
    best = load_checkpoint(run / "best.npz")
    assert best.step == step and best.meta["val_loss"] == loss
    assert evaluate_run(run / "best.npz").loss == pytest.approx(loss, rel=1e-12)
    if step != 8:  # the last checkpoint is another model
        last = load_checkpoint(run / "checkpoint.npz")
        assert any(not np.array_equal(best.params[n], last.params[n]) for n in best.params)


def test_the_commands_take_best(run, tmp_path):
    code, out, err = run_cli(["eval", run, "--best"])
    assert code == 0 and f"loss {load_checkpoint(run / 'best.npz').meta['val_loss']:.4f}" in out
    code, out, err = run_cli(["sample", run, "--best", "--length", "20"])
    assert code == 0, err
    code, _, err = run_cli(["export", run, "--best", "--out", tmp_path / "st"])
    if importlib.util.find_spec("safetensors") is None:  # without the extra: its one-line refusal
        assert code == 2 and one_line_error(err) and "best.npz" in err and "pip install" in err
    else:
        assert code == 0 and (tmp_path / "st" / "model.safetensors").is_file(), err
    code, _, err = run_cli(["eval", run / "checkpoint.npz", "--best"])
    assert code == 2 and one_line_error(err) and "--best takes a run folder" in err, err


def test_early_stop_ends_the_run_after_k_evaluations_without_a_new_best(tmp_path):
    # a learning rate too small to move float32 weights: the held-out loss never improves
    said = _train(tmp_path / "run", "--steps", "40", "--eval-every", "1", "--early-stop", "3",
                  "--lr", "1e-30")
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoint.npz")
    assert ckpt.step == 4 and ckpt.meta["finished"] and ckpt.meta["early_stopped"] == 4
    assert "early stop after step 4: 3 held-out evaluations without a new best" in said
    assert load_checkpoint(tmp_path / "run" / "best.npz").step == 1
    code, out, err = run_cli(["train", "--resume", tmp_path / "run", "--quiet"])
    assert code == 0 and "stopped early at step 4 of 40" in out + err
    # the control: without --early-stop the same run goes on
    _train(tmp_path / "on", "--steps", "6", "--eval-every", "1", "--lr", "1e-30")
    assert load_checkpoint(tmp_path / "on" / "checkpoint.npz").step == 6

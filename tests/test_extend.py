"""``train --resume RUN --steps N``: a run, finished or not, extended to N steps ends bit for
bit as the run configured with N steps from the start."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from _run_helpers import TINY, one_line_error, run_cli, small_text

from numpy_transformer.checkpoint import load_checkpoint
from numpy_transformer.runs.folder import read_log


def _train(folder, text, *extra):
    code, _, err = run_cli(["train", "--text", text, *TINY, "--eval-every", "0",
                            "--out", folder, "--quiet", *extra])
    assert code == 0, err


def _losses(folder) -> list[float]:
    return [r["loss"] for r in read_log(folder / "log.jsonl") if "loss" in r]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A finished run of 3 steps, and one configured with 7 from the start."""
    tmp = tmp_path_factory.mktemp("extend")
    text = small_text(tmp)
    _train(tmp / "short", text, "--steps", "3", "--warmup", "2", "--dropout", "0.1")
    _train(tmp / "long", text, "--steps", "7", "--warmup", "2", "--dropout", "0.1")
    return tmp, text


@pytest.mark.parametrize("how", ["finished", "twice"])
def test_an_extended_run_is_the_run_configured_that_long(runs, how, tmp_path):
    tmp, _ = runs
    run = tmp_path / "run"
    shutil.copytree(tmp / "short", run)
    for steps in (["5", "7"] if how == "twice" else ["7"]):
        code, out, err = run_cli(["train", "--resume", run, "--steps", steps, "--quiet"])
        assert code == 0 and f"to {steps} steps" in out + err, err
    mine, theirs = load_checkpoint(run / "checkpoint.npz"), load_checkpoint(
        tmp / "long" / "checkpoint.npz")
    assert mine.step == theirs.step == 7 and mine.options == theirs.options
    for name in theirs.params:
        np.testing.assert_array_equal(mine.params[name], theirs.params[name], err_msg=name)
        np.testing.assert_array_equal(mine.adam_m[name], theirs.adam_m[name], err_msg=name)
    # every dropout mask drawn the same (the sampler's generator differs: the short run's
    # report drew its sample)
    dropout = [k for k in theirs.rng if k.startswith("dropout.")]
    assert dropout and all(mine.rng[k] == theirs.rng[k] for k in dropout)
    assert _losses(run) == _losses(tmp / "long")
    # negative control: the short run's weights are not the long run's
    short = load_checkpoint(tmp / "short" / "checkpoint.npz")
    assert any(not np.array_equal(short.params[n], theirs.params[n]) for n in theirs.params)


def test_extending_is_refused_where_it_cannot_be_exact(runs, tmp_path):
    tmp, text = runs
    _train(tmp_path / "cos", text, "--steps", "3", "--schedule", "cosine", "--warmup", "1")
    code, _, err = run_cli(["train", "--resume", tmp_path / "cos", "--steps", "6", "--quiet"])
    assert code == 2 and one_line_error(err) and "cosine" in err, err
    code, _, err = run_cli(["train", "--resume", tmp / "long", "--steps", "2", "--quiet"])
    assert code == 2 and one_line_error(err) and "made 7 steps" in err, err
    code, _, err = run_cli(["train", "--resume", tmp / "long", "--lr", "0.1", "--quiet"])
    assert code == 2 and one_line_error(err) and "drop --lr" in err, err

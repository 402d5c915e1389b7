"""``numpy_transformer.load_run``: a run folder of ``numpy-transformer train`` back in Python."""

from __future__ import annotations

import numpy as np
import pytest
from _run_helpers import TINY, run_cli, small_text

import numpy_transformer as nt
from numpy_transformer.checkpoint import CheckpointError, load_checkpoint
from numpy_transformer.runs.options import TASKS


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("load")
    text = small_text(folder)
    code, _, err = run_cli(["train", "--text", text, *TINY, "--steps", "3", "--dropout", "0.1",
                            "--out", folder / "run", "--quiet"])
    assert code == 0, err
    return folder / "run"


def test_the_model_is_the_checkpoints_weights_in_eval_mode(lm_run):
    run = nt.load_run(lm_run)
    ckpt = load_checkpoint(lm_run / "checkpoint.npz")
    assert run.step == ckpt.step == 3 and run.options.steps == 3
    assert run.config.width == 16 and run.config.dropout == 0.1 and run.model.config is run.config
    assert not run.model.training  # dropout off, as sample uses it
    for name, param, _ in run.model.named_parameters():
        np.testing.assert_array_equal(param, ckpt.params[name])
    ids = run.tokenizer.encode("def main")[None]
    first = run.model.forward(ids)
    np.testing.assert_array_equal(first, run.model.forward(ids))  # no dropout mask: repeatable
    assert run.tokenizer.decode(run.tokenizer.encode("def ")) == "def "


def test_a_synthetic_task_has_no_tokenizer(tmp_path):
    assert "sort" in TASKS
    code, _, err = run_cli(["train", "--task", "sort", "--steps", "2", "--out", tmp_path / "s",
                            "--quiet"])
    assert code == 0, err
    run = nt.load_run(tmp_path / "s" / "checkpoint.npz")
    assert run.tokenizer is None and type(run.model).__name__ == "EncoderClassifier"


def test_a_folder_without_a_checkpoint_is_refused_naming_it(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint.npz"):
        nt.load_run(tmp_path)

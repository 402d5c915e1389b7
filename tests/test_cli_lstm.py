"""``numpy-transformer train --model lstm``: the chapter's third model from the command line.

Its defaults are the size of the three-way comparison, a run writes the files of a language
model but the attention map, samples carrying its state and exports to safetensors, and the
options of the other model are refused with one line and exit code 2. That it resumes bit for
bit is in ``test_resume.py``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _run_helpers import one_line_error, run_cli, small_text

from numpy_transformer.nn import LSTMLM, LSTMConfig
from numpy_transformer.runs.options import resolve_options
from numpy_transformer.runs.stored import model_from_checkpoint

TINY_LSTM = ["--model", "lstm", "--hidden", "12", "--embed", "6", "--context", "16",
             "--batch", "4"]


@pytest.fixture(scope="module")
def lstm_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lstm")
    code, out, err = run_cli(["train", *TINY_LSTM, "--text", small_text(tmp), "--steps", "8",
                              "--eval-every", "4", "--save-every", "4", "--out", tmp / "run",
                              "--quiet"])
    assert code == 0, err
    return tmp / "run", out


def test_default_lstm_is_the_size_of_the_chapter_transformer():
    fields, options = resolve_options("lm", {"model": "lstm"})
    assert options.model == "lstm"
    assert (fields["hidden"], fields["embed"], fields["layers"], fields["max_len"]) == (
        128, 85, 1, 100)
    assert "width" not in fields and "heads" not in fields
    assert LSTMConfig(vocab=104, **fields) == LSTMConfig.chapter()  # the preset it trains
    params = LSTMLM(LSTMConfig(vocab=104, **fields)).num_parameters()
    assert params == 132336 and abs(params - 132488) / 132488 < 0.01  # within 1% of 132,488


def test_lstm_run_folder(lstm_run):
    run_dir, out = lstm_run
    names = {p.name for p in run_dir.iterdir()}
    assert names == {"checkpoint.npz", "best.npz", "log.jsonl", "loss.png", "config.json",
                     "sample.txt"}
    assert "LSTMLM" in out
    description = json.loads((run_dir / "config.json").read_text())
    assert description["options"]["model"] == "lstm"
    model, tokenizer, _ = model_from_checkpoint(run_dir / "checkpoint.npz")
    assert isinstance(model, LSTMLM) and model.config.hidden == 12 and tokenizer is not None


def test_lstm_sample_is_repeatable(lstm_run):
    run_dir, _ = lstm_run
    argv = ["sample", run_dir, "--prompt", "def ", "--length", "30", "--seed", "3"]
    first, second = run_cli(argv), run_cli(argv)
    assert first[0] == 0 and first == second
    assert first[1].startswith("def ")
    other = run_cli([*argv[:-1], "4"])
    assert other[0] == 0 and other[1] != first[1]  # the seed matters


def test_lstm_exports_to_safetensors_and_back(lstm_run, tmp_path):
    pytest.importorskip("safetensors.numpy", reason="the export needs safetensors")
    from numpy_transformer.export import load_safetensors

    run_dir, _ = lstm_run
    code, _, err = run_cli(["export", run_dir, "--out", tmp_path / "st"])
    assert code == 0, err
    exported = load_safetensors(tmp_path / "st" / "model.safetensors")
    model = model_from_checkpoint(run_dir / "checkpoint.npz")[0]
    assert isinstance(exported.model, LSTMLM)
    tokens = np.random.default_rng(0).integers(0, model.config.vocab, (2, 9))
    np.testing.assert_array_equal(exported.model.forward(tokens), model.forward(tokens))


@pytest.mark.parametrize("argv, message", [
    (["--model", "lstm", "--width", "32"], "--width is an option of --model transformer only"),
    (["--model", "lstm", "--heads", "2"], "--heads is an option of --model transformer only"),
    (["--hidden", "32"], "--hidden is an option of --model lstm only"),
    (["--model", "lstm", "--task", "sort"], "--model lstm is for --task lm"),
    (["--model", "lstm", "--hidden", "0"], "--hidden"),
    (["--model", "gru"], "--model"),
])
def test_options_of_the_other_model_are_refused(argv, message, tmp_path):
    code, _, err = run_cli(["train", *argv, "--steps", "2", "--out", tmp_path / "run"])
    assert code == 2 and one_line_error(err) and message in err, err
    assert not (tmp_path / "run").exists()


def test_hf_export_refuses_an_lstm(lstm_run, tmp_path):
    run_dir, _ = lstm_run
    code, _, err = run_cli(["export", run_dir, "--format", "hf", "--out", tmp_path / "hf"])
    assert code == 2 and one_line_error(err) and "LSTMLM" in err, err

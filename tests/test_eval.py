"""``numpy-transformer eval``: a run's language model measured on a text, in fixed windows."""

from __future__ import annotations

import math

import pytest
from _run_helpers import TINY, one_line_error, run_cli, small_text

import numpy_transformer as nt
from numpy_transformer.data import fixed_window_loss
from numpy_transformer.runs.evaluate import evaluate_run
from numpy_transformer.runs.folder import read_log


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eval")
    code, _, err = run_cli(["train", "--text", small_text(tmp), *TINY, "--steps", "3",
                            "--out", tmp / "run", "--quiet"])
    assert code == 0, err
    return tmp / "run"


def test_without_a_text_it_is_the_held_out_loss_of_the_report(lm_run):
    final = [r for r in read_log(lm_run) if r.get("final")][-1]
    measured = evaluate_run(lm_run)
    assert measured.loss == pytest.approx(final["val_loss"], rel=1e-12)
    assert measured.source.startswith("the held-out 10% of")


def test_on_a_text_the_numbers_are_the_fixed_window_loss(lm_run, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("def f(x):\n    return x + 1\n" * 30, encoding="utf-8")
    code, out, err = run_cli(["eval", lm_run, "--text", text])
    assert code == 0, err
    run = nt.load_run(lm_run)
    ids = run.tokenizer.encode(text.read_text(encoding="utf-8"))
    loss = fixed_window_loss(run.model.forward, ids, run.config.max_len)
    windows = math.ceil((len(ids) - 1) / run.config.max_len)
    assert f"{len(ids):,} characters in {windows} fixed windows of 16" in out
    assert f"loss {loss:.4f} nats per character" in out
    assert f"perplexity {math.exp(loss):.3f}" in out
    assert f"{loss / math.log(2):.4f} bits per character" in out
    # negative control: another text, another loss
    assert evaluate_run(lm_run).loss != pytest.approx(loss)


def test_refusals_are_one_line(lm_run, tmp_path):
    (tmp_path / "odd.txt").write_text("def \u2603", encoding="utf-8")
    (tmp_path / "one.txt").write_text("d", encoding="utf-8")
    code, _, err = run_cli(["train", "--task", "sort", "--steps", "1", "--out", tmp_path / "s",
                            "--quiet"])
    assert code == 0, err
    for argv, message in ((["--text", tmp_path / "odd.txt"], "\u2603"),
                          (["--text", tmp_path / "one.txt"], "at least 2"),
                          (["--text", tmp_path / "none.txt"], "none.txt")):
        code, _, err = run_cli(["eval", lm_run, *argv])
        assert code == 2 and one_line_error(err) and message in err, err
    code, _, err = run_cli(["eval", tmp_path / "s"])
    assert code == 2 and one_line_error(err) and "--task lm" in err, err

"""``train --init-from SOURCE``: a new run from another model's weights, on a new text."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _run_helpers import TINY, one_line_error, resumed_to_equal_steps, run_cli, small_text

from numpy_transformer.checkpoint import load_checkpoint
from numpy_transformer.corpus import load_corpus
from numpy_transformer.data import fingerprint
from numpy_transformer.functional.softmax import cross_entropy_forward
from numpy_transformer.runs.folder import read_log
from numpy_transformer.runs.stored import load_run, read_run, rebuild_run

# GPT-2's shape, so that the source can also be exported as a Hugging Face folder
GPT2 = ["--positions", "learned", "--norm", "layernorm", "--activation", "gelu_tanh",
        "--tie-embeddings", "--bias", "--no-embed-scale"]


def _train(*argv) -> str:
    code, out, err = run_cli(["train", "--quiet", "--eval-every", "0", *argv])
    assert code == 0, err
    return out


def _losses(folder) -> list[float]:
    return [r["loss"] for r in read_log(folder) if "loss" in r]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A finished run of 4 steps on the first 6,000 characters of the corpus, and a new text:
    the next 20,000 characters, less those outside the source's vocabulary."""
    tmp = tmp_path_factory.mktemp("init_from")
    text = small_text(tmp)
    _train("--text", text, *TINY, *GPT2, "--steps", "4", "--out", tmp / "src")
    vocabulary = set(text.read_text(encoding="utf-8"))
    new = tmp / "new.txt"
    new.write_text("".join(ch for ch in load_corpus()[6000:26000] if ch in vocabulary),
                   encoding="utf-8")
    return tmp, new


def test_a_fine_tune_starts_from_the_source_weights_and_departs(source, tmp_path):
    tmp, new = source
    out = _train("--init-from", tmp / "src", "--text", new, "--steps", "40", "--batch", "8",
                 "--lr", "1e-2", "--optimizer", "adamw", "--out", tmp_path / "ft")
    src = load_checkpoint(tmp / "src" / "checkpoint.npz")
    ft = load_checkpoint(tmp_path / "ft" / "checkpoint.npz")
    record = json.loads((tmp_path / "ft" / "config.json").read_text())["started_from"]
    assert record == {"path": str(tmp / "src"), "weights_sha256": fingerprint(src.params),
                      "step": 4} == ft.meta["started_from"]
    assert record["weights_sha256"][:16] in out
    assert ft.step == 40 and ft.optimizer["kind"] == "AdamW" and ft.options["steps"] == 40
    assert ft.config == {**src.config, "seed": ft.config["seed"]}  # the source's model
    assert ft.tokenizer == src.tokenizer  # the source's tokenizer, not one of the new text
    # the first step's loss is the source model's loss on the new run's first batch
    run = rebuild_run(read_run(tmp_path / "ft"))
    batch = run.batch(0)
    model = load_run(tmp / "src").model.train()
    first, _ = cross_entropy_forward(model.forward(*batch.inputs), batch.targets)
    losses = _losses(tmp_path / "ft")
    assert losses[0] == pytest.approx(float(first), rel=1e-6)
    # ... and the run then departs: other weights, a lower loss on the new text
    assert any(not np.array_equal(src.params[n], ft.params[n]) for n in src.params)
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.2


def test_a_fine_tune_resumes_and_extends_bit_for_bit(source, tmp_path):
    tmp, new = source
    common = ["--init-from", tmp / "src", "--text", new, "--batch", "4"]
    _train(*common, "--steps", "3", "--out", tmp_path / "short")
    _train(*common, "--steps", "5", "--out", tmp_path / "long")
    mine, theirs = resumed_to_equal_steps(tmp_path / "short", tmp_path / "long", 5)
    assert mine.tokenizer == theirs.tokenizer and _losses(tmp_path / "short") == _losses(
        tmp_path / "long")
    assert json.loads((tmp_path / "short" / "config.json").read_text())["started_from"] == \
        theirs.meta["started_from"]


def test_a_text_with_characters_outside_the_vocabulary_is_refused(source, tmp_path):
    tmp, new = source
    strange = tmp_path / "strange.txt"
    strange.write_text(new.read_text(encoding="utf-8") + "☃ü", encoding="utf-8")
    code, _, err = run_cli(["train", "--init-from", tmp / "src", "--text", strange,
                            "--out", tmp_path / "ft", "--quiet"])
    assert code == 2 and one_line_error(err), err
    assert "2 character(s) outside" in err and "'ü☃'" in err
    assert not (tmp_path / "ft").exists()


def test_model_options_that_differ_from_the_source_are_refused_together(source, tmp_path):
    tmp, new = source
    argv = ["train", "--init-from", tmp / "src", "--text", new, "--out", tmp_path / "ft",
            "--quiet", "--steps", "2"]
    code, _, err = run_cli([*argv, "--width", "32", "--ffn-width", "8", "--heads", "2"])
    assert code == 2 and one_line_error(err), err
    assert "--width 32 (the source's: 16)" in err and "--ffn-width 8 (the source's: 32)" in err
    assert "--heads" not in err  # the source's own value is no conflict
    code, _, err = run_cli([*argv, "--heads", "2", "--backend", "numpy", "--dropout", "0.1"])
    assert code == 0, err  # what the weights do not fix is the new run's to choose


@pytest.mark.parametrize("what", ["missing", "text file", "task run", "task"])
def test_a_bad_source_is_refused_in_one_line(source, tmp_path, what):
    tmp, new = source
    target = {"missing": tmp_path / "nowhere", "text file": new, "task run": tmp_path / "sort",
              "task": tmp / "src"}[what]
    extra = ["--task", "sort"] if what == "task" else ["--text", new]
    if what == "task run":
        _train("--task", "sort", "--steps", "2", "--width", "16", "--heads", "2",
               "--ffn-width", "16", "--layers", "1", "--out", target)
    code, _, err = run_cli(["train", "--init-from", target, *extra, "--out", tmp_path / "ft",
                            "--quiet"])
    assert code == 2 and one_line_error(err), err
    assert {"missing": "no such file", "text file": "not a checkpoint",
            "task run": "holds a EncoderClassifier", "task": "not --task sort"}[what] in err
    assert not (tmp_path / "ft").exists()


@pytest.mark.parametrize("fmt", ["safetensors", "hf"])
def test_an_exported_folder_is_a_source(source, tmp_path, fmt):
    pytest.importorskip("safetensors")
    if fmt == "hf":
        pytest.importorskip("transformers")
    tmp, new = source
    code, _, err = run_cli(["export", tmp / "src", "--format", fmt, "--out", tmp_path / fmt])
    assert code == 0, err
    _train("--init-from", tmp_path / fmt, "--text", new, "--steps", "2", "--batch", "4",
           "--out", tmp_path / "ft")
    src = load_checkpoint(tmp / "src" / "checkpoint.npz")
    ft = load_checkpoint(tmp_path / "ft" / "checkpoint.npz")
    assert ft.meta["started_from"]["weights_sha256"] == fingerprint(src.params)
    assert ft.meta["started_from"]["path"] == str(tmp_path / fmt)
    assert ft.tokenizer == src.tokenizer

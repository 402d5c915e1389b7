"""A real run of format version 1 resumes bit for bit, forever.

``tests/fixtures/run_format1`` was written by the library at commit 3fa17c2 (format version 1)
and stopped by a real SIGINT after step 3 of 6 (``tests/fixtures/README.md``). Every later
version must resume it:

* resumed as it is, it equals the same state re-saved in today's format and resumed, to the
  last bit (weights, Adam's moments, generators, log): reading an old format changes nothing;
* its losses after the resume are those the uninterrupted run logged, to float64 rounding (the
  steps after the resume are computed on this machine, whose BLAS may round differently);
* a folder of a newer format is refused in one line naming both versions, and one lacking an
  option its format did not record resumes, saying in one line what was filled in.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from _run_helpers import TINY, one_line_error, run_cli, small_text

from numpy_transformer.checkpoint import FORMAT_VERSION, load_checkpoint
from numpy_transformer.runs.folder import read_log, write_description
from numpy_transformer.runs.loop import resume_run
from numpy_transformer.runs.options import OPTIONS, fill_missing
from numpy_transformer.runs.stored import read_run, rebuild_run

FIXTURES = Path(__file__).parent / "fixtures"
OLD_RUN = FIXTURES / "run_format1"
UNINTERRUPTED = FIXTURES / "run_format1.uninterrupted.jsonl"
CLOCK = ("tokens_per_s", "time")  # what a log line holds of the clock, not of the run


def copy_of_old_run(dest: Path) -> Path:
    shutil.copytree(OLD_RUN, dest)
    return dest


def rewrite_checkpoint(path: Path, **entries) -> None:
    """Replace entries of the checkpoint at ``path`` (JSON-able values as JSON)."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    for key, value in entries.items():
        arrays[key] = np.array(value if key == "format_version" else json.dumps(value))
    np.savez(path, **arrays)


def rewrite_config_json(run_dir: Path, edit) -> None:
    description = json.loads((run_dir / "config.json").read_text())
    edit(description)
    (run_dir / "config.json").write_text(json.dumps(description, indent=2))


def logged(run_dir: Path) -> list[dict]:
    """The log without the throughput, which is the only thing in it that is timed."""
    return [{k: v for k, v in r.items() if k not in CLOCK} for r in read_log(run_dir)]


def assert_same_run(a: Path, b: Path) -> None:
    """Same log, weights, Adam moments and generators, to the last bit."""
    assert logged(a) == logged(b)
    ca, cb = load_checkpoint(a / "checkpoint.npz"), load_checkpoint(b / "checkpoint.npz")
    assert ca.step == cb.step == 6 and ca.meta["finished"] and cb.meta["finished"]
    for group in ("params", "adam_m", "adam_v"):
        ga, gb = getattr(ca, group), getattr(cb, group)
        assert set(ga) == set(gb)
        for name in ga:
            assert ga[name].tobytes() == gb[name].tobytes(), f"{group} {name}"
    assert ca.rng == cb.rng and ca.config == cb.config and ca.options == cb.options


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """The old run, resumed as it is by today's library; and what it said."""
    run_dir = copy_of_old_run(tmp_path_factory.mktemp("old") / "run")
    code, out, err = run_cli(["train", "--resume", run_dir, "--quiet"])
    assert code == 0, err
    return run_dir, out


def test_the_fixture_is_a_stopped_run_of_format_1():
    ckpt = load_checkpoint(OLD_RUN / "checkpoint.npz")
    assert ckpt.version == 1 < FORMAT_VERSION and ckpt.step == 3 and not ckpt.meta["finished"]
    assert "format_version" not in json.loads((OLD_RUN / "config.json").read_text())
    assert [r["step"] for r in read_log(OLD_RUN) if "loss" in r] == [1, 2, 3]


def test_the_old_run_resumes_as_the_same_state_saved_today(resumed, tmp_path):
    old, out = resumed
    assert "resuming" in out and "at step 3 of 6" in out
    today = copy_of_old_run(tmp_path / "today")
    run = rebuild_run(read_run(today))
    run.save(today / "checkpoint.npz")  # the same state, in today's format
    write_description(today, run.description())
    assert load_checkpoint(today / "checkpoint.npz").version == FORMAT_VERSION
    assert resume_run(today, progress=False) == 0
    assert_same_run(old, today)
    # the resumed folder is one of today's format
    assert load_checkpoint(old / "checkpoint.npz").version == FORMAT_VERSION
    description = json.loads((old / "config.json").read_text())
    assert description == json.loads((today / "config.json").read_text())
    assert description["format_version"] == FORMAT_VERSION


def test_the_old_run_continues_as_the_uninterrupted_run_did(resumed):
    """Steps 4 to 6 here, against the same steps of the run that was never stopped; the
    steps and keys exactly, every number to 1e-12 relative."""
    got = logged(resumed[0])
    want = [{k: v for k, v in json.loads(line).items() if k not in CLOCK}
            for line in UNINTERRUPTED.read_text().splitlines()]
    assert len(got) == len(want) == 8
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys() and g["step"] == w["step"]
        for key in g.keys() - {"step", "final"}:
            assert g[key] == pytest.approx(w[key], rel=1e-12, abs=0), (g["step"], key)


def test_a_newer_format_is_refused_naming_both_versions(tmp_path):
    newer = FORMAT_VERSION + 1
    run_dir = copy_of_old_run(tmp_path / "run")
    rewrite_checkpoint(run_dir / "checkpoint.npz", format_version=newer)
    for argv in (["train", "--resume", run_dir], ["export", run_dir, "--out", tmp_path / "x"]):
        code, _, err = run_cli(argv)
        assert code == 2 and one_line_error(err), err
        assert f"format version {newer}" in err and f"1 to {FORMAT_VERSION}" in err
    (run_dir / "checkpoint.npz").unlink()  # a folder stopped before its first save
    rewrite_config_json(run_dir, lambda d: d.update(format_version=newer))
    code, _, err = run_cli(["train", "--resume", run_dir])
    assert code == 2 and one_line_error(err) and f"format version {newer}" in err, err
    assert "config.json" in err
    assert not (run_dir / "checkpoint.npz").exists()


def _without_model(run_dir: Path, version: int | None = None) -> None:
    """What a folder written before --model holds: options without "model". With a
    ``version``, stamped as that version, every other option it records filled in."""
    ckpt = load_checkpoint(run_dir / "checkpoint.npz")
    options = ckpt.options if version is None else fill_missing(ckpt.config, ckpt.options,
                                                                 ckpt.version)[1]
    options = {k: v for k, v in options.items() if k != "model"}
    rewrite_checkpoint(run_dir / "checkpoint.npz", options=options,
                       **({} if version is None else {"format_version": version}))
    rewrite_config_json(run_dir, lambda d: d["options"].pop("model"))


def test_a_folder_lacking_an_option_resumes_saying_what_was_filled_in(resumed, tmp_path):
    run_dir = copy_of_old_run(tmp_path / "run")
    _without_model(run_dir)
    code, out, err = run_cli(["train", "--resume", run_dir, "--quiet"])
    assert code == 0, err
    notes = [line for line in out.splitlines() if "filled in" in line]
    assert len(notes) == 1 and "format version 1" in notes[0], out
    assert "--model transformer" in notes[0]
    assert_same_run(run_dir, resumed[0])
    assert json.loads((run_dir / "config.json").read_text())["options"]["model"] == \
        "transformer"


def test_sample_and_export_read_an_old_folder_as_resume_does(tmp_path):
    """A language model's folder of format 1 written before --model: sample gives the same
    text as from today's folder, saying on stderr (stdout is the text) what was filled in;
    export says it on stdout."""
    today = tmp_path / "today"
    code, _, err = run_cli(["train", *TINY, "--backend", "numpy", "--text",
                            small_text(tmp_path), "--steps", "2", "--out", today, "--quiet"])
    assert code == 0, err
    old = shutil.copytree(today, tmp_path / "old")
    _without_model(old, version=1)
    rewrite_config_json(old, lambda d: d.pop("format_version"))
    argv = ["--prompt", "def", "--length", "20", "--seed", "1"]
    code, text, err = run_cli(["sample", today, *argv])
    assert code == 0 and err == "", err
    code, old_text, err = run_cli(["sample", old, *argv])
    assert code == 0 and old_text == text
    assert len(err.splitlines()) == 1 and "--model transformer" in err, err
    pytest.importorskip("safetensors.numpy", reason="the export needs safetensors")
    code, out, err = run_cli(["export", old, "--out", tmp_path / "st"])
    assert code == 0, err
    assert "--model transformer" in [line for line in out.splitlines() if "filled in" in line][0]


def test_negative_control_an_option_lacking_where_its_format_records_it(tmp_path):
    """From the version that records it on, a missing option is a damaged file, not an old
    one: refused, not filled in."""
    run_dir = copy_of_old_run(tmp_path / "run")
    _without_model(run_dir, version=FORMAT_VERSION)
    code, _, err = run_cli(["train", "--resume", run_dir])
    assert code == 2 and one_line_error(err) and "no --model recorded" in err, err


def test_every_filled_option_names_a_version_this_library_reads():
    since = [o for o in OPTIONS if o.since is not None]
    assert since and all(1 < o.since[0] <= FORMAT_VERSION for o in since)
    config, options, filled = fill_missing({}, {}, 1)
    assert "--model transformer" in filled and options["model"] == "transformer"
    assert fill_missing(config, options, 1)[2] == []  # nothing left to fill
    assert fill_missing({}, {}, FORMAT_VERSION) == ({}, {}, [])  # today's records everything

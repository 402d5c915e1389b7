"""``train --config FILE.toml``: the options of a file, checked as the flags are; a flag wins."""

from __future__ import annotations

import pytest
from _run_helpers import one_line_error, run_cli, small_text

from numpy_transformer.checkpoint import load_checkpoint
from numpy_transformer.runs.options import read_config_file

TOML = """\
width = 16
heads = 2
layers = 1
ffn_width = 32
max_len = 16
batch = 4
steps = 2
norm_first = false
activation = "gelu"
"""


def test_the_file_sets_the_options_and_a_flag_wins(tmp_path):
    (tmp_path / "run.toml").write_text(TOML, encoding="utf-8")
    code, _, err = run_cli(["train", "--config", tmp_path / "run.toml", "--text",
                            small_text(tmp_path), "--steps", "3", "--out", tmp_path / "run",
                            "--quiet"])
    assert code == 0, err
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoint.npz")
    assert ckpt.config["width"] == 16 and ckpt.config["max_len"] == 16
    assert ckpt.config["norm_first"] is False and ckpt.config["activation"] == "gelu"
    assert ckpt.options["steps"] == 3 and ckpt.step == 3  # the flag, not the file's 2
    assert "config" not in ckpt.options  # config.json stays the record, the file is not one


@pytest.mark.parametrize("text, message", [
    ("width = 0\n", "--width 0: expected a positive integer"),
    ("width = \"wide\"\n", "--width 'wide': expected a positive integer"),
    ("norm = \"batchnorm\"\n", "--norm 'batchnorm': expected one of"),
    ("context = 64\n", "'context' is not an option a run records (its key is 'max_len')"),
    ("out = \"x\"\n", "'out' is not an option a run records"),
    ("width = \n", "not TOML"),
])
def test_a_bad_file_is_one_line_naming_it(text, message, tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    code, _, err = run_cli(["train", "--config", path, "--out", tmp_path / "run"])
    assert code == 2 and one_line_error(err) and "bad.toml" in err and message in err, err
    assert not (tmp_path / "run").exists()


def test_a_missing_file_and_resume_are_refused(tmp_path):
    code, _, err = run_cli(["train", "--config", tmp_path / "none.toml"])
    assert code == 2 and one_line_error(err) and "none.toml: no such TOML file" in err, err
    code, _, err = run_cli(["train", "--resume", tmp_path, "--config", tmp_path / "x.toml"])
    assert code == 2 and one_line_error(err) and "drop --config" in err, err


def test_every_recorded_option_can_come_from_a_file(tmp_path):
    from numpy_transformer.runs.options import MODELS, OPTIONS, applies, default_of

    lines = []
    for o in OPTIONS:
        if o.store and o.key != "text":
            value = default_of(o, "lm", next(m for m in MODELS if applies(o, m)))
            if value is not None:
                rendered = repr(value).lower() if isinstance(value, bool) else repr(value)
                lines.append(f"{o.key} = {rendered}".replace("'", '"'))
    (tmp_path / "all.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert len(read_config_file(tmp_path / "all.toml")) == len(lines) > 20

"""The command line: defaults, the run folder, sampling, gradcheck, bench, and bad input (one
line on stderr, exit code 2, nothing overwritten)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _run_helpers import PYTHON, TINY, one_line_error, run_cli, small_text

from numpy_transformer import cli, gradcheck_tables
from numpy_transformer.checkpoint import load_checkpoint, restamp_checkpoint
from numpy_transformer.nn import DecoderLM, TransformerConfig
from numpy_transformer.runs.folder import read_log
from numpy_transformer.runs.options import OPTIONS, resolve_options
from numpy_transformer.threads import available_cores
from numpy_transformer.train import Trainer


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One finished tiny LM run, shared by the tests that only read it."""
    tmp = tmp_path_factory.mktemp("tiny")
    code, out, err = run_cli(["train", *TINY, "--text", small_text(tmp), "--steps", "12",
                              "--eval-every", "6", "--save-every", "4", "--out", tmp / "run",
                              "--quiet"])
    assert code == 0, err
    return tmp / "run", out


# ------------------------------------------------------------------------------------ defaults

def test_default_train_is_the_chapter_char_model():
    fields, options = resolve_options("lm", {})
    chapter = dict(width=84, heads=4, layers=2, ffn_width=168, max_len=100, norm="layernorm",
                   activation="relu", positions="sinusoidal", norm_first=True, dropout=0.0,
                   embed_scale=True, tie_embeddings=False, bias=True, backend="numba",
                   dtype="float32")
    assert {k: fields[k] for k in chapter} == chapter  # (an option added since: its row's)
    assert (options.batch, options.lr, options.clip, options.optimizer, options.schedule,
            options.text) == (64, 2e-3, 1.0, "adam", "constant", None)
    assert 1000 <= options.steps <= 1500  # the chapter's 2,501 would take too long
    config = TransformerConfig(vocab=104, **fields)
    assert DecoderLM(config).num_parameters() == 132488  # the chapter's count
    assert config == TransformerConfig.chapter()  # the preset the command line trains
    args = cli.build_parser().parse_args(["train"])
    assert args.out is None and args.resume is None
    assert all(getattr(args, o.key) is None for o in OPTIONS)  # None: not given
    assert resolve_options(args.task, {}) == (fields, options)


def test_shape_flags_reach_the_config():
    """--bias, --tie-embeddings and --embed-scale, each with its --no- form (the shapes the
    Hugging Face export needs), override the task's default and only it."""
    def fields(argv, task="lm"):
        args = cli.build_parser().parse_args(["train", *argv])
        given = {o.key: getattr(args, o.key) for o in OPTIONS if o.store and o.key != "task"}
        return resolve_options(task, given)[0]

    keys = ("bias", "tie_embeddings", "embed_scale")
    assert [fields([])[k] for k in keys] == [True, False, True]
    assert [fields([], "sort")[k] for k in keys] == [True, False, False]
    changed = fields(["--no-bias", "--tie-embeddings", "--no-embed-scale"])
    assert [changed[k] for k in keys] == [False, True, False]
    assert fields(["--embed-scale"], "copy")["embed_scale"] is True


def test_help_of_every_command_has_an_example(capsys):
    for argv in ([], ["train"], ["sample"], ["gradcheck"], ["bench"]):
        with pytest.raises(SystemExit) as info:
            cli.main([*argv, "--help"])
        assert info.value.code == 0
        text = capsys.readouterr().out
        assert "example" in text and "numpy-transformer" in text, argv


def test_console_script_and_python_dash_m():
    proc = subprocess.run([PYTHON, "-m", "numpy_transformer", "--version"],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "numpy-transformer" in proc.stdout
    exe = shutil.which("numpy-transformer")
    if exe is None:
        pytest.skip("console script not installed (pip install -e .)")
    proc = subprocess.run([exe, "train", "--width", "0"], capture_output=True, text=True)
    assert proc.returncode == 2 and one_line_error(proc.stderr)


# ------------------------------------------------------------------------------------ a run

def test_run_folder_has_everything(tiny_run):
    run_dir, out = tiny_run
    names = {p.name for p in run_dir.iterdir()}
    assert names == {"checkpoint.npz", "best.npz", "log.jsonl", "loss.png", "attention.png",
                     "config.json", "sample.txt"}
    for png in ("loss.png", "attention.png"):
        assert (run_dir / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    records = read_log(run_dir)
    assert [r["step"] for r in records if "loss" in r] == list(range(1, 13))
    final = [r for r in records if r.get("final")]
    assert len(final) == 1 and np.isfinite(final[0]["val_loss"])
    assert [r["step"] for r in records if "val_loss" in r] == [6, 12]
    assert "held-out loss" in out and "sample (temperature" in out
    assert (run_dir / "sample.txt").read_text().strip() in out
    ckpt = load_checkpoint(run_dir / "checkpoint.npz")
    assert ckpt.step == 12 and ckpt.meta["finished"]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["config"]["width"] == 16 and config["options"]["steps"] == 12


@pytest.mark.parametrize("task", ["sort", "copy", "reverse"])
def test_synthetic_tasks_train(task, tmp_path):
    code, out, err = run_cli(["train", "--task", task, "--width", "16", "--heads", "2",
                              "--layers", "1", "--ffn-width", "16", "--batch", "8", "--steps",
                              "6", "--out", tmp_path / "run", "--quiet"])
    assert code == 0, err
    assert "accuracy" in out
    assert not (tmp_path / "run" / "sample.txt").exists()
    assert (tmp_path / "run" / "attention.png").exists()


def test_sample_is_repeatable_and_honours_options(tiny_run):
    run_dir, _ = tiny_run
    argv = ["sample", run_dir, "--prompt", "def f", "--length", "30", "--seed", "3"]
    code, a, _ = run_cli(argv)
    code2, b, _ = run_cli(argv)
    assert code == code2 == 0 and a == b and a.startswith("def f") and len(a) == 5 + 30 + 1
    _, c, _ = run_cli(argv[:-1] + ["4"])
    assert c != a
    code, g1, _ = run_cli(["sample", run_dir / "checkpoint.npz", "--greedy", "--length", "20",
                           "--seed", "1"])
    _, g2, _ = run_cli(["sample", run_dir, "--greedy", "--length", "20", "--seed", "2"])
    assert code == 0 and g1 == g2  # greedy ignores the seed
    code, _, err = run_cli(["sample", run_dir, "--top-k", "3", "--top-p", "0.9",
                            "--temperature", "0.5", "--length", "5"])
    assert code == 0, err


def test_sample_refuses_a_task_run(tmp_path):
    assert run_cli(["train", "--task", "sort", "--width", "16", "--heads", "2", "--layers", "1",
                    "--ffn-width", "16", "--steps", "2", "--out", tmp_path / "r",
                    "--quiet"])[0] == 0
    code, _, err = run_cli(["sample", tmp_path / "r"])
    assert code == 2 and one_line_error(err) and "language model" in err


# ------------------------------------------------------------------------------------ run folder

def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_a_default_train_whose_folder_holds_its_run_finished_says_so(tmp_path, monkeypatch):
    """``train`` without --out, again: its folder holds that run, finished, so it says so in
    one line and exits 0, writing nothing and no dated folder beside it. Negative controls:
    the same folder holding a different run, or this run stopped midway, is refused (exit 2)
    with one line naming the way out, and the folder is left as it was."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", *TINY, "--text", small_text(tmp_path), "--quiet"]
    assert run_cli([*argv, "--steps", "2"])[0] == 0
    run_dir = Path("runs", "char-lm")
    before = _files(run_dir)
    code, out_finished, err = run_cli([*argv, "--steps", "2"])
    assert (code, err) == (0, "")
    assert out_finished.splitlines() == [
        f"{run_dir} already holds this run, finished: nothing to do (see its files, or "
        f"'numpy-transformer sample {run_dir}'; --force trains it again)"]
    assert _files(run_dir) == before and os.listdir("runs") == ["char-lm"]

    code, out, err = run_cli([*argv, "--steps", "2", "--lr", "0.01"])
    assert code == 2 and one_line_error(err) and "holds a different run (differs in lr)" in err
    assert "--out" in err and "--force" in err and not out
    code, _, err = run_cli([*argv, "--steps", "3"])  # a longer run: extend this one
    assert code == 2 and one_line_error(err)
    assert f"extend it: 'numpy-transformer train --resume {run_dir} --steps 3'" in err
    (run_dir / "sample.txt").unlink()  # stopped while writing its report
    code, _, err = run_cli([*argv, "--steps", "2"])
    assert code == 2 and one_line_error(err) and "stopped before writing its report" in err
    assert f"'numpy-transformer train --resume {run_dir}'" in err
    assert _files(run_dir) == {k: v for k, v in before.items() if k != "sample.txt"}
    ckpt = load_checkpoint(run_dir / "checkpoint.npz")
    restamp_checkpoint(run_dir / "checkpoint.npz", ckpt.options, {"finished": False})
    code, _, err = run_cli([*argv, "--steps", "2"])  # as if stopped after its last step
    assert code == 2 and one_line_error(err) and "this run, stopped at step 2" in err
    assert run_cli(["train", "--resume", run_dir, "--quiet"])[0] == 0  # the way out named
    assert run_cli([*argv, "--steps", "2"])[:2] == (0, out_finished)
    assert os.listdir("runs") == ["char-lm"]


def test_a_default_task_run_folder_holding_its_run_finished(tmp_path, monkeypatch):
    """A synthetic task's default folder follows the same rule; it has no text to sample."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--task", "sort", "--width", "16", "--heads", "2", "--layers", "1",
            "--ffn-width", "16", "--steps", "2", "--quiet"]
    assert run_cli(argv)[0] == 0
    code, out, _ = run_cli(argv)
    assert code == 0 and out.startswith("runs/sort already holds this run, finished")
    assert "sample" not in out
    code, _, err = run_cli([*argv, "--seed", "1"])
    assert code == 2 and one_line_error(err) and "different run (differs in seed)" in err
    assert os.listdir("runs") == ["sort"]


def test_explicit_folder_holding_a_run_is_refused_unless_force(tiny_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run[0], run_dir)
    text = small_text(tiny_run[0].parent)
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    base = ["train", *TINY, "--text", text, "--eval-every", "6", "--save-every", "4",
            "--out", run_dir, "--quiet"]
    code, _, err = run_cli(base + ["--steps", "12"])
    assert code == 2 and one_line_error(err) and "already holds this run, finished" in err
    assert "--force" in err
    code, _, err = run_cli(base + ["--steps", "13", "--lr", "0.01"])
    assert code == 2 and one_line_error(err) and "different run" in err
    assert "lr" in err and "steps" in err
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before
    (run_dir / "mine.txt").write_text("keep me")
    code, _, err = run_cli(base + ["--steps", "3", "--force"])
    assert code == 0, err
    assert load_checkpoint(run_dir / "checkpoint.npz").step == 3
    assert (run_dir / "mine.txt").read_text() == "keep me"


def test_non_empty_folder_without_a_run_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("precious")
    code, _, err = run_cli(["train", *TINY, "--text", small_text(tmp_path / ".."), "--steps",
                            "2", "--out", tmp_path, "--quiet"])
    assert code == 2 and one_line_error(err) and "holds no run" in err


def test_unwritable_run_folder(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("in the way")
    text = small_text(tmp_path)
    for out, pattern in ((blocker / "run", "is a file, not a folder"),
                         (blocker, "not a folder")):
        code, _, err = run_cli(["train", *TINY, "--text", text, "--steps", "2", "--out", out,
                                "--quiet"])
        assert code == 2 and one_line_error(err) and pattern in err, err


# ------------------------------------------------------------------------------------ divergence

def test_absurd_learning_rate_diverges_with_exit_1(tmp_path):
    code, _, err = run_cli(["train", *TINY, "--text", small_text(tmp_path), "--steps", "30",
                            "--lr", "1e30", "--out", tmp_path / "run", "--quiet"])
    assert code == 1
    assert one_line_error(err) and "diverged: step" in err and "untouched" in err
    assert "RuntimeWarning" not in err


def test_nan_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    """A NaN injected into the loss at step 7: exit 1, the step-5 checkpoint byte for byte."""
    run_dir = tmp_path / "run"
    original = Trainer.loss_and_grads
    seen = {}

    def poisoned(self, batch):
        loss = original(self, batch)
        if self.step_count + 1 == 7:
            seen["checkpoint"] = (run_dir / "checkpoint.npz").read_bytes()
            return float("nan")
        return loss

    monkeypatch.setattr(Trainer, "loss_and_grads", poisoned)
    code, _, err = run_cli(["train", *TINY, "--text", small_text(tmp_path), "--steps", "20",
                            "--save-every", "5", "--out", run_dir, "--quiet"])
    assert code == 1 and one_line_error(err)
    assert "step 7: the loss is nan" in err and "checkpoint (step 5)" in err
    assert (run_dir / "checkpoint.npz").read_bytes() == seen["checkpoint"]
    assert load_checkpoint(run_dir / "checkpoint.npz").step == 5


# ------------------------------------------------------------------------------------ bad input

def _bad_text_files(tmp_path):
    empty, binary, latin1 = tmp_path / "empty.txt", tmp_path / "bin.txt", tmp_path / "l1.txt"
    empty.write_bytes(b"")
    binary.write_bytes(b"abc\x00\x01\x02" * 50)
    latin1.write_bytes("café crème ".encode("latin-1") * 50)
    return {"missing": (tmp_path / "nope.txt", "no such file"), "empty": (empty, "empty"),
            "binary": (binary, "binary"), "non-utf8": (latin1, "not valid UTF-8")}


@pytest.mark.parametrize("kind", ["missing", "empty", "binary", "non-utf8"])
def test_bad_text_file(kind, tmp_path):
    path, pattern = _bad_text_files(tmp_path)[kind]
    code, _, err = run_cli(["train", "--text", path, "--out", tmp_path / "run"])
    assert code == 2 and one_line_error(err) and pattern in err, err
    assert not (tmp_path / "run").exists()


BAD_ARGS = {
    "unknown option": (["train", "--bogus"], "unrecognized arguments: --bogus"),
    "unknown command": (["fly"], "invalid choice"),
    "zero width": (["train", "--width", "0"], "positive integer"),
    "negative layers": (["train", "--layers", "-2"], "positive integer"),
    "zero steps": (["train", "--steps", "0"], "positive integer"),
    "negative lr": (["train", "--lr", "-1e-3"], "positive number"),
    "zero lr": (["train", "--lr", "0"], "positive number"),
    "nan lr": (["train", "--lr", "nan"], "positive number"),
    "text lr": (["train", "--lr", "fast"], "positive number"),
    "dropout one": (["train", "--dropout", "1"], "[0, 1)"),
    "negative clip": (["train", "--clip", "-1"], "number >= 0"),
    "heads do not divide": (["train", "--width", "30", "--heads", "4"], "does not divide"),
    "kv heads do not divide": (["train", "--kv-heads", "3"], "kv_heads=3 does not divide "
                                                             "heads=4"),
    "odd sinusoidal width": (["train", "--width", "15", "--heads", "3"], "even width"),
    "odd rope head": (["train", "--positions", "rope", "--width", "18", "--heads", "6"],
                      "rope needs an even head width"),
    "unknown norm": (["train", "--norm", "batchnorm"], "invalid choice"),
    "warmup too long": (["train", "--schedule", "cosine", "--warmup", "50", "--steps", "50"],
                        "--warmup"),
    "text with a task": (["train", "--task", "sort", "--text", "x.txt"], "--text is for"),
    "copy context": (["train", "--task", "copy", "--context", "3"], "--context"),
    "top-p zero": (["sample", "--top-p", "0"], "(0, 1]"),
    "zero temperature": (["sample", "--temperature", "0"], "positive number"),
    "gradcheck tol": (["gradcheck", "--tol", "-1"], "positive number"),
    "bench config": (["bench", "--config", "everything"], "invalid choice"),
    "bench threads": (["bench", "--threads", "0"], "positive integer"),
    "bench busy": (["bench", "--busy", "-1"], "integer >= 0"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARGS))
def test_bad_arguments_give_one_line_and_exit_2(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv, pattern = BAD_ARGS[case]
    code, out, err = run_cli(argv)
    assert code == 2, (out, err)
    assert one_line_error(err) and pattern in err, err
    assert not (tmp_path / "runs").exists()


def test_context_longer_than_the_text(tmp_path):
    text = tmp_path / "short.txt"
    text.write_text("just a few characters of text, " * 3)
    code, _, err = run_cli(["train", "--text", text, "--context", "500", "--out",
                            tmp_path / "run"])
    assert code == 2 and one_line_error(err) and "fewer than one window" in err


def test_bad_sampling_and_resume_input(tiny_run, tmp_path):
    run_dir, _ = tiny_run
    cases = [
        (["sample", run_dir, "--prompt", "snow \u2603"], "'\u2603'"),
        (["sample", run_dir, "--prompt", ""], "empty"),
        (["sample", tmp_path / "nothing"], "no such file or folder"),
        (["train", "--resume", tmp_path / "nothing"], "no such run folder"),
        (["train", "--resume", run_dir, "--width", "8"], "drop --width"),
        (["train", "--resume", run_dir, "--force"], "drop --force"),
    ]
    fake = tmp_path / "fake.npz"
    fake.write_text("not a checkpoint")
    cases.append((["sample", fake], "not an .npz"))
    for argv, pattern in cases:
        code, _, err = run_cli(argv)
        assert code == 2 and one_line_error(err) and pattern in err, (argv, err)


# ----------------------------------------------------------------------- gradcheck, bench

def test_gradcheck_exit_codes(monkeypatch):
    calls = []
    monkeypatch.setattr(gradcheck_tables, "print_tables",
                        lambda names=None, tol=1e-6: calls.append((names, tol)) or True)
    assert run_cli(["gradcheck", "--tol", "1e-7"])[0] == 0
    assert calls[-1] == (None, 1e-7)
    monkeypatch.setattr(gradcheck_tables, "print_tables", lambda names=None, tol=1e-6: False)
    code, _, err = run_cli(["gradcheck"])
    assert code == 1 and "FAILED" in err
    names = list(gradcheck_tables.SECTIONS)
    code, out, _ = run_cli(["gradcheck", "--list"])
    assert code == 0 and out.split() == names
    code, _, err = run_cli(["gradcheck", "no-such-piece"])
    assert code == 2 and one_line_error(err) and names[0] in err


def test_gradcheck_really_runs_one_piece():
    code, out, err = run_cli(["gradcheck", "ops"])
    assert code == 0, out + err


@pytest.mark.slow  # the whole quick benchmark: pytest -m slow (CI runs it too)
def test_bench_quick_runs_outside_the_checkout(tmp_path):
    """What users run after ``pip install``: nothing of the source checkout is needed (the
    package comes from sys.path, the working directory is elsewhere)."""
    import numpy_transformer

    env = {**os.environ, "PYTHONPATH": str(Path(numpy_transformer.__file__).parents[1])}
    proc = subprocess.run([PYTHON, "-m", "numpy_transformer", "bench", "--quick", "--threads",
                           "1"], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in proc.stdout.splitlines() if line.startswith("| ")}
    ours, theirs, ratio = rows["training step (ms)"]
    assert float(ours) > 0
    cold = rows["first step, empty compile cache (s)"]
    assert float(cold[0]) > float(rows["first step, compiled kernels cached (s)"][0])
    assert float(rows["effective GFLOP/s"][0]) > 0
    fraction = next(v for k, v in rows.items() if k.startswith("fraction of the products' rate"))
    assert float(fraction[0]) > 0
    assert any(line.startswith("BLAS: ") for line in proc.stdout.splitlines())
    if importlib.util.find_spec("torch") is None:
        assert theirs == "not installed"
    else:
        assert float(ratio) == pytest.approx(float(ours) / float(theirs), rel=0.02)
    assert not any(tmp_path.iterdir())  # nothing left behind


def test_interpreter_has_no_warnings_on_import():
    proc = subprocess.run([sys.executable, "-W", "error", "-c", "import numpy_transformer.cli"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_train_shows_progress_without_quiet(tmp_path):
    code, _, err = run_cli(["train", *TINY, "--text", small_text(tmp_path), "--steps", "3",
                            "--out", tmp_path / "run"])
    assert code == 0 and "step 3/3" in err and "tok/s" in err


@pytest.mark.parametrize("threads", [available_cores() + 1, 10**12])
def test_bench_refuses_more_threads_than_cores_in_one_line(threads):
    code, _, err = run_cli(["bench", "--quick", "--threads", str(threads)])
    assert code == 2 and one_line_error(err) and f"--threads {threads}" in err, err
    assert f"{available_cores()} core" in err

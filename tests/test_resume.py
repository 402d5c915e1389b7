"""Exact resume: stop at step k (in-process or by a real signal), resume, and get bit for bit the
per-step losses and final weights of the run that was never stopped."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import numpy as np
import pytest
from _run_helpers import PYTHON, TINY, TINY_FIELDS, one_line_error, run_cli, small_text

from numpy_transformer.checkpoint import load_checkpoint
from numpy_transformer.runs.folder import read_log
from numpy_transformer.runs.loop import resume_run, start_run
from numpy_transformer.runs.options import resolve_options
from numpy_transformer.runs.outputs import UsageError
from numpy_transformer.train import Trainer

STEPS = 24


def options(task, tmp_path, **extra):
    given = dict(TINY_FIELDS, steps=STEPS, save_every=5, eval_every=10, dropout=0.1, **extra)
    if task == "lstm":  # the LM's recipe with --model lstm (no dropout option)
        given = dict(model="lstm", hidden=12, embed=6, layers=2, max_len=16, batch=4,
                     steps=STEPS, save_every=5, eval_every=10, **extra)
        task = "lm"
    if task == "lm-numba":
        task, given["backend"] = "lm", "numba"
    if task == "lm":
        given["text"] = small_text(tmp_path)
    else:
        given["max_len"] = 6
    return resolve_options(task, given)


def losses(run_dir):
    return [(r["step"], r["loss"]) for r in read_log(run_dir) if "loss" in r]


def evals(run_dir):
    return [(r["step"], r["val_loss"]) for r in read_log(run_dir)
            if "val_loss" in r]


def assert_same_run(a, b):
    """Same per-step losses, held-out losses, weights and Adam moments, to the last bit."""
    assert losses(a) == losses(b)
    assert evals(a) == evals(b)
    ca, cb = load_checkpoint(a / "checkpoint.npz"), load_checkpoint(b / "checkpoint.npz")
    assert ca.step == cb.step and ca.meta["finished"] and cb.meta["finished"]
    for group in ("params", "adam_m", "adam_v"):
        ga, gb = getattr(ca, group), getattr(cb, group)
        assert set(ga) == set(gb)
        for name in ga:
            assert ga[name].tobytes() == gb[name].tobytes(), f"{group} {name}"
    assert ca.rng == cb.rng
    if (a / "sample.txt").exists():
        assert (a / "sample.txt").read_text() == (b / "sample.txt").read_text()


def stop_at(monkeypatch, k, signum=signal.SIGINT):
    """Deliver a real ``signum`` to this process right after update ``k``."""
    original = Trainer.step

    def step(self, batch):
        record = original(self, batch)
        if record.step == k:
            signal.raise_signal(signum)
        return record

    monkeypatch.setattr(Trainer, "step", step)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Uninterrupted runs, one per task, made once."""
    made = {}

    def get(task):
        if task not in made:
            tmp = tmp_path_factory.mktemp(f"ref-{task}")
            fields, opts = options(task, tmp)
            assert start_run(fields, opts, str(tmp / "run"), False, progress=False) == 0
            made[task] = tmp / "run"
        return made[task]

    return get


@pytest.mark.parametrize("task,k", [("lm", 7), ("lm", 10), ("sort", 13), ("reverse", 3),
                                    ("copy", 5), ("lm-numba", 9),
                                    ("lstm", 8)])
def test_stop_and_resume_is_bit_exact(task, k, reference, tmp_path, monkeypatch, capsys):
    """k = 10 stops right after a periodic checkpoint; the others between two. "lm-numba"
    uses the fused attention kernel (which, like the numba Adam, is deterministic)."""
    fields, opts = options(task, tmp_path)
    run_dir = tmp_path / "run"
    with monkeypatch.context() as m:
        stop_at(m, k)
        assert start_run(fields, opts, str(run_dir), False, progress=False) == 130
    assert "--resume" in capsys.readouterr().err
    assert load_checkpoint(run_dir / "checkpoint.npz").step == k
    assert resume_run(run_dir, progress=False) == 0
    assert_same_run(run_dir, reference(task))


@pytest.mark.parametrize("task,state", [("lm", "dropout.decoder.blocks.0.drop1"),
                                        ("sort", "data")])
def test_negative_control_lost_generator_state_changes_the_run(task, state, reference,
                                                               tmp_path, monkeypatch):
    """Without its saved generator state the resumed run differs: the exactness test above
    can fail, so its passing means something."""
    fields, opts = options(task, tmp_path)
    run_dir = tmp_path / "run"
    with monkeypatch.context() as m:
        stop_at(m, 7)
        assert start_run(fields, opts, str(run_dir), False, progress=False) == 130
    path = run_dir / "checkpoint.npz"
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    rng = json.loads(arrays["rng"].item())
    rng[state] = np.random.default_rng(12345).bit_generator.state
    arrays["rng"] = np.array(json.dumps(rng))
    np.savez(path, **arrays)
    assert resume_run(run_dir, progress=False) == 0
    assert losses(run_dir)[:7] == losses(reference(task))[:7]
    assert losses(run_dir)[7:] != losses(reference(task))[7:]


def test_resume_forgets_log_lines_written_after_the_checkpoint(reference, tmp_path,
                                                               monkeypatch):
    """A SIGKILL after step 9 leaves log lines past the step-5 checkpoint, and maybe half a
    line: they are dropped and recomputed, so each step appears once."""
    fields, opts = options("lm", tmp_path)
    run_dir = tmp_path / "run"
    with monkeypatch.context() as m:
        stop_at(m, 5)
        assert start_run(fields, opts, str(run_dir), False, progress=False) == 130
    with open(run_dir / "log.jsonl", "a") as log:
        log.write(json.dumps({"step": 6, "loss": 123.0}) + "\n" + '{"step": 7, "lo')
    assert resume_run(run_dir, progress=False) == 0
    assert [s for s, _ in losses(run_dir)] == list(range(1, STEPS + 1))
    assert_same_run(run_dir, reference("lm"))


def test_resume_of_a_finished_run_does_nothing(reference, tmp_path, capsys):
    import shutil

    run_dir = tmp_path / "done"
    shutil.copytree(reference("lm"), run_dir)
    before = (run_dir / "checkpoint.npz").read_bytes()
    assert resume_run(run_dir, progress=False) == 0
    assert "already finished" in capsys.readouterr().out
    assert (run_dir / "checkpoint.npz").read_bytes() == before


def test_same_run_stopped_in_a_folder_points_to_resume(tmp_path, monkeypatch):
    fields, opts = options("lm", tmp_path)
    run_dir = tmp_path / "run"
    with monkeypatch.context() as m:
        stop_at(m, 4)
        assert start_run(fields, opts, str(run_dir), False, progress=False) == 130
    with pytest.raises(UsageError, match=f"stopped at step 4; continue it with "
                       f"'numpy-transformer train --resume {run_dir}'"):
        start_run(fields, opts, str(run_dir), False, progress=False)


def test_resume_after_a_stop_during_the_report_writes_it_again(reference, tmp_path, capsys):
    """Stopped after the final checkpoint but before the sample: resume writes the report,
    with the same sample (the sampler's generator comes from the checkpoint)."""
    import shutil

    run_dir = tmp_path / "done"
    shutil.copytree(reference("lm"), run_dir)
    (run_dir / "sample.txt").unlink()
    assert resume_run(run_dir, progress=False) == 0
    assert "writing its report" in capsys.readouterr().out
    assert_same_run(run_dir, reference("lm"))
    assert sum(1 for r in read_log(run_dir) if r.get("final")) == 1


def test_resume_refuses_changed_training_text(tmp_path, monkeypatch):
    fields, opts = options("lm", tmp_path)
    run_dir = tmp_path / "run"
    with monkeypatch.context() as m:
        stop_at(m, 4)
        assert start_run(fields, opts, str(run_dir), False, progress=False) == 130
    small_text(tmp_path).write_text("something else entirely " * 100, encoding="utf-8")
    code, _, err = run_cli(["train", "--resume", run_dir, "--quiet"])
    assert code == 2 and one_line_error(err) and "training data changed" in err
    small_text(tmp_path).unlink()
    code, _, err = run_cli(["train", "--resume", run_dir, "--quiet"])
    assert code == 2 and one_line_error(err) and "no such file" in err


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_real_signal_to_a_training_process(signum, code, tmp_path):
    """A real signal to a real ``python -m numpy_transformer train``: the step in flight ends,
    a checkpoint is written, the exit code is 128 + signal; the resumed run equals the
    uninterrupted one bit for bit."""
    text = small_text(tmp_path)
    argv = ["train", *TINY, "--text", text, "--steps", "150", "--save-every", "7",
            "--eval-every", "50", "--dropout", "0.1", "--quiet"]
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    proc = subprocess.Popen([PYTHON, "-m", "numpy_transformer", *map(str, argv), "--out",
                             str(run_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    log, deadline = run_dir / "log.jsonl", time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and log.read_text().count("\n") >= 12:
            break
        time.sleep(0.02)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert f"numpy-transformer train --resume {run_dir}" in err and "Traceback" not in err
    stopped = load_checkpoint(run_dir / "checkpoint.npz")
    assert 12 <= stopped.step < 150 and not stopped.meta["finished"]
    resumed = subprocess.run([PYTHON, "-m", "numpy_transformer", "train", "--resume",
                              str(run_dir), "--quiet"], capture_output=True, text=True,
                             timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {run_dir} at step {stopped.step}" in resumed.stdout
    code_ref, _, _ = run_cli([*argv, "--out", ref_dir])
    assert code_ref == 0
    assert_same_run(run_dir, ref_dir)


def test_signal_handlers_are_restored_after_training(tmp_path, monkeypatch):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    fields, opts = options("lm", tmp_path)
    with monkeypatch.context() as m:
        stop_at(m, 3, signal.SIGTERM)
        assert start_run(fields, opts, str(tmp_path / "run"), False, progress=False) == 143
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before

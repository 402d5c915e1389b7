"""A stop at any moment, of any command: SIGINT or SIGTERM, and a second one while the first
is being handled. Each ends with 128 + the signal and one line, leaves no file half-written,
no temporary file and no worker process behind.

The in-process cases deliver real signals (``signal.raise_signal``) at chosen points of the
command, so the moment is exact; the subprocess cases signal a real command from outside.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _run_helpers import TINY, run_cli, small_text
from _subprocess_helpers import ROOT, cli, fsize_limit, one_line, refused

from numpy_transformer.checkpoint import load_checkpoint
from numpy_transformer.export import load_safetensors
from numpy_transformer.runs import export as run_export
from numpy_transformer.runs import report
from numpy_transformer.runs.state import Run
from numpy_transformer.train import Trainer

# a signal suite (real processes stopped and killed): pytest -m slow (CI runs it too)
pytestmark = pytest.mark.slow

SIGNALS = [(signal.SIGINT, 130), (signal.SIGTERM, 143)]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("signals")
    code, _, err = run_cli(["train", *TINY, "--text", small_text(tmp), "--steps", "3",
                            "--eval-every", "0", "--out", tmp / "run", "--quiet"])
    assert code == 0, err
    return tmp / "run"


def stray_files(folder: Path) -> list[str]:
    """Temporary files and staging folders (their names start with a dot) under ``folder``."""
    return [str(p) for p in folder.rglob(".*")]


def raise_then(signum: int, original, when=lambda *args: True):
    """``original`` preceded by a real ``signum`` (where ``when(*args)`` holds)."""
    def call(*args, **kwargs):
        if when(*args):
            signal.raise_signal(signum)
        return original(*args, **kwargs)
    return call


@pytest.mark.parametrize("signum, code", SIGNALS)
def test_export_stopped_midway_leaves_out_as_it_was(tiny_run, tmp_path, monkeypatch, signum,
                                                    code):
    """The signal comes after the weights were staged, and a second one during the clean-up
    (which must still remove the staging folder). A --force export into a folder holding an
    older export must leave that export whole."""
    pytest.importorskip("safetensors")  # the export writes it (the hf extra; CI installs it)
    out = tmp_path / "out"
    code0, _, err = run_cli(["export", tiny_run, "--out", out])
    assert code0 == 0, err
    before = (out / "model.safetensors").read_bytes()
    original_export = run_export.export_run

    def staged_then_stopped(staging, *args, **kwargs):
        files = original_export(staging, *args, **kwargs)
        assert all(Path(f).is_file() for f in files)
        signal.raise_signal(signum)
        return files

    rmtree = run_export.shutil.rmtree
    monkeypatch.setattr(run_export, "export_run", staged_then_stopped)
    monkeypatch.setattr(run_export.shutil, "rmtree",
                        raise_then(signal.SIGINT, rmtree))  # the second signal
    got, _, err = run_cli(["export", tiny_run, "--out", out, "--force"])
    assert got == code and signal.Signals(signum).name in one_line(err), err
    assert (out / "model.safetensors").read_bytes() == before
    assert stray_files(tmp_path) == []
    # negative control: without the signal the same command replaces the file
    monkeypatch.setattr(run_export, "export_run", original_export)
    monkeypatch.setattr(run_export.shutil, "rmtree", rmtree)
    assert run_cli(["export", tiny_run, "--out", out, "--force"])[0] == 0
    assert load_safetensors(out / "model.safetensors").info["step"] == 3


def test_a_signal_while_the_export_moves_its_files_in_waits_for_all_of_them(tiny_run, tmp_path,
                                                                            monkeypatch):
    pytest.importorskip("safetensors")  # the export writes it (the hf extra; CI installs it)
    out = tmp_path / "out"
    moved = []
    replace = os.replace

    def replace_then_signal(src, dst):
        replace(src, dst)
        moved.append(Path(dst).name)
        signal.raise_signal(signal.SIGTERM)  # held until every file is in place

    monkeypatch.setattr(run_export.os, "replace", replace_then_signal)
    code, _, err = run_cli(["export", tiny_run, "--out", out])
    assert code == 143 and "SIGTERM" in one_line(err), err
    assert sorted(moved) == ["model.safetensors", "optimizer.safetensors"]
    assert load_safetensors(out / "model.safetensors").info["step"] == 3
    assert stray_files(tmp_path) == []


@pytest.mark.parametrize("signum, code", SIGNALS)
def test_a_second_signal_during_the_save_is_not_a_traceback(tiny_run, tmp_path, monkeypatch,
                                                            signum, code):
    """The first signal after step 2 asks the loop to stop; the second comes in the middle of
    the save it starts. The save completes and the run resumes from it."""
    step = Trainer.step

    def step_then_signal(self, batch):
        record = step(self, batch)
        if record.step == 2:
            signal.raise_signal(signum)
        return record

    save = Run.save
    monkeypatch.setattr(Trainer, "step", step_then_signal)
    monkeypatch.setattr(Run, "save", raise_then(  # the second signal, in the stop's save
        signal.SIGINT, save, when=lambda run, *_: run.trainer.step_count == 2))
    run_dir = tmp_path / "run"
    got, _, err = run_cli(["train", *TINY, "--text", small_text(tmp_path), "--steps", "6",
                           "--eval-every", "0", "--out", run_dir, "--quiet"])
    assert got == code and "Traceback" not in err, err
    assert f"--resume {run_dir}" in err
    assert load_checkpoint(run_dir / "checkpoint.npz").step == 2
    assert stray_files(run_dir) == []


def test_a_signal_during_the_report_leaves_no_half_written_plot(tiny_run, tmp_path,
                                                               monkeypatch):
    """After the last step the run writes its plots and sample; a SIGTERM there stops the
    command with 143, the finished checkpoint stays, and no temporary file is left."""
    loss_plot = report.loss_plot
    monkeypatch.setattr(report, "loss_plot", raise_then(signal.SIGTERM, loss_plot))
    run_dir = tmp_path / "run"
    code, _, err = run_cli(["train", *TINY, "--text", small_text(tmp_path), "--steps", "3",
                            "--eval-every", "0", "--out", run_dir, "--quiet"])
    assert code == 143 and "SIGTERM" in one_line(err), err
    ckpt = load_checkpoint(run_dir / "checkpoint.npz")
    assert ckpt.step == 3 and ckpt.meta["finished"]
    assert not (run_dir / "loss.png").exists() and stray_files(run_dir) == []


def test_the_handlers_are_restored_after_every_command(tiny_run, tmp_path):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    code = run_cli(["export", tiny_run, "--out", tmp_path / "x"])[0]
    assert code == (0 if importlib.util.find_spec("safetensors") else 2)  # 2: no hf extra
    assert run_cli(["sample", tiny_run, "--length", "3"])[0] == 0
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


# ----------------------------------------------------------------------- real processes
def group_is_empty(pgid: int, timeout: float = 10) -> bool:
    """Whether every process of the group has exited (within ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


@pytest.mark.parametrize("signum, code", SIGNALS)
def test_bench_stopped_leaves_no_worker_behind(signum, code):
    """``bench --quick`` signalled twice once its workers run: exit 128 + signal, one line,
    and no process of its group left (the command starts it in a session of its own)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "numpy_transformer", "bench", "--quick"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        time.sleep(4)  # its workers are starting, compiling or timing by now
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signum)
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == code and "stopped by" in one_line(err), err
        assert group_is_empty(proc.pid), "a worker process outlived the command"
    finally:
        if not group_is_empty(proc.pid, timeout=0):
            os.killpg(proc.pid, signal.SIGKILL)


def test_an_empty_group_is_told_from_one_with_a_process():
    """Negative control of group_is_empty: a sleeping child keeps its group alive."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                            start_new_session=True)
    try:
        assert not group_is_empty(proc.pid, timeout=0.3)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert group_is_empty(proc.pid)


def test_export_under_a_file_size_limit_is_exit_74_naming_the_output(tiny_run, tmp_path):
    """``ulimit -f``: the weights file cannot be written whole. One line naming the output
    (not the staging file), exit 74, nothing left; the same command without the limit works
    (the negative control)."""
    pytest.importorskip("safetensors")  # the export writes it (the hf extra; CI installs it)
    out = tmp_path / "out"
    code, _, err = cli("export", tiny_run, "--out", out, preexec_fn=fsize_limit(10_000))
    refused(code, err, 74, f"{out}/model.safetensors", "File too large")
    assert list(tmp_path.iterdir()) == []
    code, _, err = cli("export", tiny_run, "--out", out)
    assert code == 0, err

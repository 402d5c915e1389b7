"""One rule for every file a command reads or writes (issue 43): the wrong kind of thing is
one line and exit 2, naming the file and what it is; a file that cannot be read or written is
one line and exit 74, naming the file and the system's reason.

* the wrong kind: a FIFO, a device, a socket or a folder where a file belongs (never opened:
  a FIFO would block), binary or non-UTF-8 text, a ``--config`` too large or nested too
  deeply, a file where a folder belongs (``--out FILE/sub`` for ``train``, ``import`` and
  ``export`` alike), a folder where a run's file belongs;
* cannot be read or written: mode 000 on ``--config``, a run's ``checkpoint.npz``,
  ``best.npz`` and ``log.jsonl``, an export's ``model.safetensors``, and a read-only folder
  for each command's ``--out``, through every command that reads or writes them;
* ``--force`` replaces only the files a run writes: the user's own ``tensorboard/`` notes
  stay.

The negative controls: a reader that decodes without checking says Python's words instead of
naming what the file is, a checkpoint reader that takes permission denied for "not a
checkpoint" fails the exit-74 case, and a ``--force`` that clears the whole folder loses the
note, each caught by the same assertions.
"""

from __future__ import annotations

import builtins
import importlib.util
import os
import shutil
import socket
from pathlib import Path

import pytest
from _run_helpers import TINY, one_line_error, run_cli, small_text
from _subprocess_helpers import cli, honour_permissions, refused

from numpy_transformer.checkpoint import CheckpointError
from numpy_transformer.runs import options
from numpy_transformer.runs.outputs import EXIT_IO, EXIT_USAGE

TRAIN = [*TINY, "--backend", "numpy", "--quiet"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A finished tiny run (with best.npz) and its text; its export where safetensors is."""
    tmp = tmp_path_factory.mktemp("file_rule")
    text = small_text(tmp)
    code, _, err = run_cli(["train", *TRAIN, "--text", text, "--steps", "2", "--eval-every", "1",
                            "--out", tmp / "run"])
    assert code == 0, err
    return tmp


def _copy(made: Path, name: str, dest: Path) -> Path:
    shutil.copytree(made / name, dest)
    return dest


# ----------------------------------------------------------------- the wrong kind: exit 2
def _thing(kind: str, where: Path) -> Path:
    """Make ``kind`` at ``where`` (a device is /dev/zero itself); return its path."""
    if kind == "fifo":
        os.mkfifo(where)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(where))
        sock.close()  # the socket file stays
    elif kind == "folder":
        where.mkdir()
    elif kind == "device":
        return Path("/dev/zero")
    elif kind == "binary":
        where.write_bytes(b"steps = 2\n\x00\x01\x02")
    elif kind == "not utf-8":
        where.write_bytes(b"steps = 2 # caf\xe9\n")
    elif kind == "oversized":
        where.write_bytes(b"# " + b"x" * (options.CONFIG_FILE_LIMIT + 1) + b"\n")
    elif kind == "nested":
        where.write_text("steps = " + "[" * 100_000 + "]" * 100_000 + "\n")
    return where


WHAT = {"fifo": "is a named pipe (FIFO)", "socket": "is a socket", "folder": "is a folder",
        "device": "is a character device", "binary": "looks like a binary file",
        "not utf-8": "not valid UTF-8 text (byte 0xe9 at offset 15)",
        "oversized": "too large for a TOML file", "nested": "nested too deeply",
        "missing": "no such TOML file"}


@pytest.mark.parametrize("kind", list(WHAT))
def test_a_config_file_of_the_wrong_kind_is_named(kind, tmp_path):
    """In a subprocess with a time limit: /dev/zero once grew to 12 GB, a FIFO hung."""
    path = _thing(kind, tmp_path / "run.toml")
    code, _, err = cli("train", "--config", path, "--out", tmp_path / "out", timeout=60)
    refused(code, err, EXIT_USAGE, f"--config {path}", WHAT[kind])
    assert not (tmp_path / "out").exists()


# In this process only what a reader that regressed would not hang on (a FIFO) or read
# forever (/dev/zero): the subprocess cases above and tests/test_failures.py have those.
@pytest.mark.parametrize("kind", ["socket", "folder", "binary", "not utf-8"])
def test_every_text_option_refuses_the_wrong_kind(kind, made, tmp_path):
    path = _thing(kind, tmp_path / "my.txt")
    argvs = [["train", *TRAIN, "--text", path, "--out", tmp_path / "out"],
             ["eval", made / "run", "--text", path]]
    if importlib.util.find_spec("safetensors"):
        argvs.append(["import", _export(made), "--out", tmp_path / "imp", "--text", path])
    for argv in argvs:
        code, _, err = run_cli(argv)
        assert code == EXIT_USAGE and one_line_error(err), (argv, err)
        message = WHAT[kind].replace("15", "0").replace("TOML ", "")
        assert str(path) in err and message.split(" (")[0] in err, (argv, err)


@pytest.mark.parametrize("kind", ["socket", "folder"])
def test_a_checkpoint_of_the_wrong_kind_is_named_by_every_reader(kind, made, tmp_path):
    run = _copy(made, "run", tmp_path / "run")
    (run / "checkpoint.npz").unlink()
    _thing(kind, run / "checkpoint.npz")
    for argv in (["sample", run, "--length", "3"], ["eval", run], ["export", run],
                 ["train", *TRAIN, "--init-from", run, "--text", made / "small.txt",
                  "--out", tmp_path / "ft"]):
        code, _, err = run_cli(argv)
        assert code == EXIT_USAGE and one_line_error(err), (argv, err)
        assert "checkpoint.npz" in err and WHAT[kind] in err, (argv, err)
    code, _, err = run_cli(["train", "--resume", run, "--quiet"])
    assert code == EXIT_USAGE and one_line_error(err) and WHAT[kind] in err, err


def test_a_folder_where_a_run_file_belongs_is_refused_before_training(made, tmp_path):
    run = _copy(made, "run", tmp_path / "run")
    (run / "best.npz").unlink()
    (run / "best.npz").mkdir()
    code, _, err = run_cli(["train", "--resume", run, "--steps", "4", "--quiet"])
    assert code == EXIT_USAGE and one_line_error(err), err
    assert "best.npz is a folder, not the run's file" in err
    (run / "log.jsonl").unlink()
    (run / "log.jsonl").mkdir()  # read by every command that reads the log: one line
    (run / "best.npz").rmdir()
    code, _, err = run_cli(["train", "--resume", run, "--steps", "4", "--quiet"])
    assert code == EXIT_USAGE and one_line_error(err) and "log.jsonl is a folder" in err, err


def test_a_log_with_a_line_of_bytes_resumes(made, tmp_path):
    """Its own log cut by a disk error or a kill mid-line: the bad line is skipped like a cut
    one, not a UnicodeDecodeError."""
    run = _copy(made, "run", tmp_path / "run")
    with open(run / "log.jsonl", "ab") as log:
        log.write(b'{"step": 1, "loss": \xff\xfe\n[[[[\n{"step": "x"}\n')
    code, out, err = run_cli(["train", "--resume", run, "--steps", "3", "--quiet"])
    assert code == 0, err


@pytest.mark.parametrize("command", ["train", "import", "export"])
def test_a_file_where_a_folder_belongs_is_the_same_refusal_everywhere(command, made,
                                                                      tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("mine")
    for out in (blocker / "sub", blocker, blocker / "sub" / "deeper"):
        argv = {"train": ["train", *TRAIN, "--text", made / "small.txt", "--steps", "1"],
                "import": ["import", _export(made), "--text", made / "small.txt"],
                "export": ["export", made / "run"]}[command] + ["--out", out]
        code, _, err = run_cli(argv)
        assert code == EXIT_USAGE and one_line_error(err), (argv, err)
        assert f"{out}: {blocker} is a file, not a folder" in err, err
    assert blocker.read_text() == "mine"


def _export(made: Path) -> Path:
    """The run's safetensors export (made once)."""
    pytest.importorskip("safetensors")
    if not (made / "export").exists():
        code, _, err = run_cli(["export", made / "run", "--out", made / "export"])
        assert code == 0, err
    return made / "export"


def test_an_unchecked_reader_is_caught(tmp_path, monkeypatch):
    """Negative control: --config read without the reader's checks (Python's own decoding,
    with its words) fails the assertion the reader passes."""
    path = _thing("not utf-8", tmp_path / "run.toml")

    def refused_naming_it():
        code, _, err = run_cli(["train", "--config", path])
        assert code == EXIT_USAGE and one_line_error(err) and WHAT["not utf-8"] in err, err

    refused_naming_it()
    monkeypatch.setattr(options, "read_file",
                        lambda p, *args, **kwargs: Path(p).read_text(encoding="utf-8"))
    with pytest.raises(AssertionError, match="codec can't decode"):
        refused_naming_it()


# --------------------------------------------------------- cannot be read or written: 74
@pytest.fixture
def denied():
    """A ``preexec_fn`` under which chmod 000 means what it says, even as root."""
    return honour_permissions()


def _unreadable(path: Path) -> Path:
    path.chmod(0)
    return path


@pytest.mark.slow
def test_an_unreadable_config_is_exit_74(denied, tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("steps = 2\n")
    _unreadable(path)
    code, _, err = cli("train", "--config", path, "--out", tmp_path / "out", preexec_fn=denied)
    refused(code, err, EXIT_IO, str(path), "Permission denied")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["checkpoint.npz", "best.npz"])
def test_an_unreadable_checkpoint_is_exit_74_from_every_reader(name, made, denied, tmp_path):
    run = _copy(made, "run", tmp_path / "run")
    _unreadable(run / name)
    best = ["--best"] if name == "best.npz" else []
    argvs = [["sample", run, "--length", "3", *best], ["eval", run, *best],
             ["export", run, "--out", tmp_path / "exp", *best]]
    if name == "checkpoint.npz":
        argvs += [["train", "--resume", run, "--steps", "3"],
                  ["train", *TRAIN, "--init-from", run, "--text", made / "small.txt",
                   "--out", tmp_path / "ft"]]
    else:
        argvs += [["train", *TRAIN, "--init-from", run / name, "--text", made / "small.txt",
                   "--out", tmp_path / "ft"]]
    for argv in argvs:
        code, _, err = cli(*argv, preexec_fn=denied)
        refused(code, err, EXIT_IO, name, "Permission denied")


@pytest.mark.slow
def test_an_unreadable_export_is_exit_74(made, denied, tmp_path):
    export = shutil.copytree(_export(made), tmp_path / "export")
    _unreadable(export / "model.safetensors")
    for argv in (["import", export, "--out", tmp_path / "imp", "--text", made / "small.txt"],
                 ["train", *TRAIN, "--init-from", export, "--text", made / "small.txt",
                  "--out", tmp_path / "ft"]):
        code, _, err = cli(*argv, preexec_fn=denied)
        refused(code, err, EXIT_IO, "model.safetensors", "Permission denied")


@pytest.mark.slow
def test_an_unreadable_log_is_exit_74(made, denied, tmp_path):
    run = _copy(made, "run", tmp_path / "run")
    _unreadable(run / "log.jsonl")
    code, _, err = cli("train", "--resume", run, "--steps", "3", preexec_fn=denied)
    refused(code, err, EXIT_IO, "log.jsonl", "Permission denied")


@pytest.mark.slow
@pytest.mark.parametrize("command", ["train", "import", "export"])
def test_a_read_only_out_is_exit_74(command, made, denied, tmp_path):
    parent = tmp_path / "ro"
    parent.mkdir()
    argv = {"train": ["train", *TRAIN, "--text", made / "small.txt", "--steps", "1"],
            "import": ["import", _export(made), "--text", made / "small.txt"],
            "export": ["export", made / "run"]}[command] + ["--out", parent / "out"]
    parent.chmod(0o555)
    try:
        code, _, err = cli(*argv, preexec_fn=denied)
    finally:
        parent.chmod(0o755)
    refused(code, err, EXIT_IO, str(parent / "out"), "Permission denied")
    assert list(parent.iterdir()) == []


def test_permission_denied_is_74_and_not_taken_for_a_broken_file(made, tmp_path, monkeypatch):
    """In this process (root reads anything, so the file's open is refused by a stub): the
    checkpoint that cannot be opened is exit 74 naming it. Negative control: a reader that
    takes the refusal for a broken archive, as zipfile.is_zipfile does, gives exit 2 and
    fails the same assertion."""
    run = _copy(made, "run", tmp_path / "run")
    target = str(run / "checkpoint.npz")
    real_open = builtins.open

    def refusing(file, *args, **kwargs):
        if str(file) == target:
            raise PermissionError(13, "Permission denied", target)
        return real_open(file, *args, **kwargs)

    def exit_74_naming_it():
        code, _, err = run_cli(["sample", run, "--length", "3"])
        assert code == EXIT_IO and one_line_error(err), err
        assert f"{target}: Permission denied" in err, err

    monkeypatch.setattr(builtins, "open", refusing)
    exit_74_naming_it()
    from numpy_transformer import checkpoint

    def broken_archive(path):  # the old reader: any OSError is "not a checkpoint"
        raise CheckpointError(f"{path}: not a checkpoint (not an .npz archive, or truncated)")

    monkeypatch.setattr(checkpoint, "_read_arrays", lambda path: broken_archive(path))
    with pytest.raises(AssertionError):
        exit_74_naming_it()


# --------------------------------------------------------------------- --force: ours only
def _events(folder: Path) -> list[Path]:
    return sorted((folder / "tensorboard").glob("events.out.tfevents.*"))


def _forced_keeps_the_users_files(made: Path, run: Path) -> None:
    code, _, err = run_cli(["train", *TRAIN, "--text", made / "small.txt", "--steps", "1",
                            "--out", run, "--force"])
    assert code == 0, err
    assert (run / "tensorboard" / "my-notes.txt").read_text() == "mine"
    assert (run / "notes.txt").read_text() == "also mine"
    assert not _events(run)  # the replaced run's events went with it


def test_force_replaces_only_the_files_a_run_writes(made, tmp_path, monkeypatch):
    pytest.importorskip("tensorboardX")
    run = tmp_path / "run"
    code, _, err = run_cli(["train", *TRAIN, "--text", made / "small.txt", "--steps", "1",
                            "--out", run, "--tensorboard"])
    assert code == 0 and _events(run), err
    (run / "tensorboard" / "my-notes.txt").write_text("mine")
    (run / "notes.txt").write_text("also mine")
    backup = tmp_path / "backup"
    shutil.copytree(run, backup)
    _forced_keeps_the_users_files(made, run)
    # negative control: a --force that clears everything under the folder loses the note
    from numpy_transformer.runs import folder

    monkeypatch.setattr(folder, "written_by_runs", lambda path: [
        p for p in path.rglob("*") if p.is_file() and p.name != ".lock"])
    with pytest.raises((AssertionError, FileNotFoundError)):
        _forced_keeps_the_users_files(made, backup)

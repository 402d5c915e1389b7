"""The run folder on disk: choosing and creating it, refusing to overwrite it, locking it, its
checkpoint's path, and its log.

The files a run folder holds, and what each contains, are listed once, in
:data:`numpy_transformer.runs.outputs.RUN_FILES`. Every path into a run folder is made here, and
so is what guards the folder as a whole:

* a new run goes into a folder that holds nothing else; one that holds a run is refused with
  one line saying which run and the way out (:func:`new_run_folder`), except that a
  ``train`` without ``--out`` whose own folder (``runs/char-lm``) holds that same run,
  finished, says so and has nothing to do (exit 0): each default run has one folder;
* a process that trains in a folder holds it (:class:`FolderLock`): a second ``train`` or
  ``--resume`` of the same folder is refused with one line naming the first one's pid;
* once a folder is held, the temporary files of atomic writes that a kill left behind
  (``.checkpoint.npz.*.tmp``) are removed: no other process can be writing them.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from pathlib import Path

from ..checkpoint import (
    FORMAT_VERSION,
    CheckpointError,
    check_format_version,
    decode_json,
    load_checkpoint,
)
from ..files import atomic_write_text, check_file, kind_of, read_file, temporary_names
from .options import default_run_folder, fill_missing
from .outputs import (
    BEST,
    CHECKPOINT,
    CONFIG,
    EVENT_FILES,
    EVENTS_FOLDER,
    LOG,
    REPORT_FILES,
    RUN_FILES,
    UsageError,
    files_of,
    say,
)

try:
    import fcntl
except ImportError:  # Windows: folders are not locked there
    fcntl = None

LOCK = ".lock"  # held by the process training in the folder; holds its pid


def checkpoint_path(target: str | Path, best: bool = False) -> Path:
    """A run folder means its ``checkpoint.npz`` (``best.npz`` with ``best``); a file is taken
    as it is."""
    target = Path(target)
    return target / (BEST if best else CHECKPOINT) if target.is_dir() else target


def log_path(run_dir: Path) -> Path:
    """The run's ``log.jsonl``."""
    return run_dir / LOG


def has_report(run_dir: Path, task: str, model: str) -> bool:
    """Whether ``run_dir`` holds every file of the report of a run of ``task`` and ``model``
    (what a run writes after its last step)."""
    return all((run_dir / name).exists() for name in files_of(task, model, REPORT_FILES))


# --------------------------------------------------------------------------------------------
# A new run's folder
# --------------------------------------------------------------------------------------------

def new_run_folder(out: str | None, description: dict, force: bool) -> FolderLock | None:
    """Choose, create and hold the folder of a new run; write its ``config.json``
    (``description``: :meth:`~.state.Run.description`) and an empty log. Returns the held
    folder (release it when the run ends: ``with``), or None when there is nothing to do.

    * No ``--out``: ``runs/char-lm`` (``runs/char-lstm`` for the LSTM, ``runs/<task>`` for
      the tasks), the one folder of each.
    * A folder that is not empty is refused (exit 2) with one line saying what it holds and
      what to do: no run, or a different one (``--out`` another folder, or ``--force``); this
      same run, stopped (``--resume`` it, or ``--force``); this same run, finished
      (``--force`` trains it again).
    * But the default folder holding this same run, finished and reported, is what the
      command was asked to make: said in one line, and None (exit 0, nothing written).
    * ``--force``: the files a run writes are removed first (:func:`written_by_runs`); other
      files are left alone.

    Raises
    ------
    UsageError
        When the folder may not be used (also: another process is training in it).
    OSError
        When it cannot be written (read-only, permission denied).
    """
    options = description["options"]
    path = Path(out) if out is not None else default_run_folder(options["task"],
                                                                  options["model"])
    check_folder_path(path, "run folder")
    path.mkdir(parents=True, exist_ok=True)
    lock = FolderLock(path)
    try:
        if _occupied(path):
            if not force:
                done, message = _what_it_holds(path, description, asked=out is not None)
                if not done:
                    raise UsageError(message)
                say(message)  # the folder the command chose holds this run, finished
                lock.release()
                return None
            check_run_files(path)
            for file in written_by_runs(path):
                file.unlink()
            with contextlib.suppress(OSError):  # not empty: the user's own files are in it
                (path / EVENTS_FOLDER).rmdir()
        write_description(path, description)
        log_path(path).write_text("", encoding="utf-8")
    except BaseException:
        lock.release()
        raise
    return lock


def written_by_runs(path: Path) -> list[Path]:
    """The files in run folder ``path`` that a run writes (what ``--force`` replaces): those of
    :data:`~.outputs.RUN_FILES`, and the event files of ``--tensorboard`` in their folder;
    nothing else there is ours."""
    ours = [path / name for name in RUN_FILES if os.path.lexists(path / name)]
    return ours + sorted((path / EVENTS_FOLDER).glob(EVENT_FILES))


def check_run_files(path: Path) -> None:
    """Refuse run folder ``path`` if a name of the run's files is taken by something other
    than a file (a folder, a FIFO...): the run would stop when it writes it.

    Raises
    ------
    UsageError
        Naming it and what it is (exit 2).
    """
    for name in RUN_FILES:
        file = path / name
        if os.path.lexists(file) and not file.is_file():
            mode = os.lstat(file).st_mode
            raise UsageError(f"{file} is {kind_of(mode)}, not the run's file; move it away")


def check_folder_path(path: Path, label: str) -> None:
    """Refuse a folder to write into (``label``: how the message calls it) where something
    else is in the way: ``path``, or the deepest of its parents that exists, is a file (or a
    FIFO, a device...). What is left to go wrong making it is the system's (permission
    denied, a read-only folder: ``OSError``, exit 74).

    Raises
    ------
    UsageError
        Naming ``path`` and what is in the way (exit 2: the wrong kind of thing).
    """
    for p in (path, *path.parents):
        if os.path.lexists(p):  # the deepest that exists decides: below it, nothing does
            if not p.is_dir():
                mode = os.lstat(p).st_mode
                kind = "a file" if stat.S_ISREG(mode) else kind_of(mode)
                raise UsageError(f"{label} {path}: {p} is {kind}, not a folder")
            return


def _occupied(path: Path) -> bool:
    """Whether folder ``path`` holds anything but a lock file."""
    return path.is_dir() and any(p.name != LOCK for p in path.iterdir())


def _what_it_holds(path: Path, description: dict, asked: bool) -> tuple[bool, str]:
    """What the non-empty folder ``path`` holds, for a new run of ``description`` in it:
    ``(done, message)``. ``done``: it holds this run, finished and reported, and the user did
    not ask for the folder (``--out``) but left it to the command, which has nothing to do.
    ``message``: one line saying what it holds and what to do."""
    held = _read_json(path / CONFIG)
    if held is None or not all(isinstance(held.get(k), dict) for k in ("config", "options")):
        return False, (f"run folder {path} is not empty and holds no run; choose another "
                       f"--out or pass --force")
    held = _in_todays_format(held, path / CONFIG)
    diff, options = _differences(held, description), description["options"]
    if diff:
        held_steps, steps = held["options"].get("steps"), options["steps"]
        longer = diff == ["steps"] and options["schedule"] != "cosine" and isinstance(
            held_steps, int) and steps > held_steps  # the held run extends to this one
        extend = (f", or extend it: 'numpy-transformer train --resume {path} --steps {steps}'"
                  if longer else "")
        return False, (f"run folder {path} holds a different run (differs in "
                       f"{', '.join(diff)}); choose another --out or pass --force{extend}")
    try:
        held_ckpt = load_checkpoint(path / CHECKPOINT)
        finished, step = held_ckpt.meta.get("finished"), held_ckpt.step
    except CheckpointError:
        finished, step = False, None
    if finished and has_report(path, options["task"], options["model"]):
        if not asked:
            sample = f", or 'numpy-transformer sample {path}'" if options["task"] == "lm" else ""
            return True, (f"{path} already holds this run, finished: nothing to do (see its "
                          f"files{sample}; --force trains it again)")
        return False, (f"run folder {path} already holds this run, finished; pass --force to "
                       f"train it again or choose another --out")
    where = ("before its first checkpoint" if step is None else
             "before writing its report" if finished else f"at step {step}")
    return False, (f"run folder {path} already holds this run, stopped {where}; continue it "
                   f"with 'numpy-transformer train --resume {path}' or pass --force to start "
                   f"over")


def _read_json(path: Path) -> dict | None:
    """The JSON object in file ``path``; None if there is none or it is not JSON.

    Raises
    ------
    UsageError
        If ``path`` is a folder, a FIFO or a device (said which).
    """
    if not os.path.lexists(path):
        return None
    try:
        check_file(path)
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:
        value = decode_json(read_file(path, text=True), str(path))
    except ValueError:  # not UTF-8 text, or not JSON (a CheckpointError)
        return None
    return value if isinstance(value, dict) else None


def read_description(run_dir: Path) -> dict:
    """The run's ``config.json``: ``{"format_version": int, "config": {...}, "options":
    {...}}`` as it was written (a folder of format version 1 has no ``format_version``: it is
    then 1).

    Raises
    ------
    UsageError
        If it is missing, not a file, not JSON or not such an object.
    CheckpointError
        If it is of a newer format version (both are named) or of none.
    """
    path = run_dir / CONFIG
    held = _read_json(path)
    if held is None or not all(isinstance(held.get(k), dict) for k in ("config", "options")):
        raise UsageError(f"{path} does not describe a run (a JSON object with 'config' and "
                         f"'options')")
    version = check_format_version(held.get("format_version", 1), str(path))
    return {**held, "format_version": version}


def _in_todays_format(held: dict, path: Path) -> dict:
    """A ``config.json``'s description with what its format version did not record filled in
    (:func:`~.options.fill_missing`)."""
    version = check_format_version(held.get("format_version", 1), str(path))
    config, options, _ = fill_missing(held["config"], held["options"], version)
    return {"format_version": FORMAT_VERSION, "config": config, "options": options}


def write_description(run_dir: Path, description: dict) -> None:
    """Write the run's ``config.json`` (:meth:`~.state.Run.description`), atomically, unless
    it holds exactly that already: a run of an older format that resumes leaves a folder of
    today's."""
    path = run_dir / CONFIG
    if os.path.lexists(path) and _read_json(path) == description:
        return
    atomic_write_text(path, json.dumps(description, indent=2) + "\n")


def _differences(a: dict, b: dict) -> list[str]:
    keys = sorted(set(a.get("config", {})) | set(a.get("options", {})) |
                  set(b.get("config", {})) | set(b.get("options", {})))
    return [k for k in keys
            if a.get("config", {}).get(k) != b.get("config", {}).get(k)
            or a.get("options", {}).get(k) != b.get("options", {}).get(k)]


# --------------------------------------------------------------------------------------------
# An existing run's folder
# --------------------------------------------------------------------------------------------

def existing_run_folder(run_dir: str | Path) -> FolderLock:
    """Hold the folder of a run to resume (release it when the run ends: ``with``).

    Raises
    ------
    UsageError
        If ``run_dir`` is not a folder, or another process is training in it.
    OSError
        If it cannot be written.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"--resume {run_dir}: no such run folder")
    check_run_files(run_dir)
    return FolderLock(run_dir)


# --------------------------------------------------------------------------------------------
# One process per folder
# --------------------------------------------------------------------------------------------

class FolderLock:
    """A run folder held by this process, until :meth:`release` (or the end of a ``with``).

    The folder's ``.lock`` file holds the pid of the process training there and carries an
    exclusive ``flock``. The kernel drops a flock when its process ends, however it ends (a
    kill -9 too), so a lock file left behind is stale exactly when its pid is gone, and the
    next process takes it over. Holding the folder, it removes the temporary files that
    interrupted atomic writes left behind.

    Attributes
    ----------
    folder : Path

    Raises
    ------
    UsageError
        If another living process holds the folder (the message names its pid).
    OSError
        If the lock file cannot be created (a read-only folder, permission denied).
    """

    def __init__(self, folder: Path) -> None:
        self.folder, self.path, self.fd = folder, folder / LOCK, None
        if fcntl is None:
            return
        try:
            self.fd = self._acquire()
        except OSError as e:
            raise OSError(e.errno, e.strerror, str(folder)) from None
        for name in RUN_FILES:
            for stale in folder.glob(temporary_names(name)):
                stale.unlink(missing_ok=True)

    def _acquire(self) -> int:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = os.read(fd, 32).decode("ascii", "replace").strip() or "?"
                os.close(fd)
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                raise UsageError(f"run folder {self.folder} is in use by process {holder} (a "
                                 f"run is going on there); wait for it or stop it") from None
            try:  # the file we locked may have been removed by its last holder meanwhile
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode("ascii"))
                return fd
            os.close(fd)

    def release(self) -> None:
        """Give the folder up: remove the lock file, then drop the flock."""
        if self.fd is not None:
            try:
                self.path.unlink(missing_ok=True)
            except OSError:  # the folder became read-only: the lock goes stale as we exit
                pass
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def read_log(run_dir: Path, upto: int | None = None) -> list[dict]:
    """The records of the run's ``log.jsonl`` (those with ``step <= upto`` when given); a
    line that is not a JSON object with an integer step is skipped (one cut short by a kill).

    Raises
    ------
    UsageError
        If ``log.jsonl`` is a folder, a FIFO, a device (said which).
    OSError
        If it cannot be read.
    """
    path = log_path(run_dir)
    if not os.path.lexists(path):
        return []
    try:
        text = read_file(path).decode("utf-8", errors="replace")
    except ValueError as e:
        raise UsageError(str(e)) from None
    records = []
    for line in text.splitlines():
        try:
            r = json.loads(line)
        except (ValueError, RecursionError):
            continue  # a line cut short by a kill
        step = r.get("step") if isinstance(r, dict) else None
        if isinstance(step, int) and not isinstance(step, bool) and (upto is None or
                                                                    step <= upto):
            records.append(r)
    return records


def cut_log(run_dir: Path, step: int) -> None:
    """Forget what was logged after ``step`` (and the final evaluation, if any): a resumed run
    recomputes those steps identically and logs them again."""
    records = [r for r in read_log(run_dir, upto=step) if not r.get("final")]
    atomic_write_text(log_path(run_dir), "".join(json.dumps(r) + "\n" for r in records))

"""The run folder on disk: choosing and creating it, refusing to overwrite it, its checkpoint's
path, and its log.

The files a run folder holds, and what each contains, are listed once, in
:data:`numpy_transformer.runs.options.RUN_FILES`. Every path into a run folder is made here, so
what guards the folder as a whole (a lock against a second process, the clean-up of temporary
files a killed save left behind) belongs in this module too.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from ..checkpoint import CheckpointError, atomic_write_text, load_checkpoint
from .options import CHECKPOINT, CONFIG, LOG, RUN_FILES, UsageError, default_run_folder, say


def checkpoint_path(target: str | Path) -> Path:
    """A run folder means its ``checkpoint.npz``; a file is taken as it is."""
    target = Path(target)
    return target / CHECKPOINT if target.is_dir() else target


def log_path(run_dir: Path) -> Path:
    """The run's ``log.jsonl``."""
    return run_dir / LOG


# --------------------------------------------------------------------------------------------
# A new run's folder
# --------------------------------------------------------------------------------------------

def new_run_folder(out: str | None, task: str, description: dict, force: bool) -> Path:
    """Choose and create the folder of a new run; write its ``config.json`` and an empty log.

    * No ``--out``: ``runs/char-lm`` (``runs/<task>`` for the tasks); if that folder is
      already in use, a fresh ``runs/char-lm-YYYYmmdd-HHMMSS`` beside it (said on stdout).
    * ``--out DIR`` that is not empty: refused (exit 2), the message says whether it holds a
      different run or this same one (then: resume it, or pass ``--force``).
    * ``--force``: our files in the folder are removed first; other files are left alone.

    Raises
    ------
    UsageError
        When the folder may not or cannot be used.
    """
    default = default_run_folder(task)
    path = Path(out) if out is not None else default
    if path.exists() and not path.is_dir():
        raise UsageError(f"run folder {path} exists and is not a folder")
    if path.is_dir() and any(path.iterdir()):
        if force:
            for name in RUN_FILES:
                (path / name).unlink(missing_ok=True)
        elif out is None:
            stamp = f"{default.name}-{time.strftime('%Y%m%d-%H%M%S')}"
            path, n = default.with_name(stamp), 1
            while path.exists():  # two runs in one second
                n += 1
                path = default.with_name(f"{stamp}-{n}")
            say(f"{default} is in use; this run goes to {path}")
        else:
            _refuse_occupied(path, description)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-test.")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"cannot write to run folder {path}: {e.strerror or e}") from None
    atomic_write_text(path / CONFIG, json.dumps(description, indent=2) + "\n")
    log_path(path).write_text("", encoding="utf-8")
    return path


def _refuse_occupied(path: Path, description: dict) -> None:
    """Raise the ``UsageError`` that says what the non-empty folder ``path`` holds."""
    held = _read_json(path / CONFIG)
    if held is None:
        raise UsageError(f"run folder {path} is not empty and holds no run; choose "
                         f"another --out or pass --force")
    diff = _differences(held, description)
    if diff:
        raise UsageError(f"run folder {path} holds a different run (differs in "
                         f"{', '.join(diff)}); choose another --out or pass --force")
    try:
        held_ckpt = load_checkpoint(path / CHECKPOINT)
        finished, step = held_ckpt.meta.get("finished"), held_ckpt.step
    except CheckpointError:
        finished, step = False, None
    if finished:
        raise UsageError(f"run folder {path} already holds this run, finished; pass "
                         f"--force to train it again or choose another --out")
    raise UsageError(f"run folder {path} already holds this run, stopped at step "
                     f"{step}; continue it with 'numpy-transformer train --resume "
                     f"{path}' or pass --force to start over")


def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _differences(a: dict, b: dict) -> list[str]:
    keys = sorted(set(a.get("config", {})) | set(a.get("options", {})) |
                  set(b.get("config", {})) | set(b.get("options", {})))
    return [k for k in keys
            if a.get("config", {}).get(k) != b.get("config", {}).get(k)
            or a.get("options", {}).get(k) != b.get("options", {}).get(k)]


# --------------------------------------------------------------------------------------------
# An existing run's folder
# --------------------------------------------------------------------------------------------

def existing_run_folder(run_dir: str | Path) -> Path:
    """The folder of a run to resume.

    Raises
    ------
    UsageError
        If ``run_dir`` is not a folder.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"--resume {run_dir}: no such run folder")
    return run_dir


def read_log(run_dir: Path, upto: int | None = None) -> list[dict]:
    """The records of the run's ``log.jsonl`` (those with ``step <= upto`` when given)."""
    path = log_path(run_dir)
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill
        if isinstance(r, dict) and (upto is None or r.get("step", 0) <= upto):
            records.append(r)
    return records


def cut_log(run_dir: Path, step: int) -> None:
    """Forget what was logged after ``step`` (and the final evaluation, if any): a resumed run
    recomputes those steps identically and logs them again."""
    records = [r for r in read_log(run_dir, upto=step) if not r.get("final")]
    atomic_write_text(log_path(run_dir), "".join(json.dumps(r) + "\n" for r in records))

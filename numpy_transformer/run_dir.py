"""The run folder on disk: choosing it, refusing to overwrite it, and reading its log.

A run folder holds::

    config.json      the model config and the training options (written first)
    checkpoint.npz   weights, Adam moments, step, every RNG state (see checkpoint.py)
    log.jsonl        one JSON line per step {"step", "loss", "lr", "grad_norm", "tokens_per_s"}
                     and per evaluation {"step", "val_loss", ["val_acc"], ["final"]}
    loss.png         training loss (and held-out loss) against step
    attention.png    last layer's attention weights on a held-out snippet, one panel per head
    sample.txt       for language models: a sample from the final model
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from .checkpoint import CheckpointError, load_checkpoint
from .run_setup import UsageError, say

RUN_FILES = ("checkpoint.npz", "log.jsonl", "loss.png", "attention.png", "config.json",
             "sample.txt")


# --------------------------------------------------------------------------------------------
# The run folder
# --------------------------------------------------------------------------------------------

def checkpoint_path(target: str | Path) -> Path:
    """A run folder means its ``checkpoint.npz``; a file is taken as it is."""
    target = Path(target)
    return target / "checkpoint.npz" if target.is_dir() else target


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


def prepare_run_dir(out: str | None, task: str, description: dict, force: bool) -> Path:
    """Choose and create the run folder; refuse to overwrite anything without ``force``.

    * No ``--out``: ``runs/char-lm`` (``runs/<task>`` for the tasks); if that folder is
      already in use, a fresh ``runs/char-lm-YYYYmmdd-HHMMSS`` beside it (said on stdout).
    * ``--out DIR`` that is not empty: refused (exit 2), the message says whether it holds a
      different run or this same one (then: resume it, or pass ``--force``).
    * ``--force``: our files in the folder are removed first; other files are left alone.
    """
    default = Path("runs") / ("char-lm" if task == "lm" else task)
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
            held = _read_json(path / "config.json")
            if held is None:
                raise UsageError(f"run folder {path} is not empty and holds no run; choose "
                                 f"another --out or pass --force")
            diff = _differences(held, description)
            if diff:
                raise UsageError(f"run folder {path} holds a different run (differs in "
                                 f"{', '.join(diff)}); choose another --out or pass --force")
            try:
                held_ckpt = load_checkpoint(path / "checkpoint.npz")
                finished, step = held_ckpt.meta.get("finished"), held_ckpt.step
            except CheckpointError:
                finished, step = False, None
            if finished:
                raise UsageError(f"run folder {path} already holds this run, finished; pass "
                                 f"--force to train it again or choose another --out")
            raise UsageError(f"run folder {path} already holds this run, stopped at step "
                             f"{step}; continue it with 'numpy-transformer train --resume "
                             f"{path}' or pass --force to start over")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-test.")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"cannot write to run folder {path}: {e.strerror or e}") from None
    return path


def read_log(path: Path, upto: int | None = None) -> list[dict]:
    """The records of ``log.jsonl`` (those with ``step <= upto`` when given)."""
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

"""``train --tensorboard``: every record of ``log.jsonl`` also as TensorBoard scalars.

``log.jsonl`` stays the run's record; the event files in ``RUN_DIR/tensorboard/`` are a view of
it for ``tensorboard --logdir runs``, written as the run goes by ``tensorboardX`` (an optional
extra that needs no PyTorch: ``pip install "numpy_transformer[tensorboard]"``). Each number of
a record becomes the scalar of its key at the record's step: ``loss``, ``lr``, ``grad_norm``,
``tokens_per_s`` every step, ``val_loss`` (and ``val_acc``) at each evaluation, and with
``--stats-every`` ``grad_norm/<tensor>`` and ``update_ratio/<tensor>``. A ``--resume`` opens the
folder again at the checkpoint's step with ``purge_step``, so TensorBoard drops the events of
the steps the resume recomputes, as the resume cuts them from ``log.jsonl``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from .outputs import EVENTS_FOLDER, UsageError

SKIPPED = ("step", "time", "final")  # a record's entries that are no scalar of their own


def check_available() -> None:
    """Raise ``UsageError`` (one line, what to install) if tensorboardX is missing."""
    _summary_writer()


def _summary_writer():
    from ..export._require import require

    try:
        return require("tensorboardX", "train --tensorboard", extra="tensorboard").SummaryWriter
    except ImportError as e:
        raise UsageError(str(e)) from None


def scalars(record: dict) -> Iterator[tuple[str, float]]:
    """``(tag, value)`` of each number of a ``log.jsonl`` record (see the module docstring)."""
    for key, value in record.items():
        if key == "tensor_stats":
            for tensor, stats in value.items():
                for name, number in stats.items():
                    yield f"{name}/{tensor}", float(number)
        elif key not in SKIPPED and isinstance(value, (int, float)):
            yield key, float(value)


class EventLog:
    """The run's event files, open for writing (:func:`event_log`)."""

    def __init__(self, run_dir: Path, step: int) -> None:
        self.writer = _summary_writer()(logdir=str(Path(run_dir) / EVENTS_FOLDER),
                                        purge_step=step or None)

    def write(self, record: dict) -> None:
        """Each number of ``record`` at its step."""
        for tag, value in scalars(record):
            self.writer.add_scalar(tag, value, record["step"])

    def close(self) -> None:
        self.writer.close()


@contextlib.contextmanager
def event_log(run_dir: Path, enabled: bool, step: int) -> Iterator[EventLog | None]:
    """Within: the run's :class:`EventLog` from ``step`` on, or None when not ``enabled``."""
    if not enabled:
        yield None
        return
    events = EventLog(run_dir, step)
    try:
        yield events
    finally:
        events.close()


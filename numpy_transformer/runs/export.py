"""A trained run's model for other tools: what ``numpy-transformer export`` writes."""

from __future__ import annotations

from pathlib import Path

from ..export import export_run, optimizer_of
from .folder import checkpoint_path
from .outputs import UsageError
from .state import model_from_checkpoint


def export_checkpoint(target: str | Path, fmt: str, out: str | Path | None = None) -> list[Path]:
    """Write the model of a run folder or checkpoint ``target`` as ``fmt`` (one of
    ``config.EXPORT_FORMATS``), with its optimiser state where the format holds one, into
    ``out`` (default: a folder named after the format beside the checkpoint). Returns the files.

    Raises
    ------
    UsageError
        If the model does not fit the format, a package it needs is missing, or the files
        cannot be written.
    CheckpointError
        If the checkpoint cannot be read.
    """
    path = checkpoint_path(target)
    model, tokenizer, ckpt = model_from_checkpoint(target)
    out = Path(out) if out else path.parent / fmt
    try:
        return export_run(out, fmt, model, tokenizer, optimizer_of(ckpt),
                          info={"step": ckpt.step, "options": ckpt.options})
    except (ImportError, OSError, ValueError) as e:
        raise UsageError(f"{path}: {e}") from None

"""A trained run's model for other tools: what ``numpy-transformer export`` writes."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ..export import export_run, optimizer_of
from ..files import os_error_naming
from .folder import check_folder_path, checkpoint_path
from .outputs import UsageError, signals_held
from .stored import model_from_checkpoint


def export_checkpoint(target: str | Path, fmt: str, out: str | Path | None = None,
                      force: bool = False) -> list[Path]:
    """Write the model of a run folder or checkpoint ``target`` as ``fmt`` (one of
    ``config.EXPORT_FORMATS``), with its optimiser state where the format holds one, into
    ``out`` (default: a folder named after the format beside the checkpoint). Returns the files.

    The files are written into a new folder beside ``out`` and moved in only once all of them
    are complete, so a failure leaves ``out`` as it was. A file already in ``out`` is never
    replaced unless ``force``: it may be another model's.

    Raises
    ------
    UsageError
        If ``out`` is empty, a file, or holds files (without ``force``), the model does not fit
        the format, or a package it needs is missing.
    CheckpointError
        If the checkpoint cannot be read.
    OSError
        If the files cannot be written (the command line's exit 74).
    """
    if out is not None and not str(out).strip():
        raise UsageError("--out '': give the folder the files go into")
    path = checkpoint_path(target)
    model, tokenizer, ckpt = model_from_checkpoint(target)
    out = Path(out) if out else path.parent / fmt
    check_folder_path(out, "--out")
    held = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if held and not force:
        raise UsageError(f"{out} already holds {', '.join(held[:3])}"
                         f"{', ...' if len(held) > 3 else ''}: export into a new folder, or add "
                         f"--force to replace what the export writes")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as e:  # named as the folder it was to become, not the staging one
        raise os_error_naming(out, e) from None
    try:
        try:
            files = export_run(staging, fmt, model, tokenizer, optimizer_of(ckpt),
                               info={"step": ckpt.step, "options": ckpt.options})
        except (ImportError, ValueError) as e:
            raise UsageError(f"{path}: {e}") from None
        except OSError as e:  # name the file it was writing as the one it was to become
            if e.filename is None or Path(e.filename).parent != staging:
                raise
            raise OSError(e.errno, e.strerror, str(out / Path(e.filename).name)) from None
        with signals_held():  # a stop now would leave ``out`` with some of the files only
            out.mkdir(exist_ok=True)
            for file in files:
                os.replace(file, out / file.name)
        return [out / file.name for file in files]
    finally:
        shutil.rmtree(staging, ignore_errors=True)

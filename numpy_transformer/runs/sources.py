"""A language model from wherever a command is pointed at it: a run folder, a checkpoint, a
folder ``export`` wrote, or a Hugging Face ``transformers`` folder.

``sample``, ``eval``, ``import`` and ``train --init-from`` all read their model through
:func:`read_source`, so each takes the same four kinds of source and refuses the same things in
the same words:

* a run folder (its ``checkpoint.npz``; ``--best``: its ``best.npz``) or a checkpoint file,
  read by :func:`~.stored.model_from_checkpoint` (the run's options come with it);
* a folder with a ``model.safetensors`` and a ``config.json`` of GPT-2's or LLaMA's shape,
  as ``transformers`` saves one (``export.load_hf``), with its own tokenizer, characters or
  byte-level BPE, ids unchanged;
* a folder ``export`` wrote, or its ``model.safetensors`` (``export.load_safetensors``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from ..bpe import BPETokenizer
from ..checkpoint import CheckpointError
from ..data import CharTokenizer, fingerprint
from ..nn import LSTMLM, DecoderLM, Module
from .folder import checkpoint_path
from .options import RunOptions
from .outputs import CHECKPOINT, CONFIG, UsageError, say
from .stored import model_from_checkpoint

WEIGHTS = "model.safetensors"  # what an exported or transformers folder holds


class Source(NamedTuple):
    """A language model read by :func:`read_source`."""

    path: Path  # what the command named, absolute
    model: Module  # DecoderLM or LSTMLM, in the dtype and on the backend it was stored with
    tokenizer: CharTokenizer | BPETokenizer
    step: int | None  # the updates a checkpoint had made; None for a folder from elsewhere
    options: RunOptions | None  # the training options of a run; None for a folder from
    #   elsewhere

    @property
    def is_run(self) -> bool:
        """Whether it is one of this library's runs (a folder or checkpoint ``train`` wrote)."""
        return self.options is not None

    def record(self) -> dict:
        """What the ``config.json`` of a run that starts from it says of it."""
        return {"path": str(self.path), "weights_sha256": fingerprint(self.model.state_dict()),
                "step": self.step}


def is_foreign_folder(path: Path) -> bool:
    """Whether ``path`` is a folder with a ``model.safetensors`` and no checkpoint: an
    export's or a ``transformers`` folder, not a run folder."""
    return path.is_dir() and (path / WEIGHTS).is_file() and not (path / CHECKPOINT).exists()


def read_source(target: str | Path, what: str, note: Callable[[str], None] = say) -> Source:
    """The language model and tokenizer of ``target`` (see the module docstring).

    Parameters
    ----------
    target : path
    what : str
        How the messages name it (``"--init-from runs/x"``, ``"sample runs/x"``).
    note : callable
        Gets one line saying what reading a run of an older format filled in.

    Raises
    ------
    UsageError
        One line naming ``what``: no such file or folder, nothing this library reads, a package
        to install, a model that is not a language model with a tokenizer.
    CheckpointError
        For a run folder or checkpoint that cannot be read (its own message).
    """
    path = Path(target).absolute()
    if not path.exists():
        raise UsageError(f"{what}: no such file or folder")
    if path.is_dir() and not any((path / name).exists() for name in (CHECKPOINT, CONFIG, WEIGHTS)):
        raise UsageError(f"{what}: neither a run folder ({CHECKPOINT}), a transformers folder "
                         f"(config.json and {WEIGHTS}) nor an export's {WEIGHTS}")
    options = step = None
    try:
        if is_foreign_folder(path) or path.suffix == ".safetensors":
            from ..export import load_model

            exported = load_model(path)
            model, tokenizer = exported.model, exported.tokenizer
            step = exported.info.get("step")
        else:
            model, tokenizer, ckpt = model_from_checkpoint(path, note)
            step, options = ckpt.step, RunOptions(**ckpt.options)
    except ImportError as e:
        raise UsageError(f"{what}: {e}") from None
    except UsageError as e:  # a config.json that describes no run, say
        hint = ""
        if path.is_dir() and not (path / CHECKPOINT).exists():
            hint = (f"; a transformers folder holds config.json and {WEIGHTS}, a run folder "
                    f"{checkpoint_path(path).name}")
        raise UsageError(f"{what}: {e}{hint}") from None
    except CheckpointError:  # a run's own message, naming its file
        raise
    except ValueError as e:  # the readers name the path already: said once
        raise UsageError(f"{what}: {str(e).removeprefix(f'{path}: ')}") from None
    if tokenizer is None or not isinstance(model, (DecoderLM, LSTMLM)):
        raise UsageError(f"{what}: holds a {type(model).__name__}"
                         f"{'' if tokenizer else ' without a tokenizer'}; it needs a language "
                         f"model and its tokenizer (a --task lm run)")
    return Source(path, model, tokenizer, step if isinstance(step, int) else None, options)

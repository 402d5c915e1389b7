"""Leaving the library and coming back: safetensors files and Hugging Face directories.

* :func:`save_safetensors` / :func:`load_safetensors` -- a model's weights in the PyTorch
  twin's names and layouts (``numpy_transformer.torch_twins``), with its config and tokenizer
  in the file's metadata; :func:`save_optimizer` / :func:`load_optimizer` -- Adam's state
  beside it (``safetensors_file.py``).
* :func:`save_hf` / :func:`load_hf` -- a ``DecoderLM`` of GPT-2's or LLaMA's shape as a
  ``transformers`` directory (``GPT2LMHeadModel``, ``LlamaForCausalLM``) with a tokenizer
  that ``pipeline("text-generation")`` reads (``hf.py``, ``hf_tokenizer.py``).
* :func:`load_model` -- whichever of the two a path holds (``numpy-transformer import``).
* :func:`export_run` -- either, for a trained model (and its optimiser, rebuilt from a
  checkpoint by :func:`optimizer_of`): the command ``numpy-transformer export RUN_DIR``.

Importing this package needs none of the optional packages; each function says in one
``ImportError`` line what to install (``pip install "numpy_transformer[hf]"``). Our ``.npz``
checkpoint stays the format that resumes a run bit for bit.
"""

from __future__ import annotations

from pathlib import Path

from ..checkpoint import Checkpoint
from ..config import DEFAULT_BACKEND, EXPORT_FORMATS
from ..data import CharTokenizer
from ..nn import Module
from ..optim import Adam, AdamW
from .hf import from_hf_state, hf_family, load_hf, rope_half_order, save_hf, to_hf_state
from .safetensors_file import (
    Exported,
    load_optimizer,
    load_safetensors,
    save_optimizer,
    save_safetensors,
)

__all__ = ["Exported", "save_safetensors", "load_safetensors", "save_optimizer",
           "load_optimizer", "save_hf", "load_hf", "hf_family", "rope_half_order",
           "to_hf_state", "from_hf_state", "load_model", "export_run", "optimizer_of"]

WEIGHTS_FILE, OPTIMIZER_FILE = "model.safetensors", "optimizer.safetensors"


def load_model(source: str | Path, backend: str | None = None) -> Exported:
    """What ``source`` holds, whichever of the two formats it is.

    Parameters
    ----------
    source : path
        A ``transformers`` folder (it has a ``config.json``: :func:`load_hf`), or a
        ``model.safetensors`` written by :func:`save_safetensors` (the file, or the folder
        holding it: :func:`load_safetensors`).
    backend : str, optional
        The model's backend; default the stored config's.

    Raises
    ------
    ValueError
        Naming ``source``: neither kind, or what the reader of its kind refuses.
    """
    source = Path(source)
    if source.is_dir() and (source / "config.json").is_file():
        return load_hf(source, backend)
    weights = source / WEIGHTS_FILE if source.is_dir() else source
    if not weights.is_file():
        raise ValueError(f"{source}: neither a transformers folder (config.json and "
                         f"{WEIGHTS_FILE}) nor an export's {WEIGHTS_FILE}")
    return load_safetensors(weights, backend)


def export_run(out: str | Path, fmt: str, model: Module, tokenizer: CharTokenizer | None,
               optimizer: Adam | None = None, info: dict | None = None) -> list[Path]:
    """Write a trained model (and its optimiser) to ``out`` in format ``fmt``.

    Parameters
    ----------
    out : path of a directory (created if needed)
    fmt : {"safetensors", "hf"}
        ``safetensors``: ``model.safetensors`` and, given an optimiser,
        ``optimizer.safetensors``. ``hf``: a ``transformers`` directory (the optimiser is not
        written: ``transformers`` keeps its own).
    model : Module
    tokenizer : CharTokenizer or None
    optimizer : Adam or AdamW, optional
    info : dict, optional
        Stored in the weights file's metadata (safetensors only).

    Returns
    -------
    written : list of Path
        The files written.

    Raises
    ------
    ValueError
        For an unknown format, or a model that fits no Hugging Face family (``hf``).
    """
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"format must be one of {EXPORT_FORMATS}, got {fmt!r}")
    out = Path(out)
    if fmt == "hf":
        hf_family(model)  # refuse before creating anything
        save_hf(out, model, tokenizer)
        return sorted(p for p in out.iterdir() if p.is_file())
    out.mkdir(parents=True, exist_ok=True)
    save_safetensors(out / WEIGHTS_FILE, model, tokenizer, info)
    if optimizer is None:
        return [out / WEIGHTS_FILE]
    save_optimizer(out / OPTIMIZER_FILE, optimizer, model)
    return [out / WEIGHTS_FILE, out / OPTIMIZER_FILE]


def optimizer_of(ckpt: Checkpoint, backend: str | None = None) -> Adam:
    """The run's optimiser as the checkpoint left it (kind, hyperparameters, moments, step).

    Parameters
    ----------
    ckpt : Checkpoint
        From ``checkpoint.load_checkpoint``.
    backend : str, optional
        Default the backend of the checkpoint's model config.
    """
    backend = ckpt.config.get("backend", DEFAULT_BACKEND) if backend is None else backend
    optimizer = (AdamW if ckpt.optimizer["kind"] == "AdamW" else Adam)(backend=backend)
    optimizer.load_state_dict(ckpt.optimizer_state())
    return optimizer

"""A model from elsewhere as a run folder: what ``numpy-transformer import`` writes.

The source is a Hugging Face ``transformers`` folder of GPT-2's or LLaMA's shape (read by
:func:`~numpy_transformer.export.load_hf`), or what ``export`` wrote: a ``model.safetensors``,
the file or its folder (:func:`~numpy_transformer.export.load_safetensors`). The run folder it
makes is the run that starts from those weights: the default options with the model's shape,
the text ``--text`` (default: the embedded corpus), step 0 and fresh Adam moments. So
``sample``, ``eval`` and ``export`` read it as any run, and ``train --resume RUN`` trains it
further on that text (``--steps N`` for how long), bit for bit as a run started from these
weights would.

A run's tokenizer is its text's characters, so the source's tokenizer must be exactly that:
the characters of the text the model was trained on. Otherwise the import is refused, naming
the characters that differ.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..export import load_model
from ..nn import LSTMLM, DecoderLM
from .folder import checkpoint_path, new_run_folder
from .options import MODEL_KEYS, OPTIONS, resolve_options
from .outputs import UsageError
from .state import Run


def _differ(theirs: str, ours: str) -> str:
    """The characters in one vocabulary and not the other, said in one line."""
    parts = [f"{what} {''.join(sorted(chars))!r}" for what, chars in (
        ("only the model's:", set(theirs) - set(ours)),
        ("only the text's:", set(ours) - set(theirs))) if chars]
    return "; ".join(parts)


def import_model(source: str | Path, out: str | Path, text: str | None = None,
                 force: bool = False) -> Path:
    """Write the run folder ``out`` that starts from the model of ``source``; returns it.

    Parameters
    ----------
    source : path
        A transformers folder of GPT-2's or LLaMA's shape, or an export's
        ``model.safetensors`` (the file, or the folder holding it).
    out : path
        The new run folder (refused if it holds files, unless ``force``).
    text : path, optional
        The UTF-8 text a ``train --resume`` trains on; default the embedded corpus. Its
        characters must be the model's vocabulary.
    force : bool
        Replace the run files of a non-empty ``out``.

    Raises
    ------
    UsageError
        One line: a source that is neither kind, foreign or broken, a model that is not a
        language model, no tokenizer, a tokenizer that is not the text's, an ``out`` in use.
    OSError
        If the folder cannot be written.
    """
    source = Path(source)
    try:
        exported = load_model(source)
    except ValueError as e:
        raise UsageError(str(e)) from None
    model, tokenizer = exported.model, exported.tokenizer
    if not isinstance(model, (DecoderLM, LSTMLM)):
        raise UsageError(f"{source}: a {type(model).__name__}; import takes a language model "
                         f"(DecoderLM or LSTMLM)")
    if tokenizer is None:
        raise UsageError(f"{source}: no tokenizer (tokenizer.json, or the export's metadata); "
                         f"import the folder export wrote, which has it")
    kind = "lstm" if isinstance(model, LSTMLM) else "transformer"
    config = dataclasses.asdict(model.config)
    given = {o.key: None for o in OPTIONS if o.store and o.key != "task"}
    given.update({key: config[key] for key in MODEL_KEYS[kind]}, model=kind, text=text)
    try:
        run = Run(*resolve_options("lm", given))
    except ValueError as e:  # load_text and friends name the problem
        raise UsageError(str(e)) from None
    if run.tokenizer.to_dict() != tokenizer.to_dict():
        differ = _differ("".join(tokenizer.chars), "".join(run.tokenizer.chars))
        raise UsageError(f"{source}: its vocabulary is not the characters of "
                         f"{text or 'the embedded corpus'} ({differ}); import with --text the "
                         f"text it was trained on")
    run.model.load_state_dict(model.state_dict())
    with new_run_folder(str(out), run.description(), force) as held:
        run.save(checkpoint_path(held.folder))
        return held.folder

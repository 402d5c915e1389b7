"""A model from elsewhere as a run folder: what ``numpy-transformer import`` writes.

The source is a Hugging Face ``transformers`` folder of GPT-2's or LLaMA's shape (read by
:func:`~numpy_transformer.export.load_hf`: stock configs included, their dropouts, norm
epsilons, grouped-query attention and tied or untied heads), or what ``export`` wrote: a
``model.safetensors``, the file or its folder (:func:`~numpy_transformer.export.load_safetensors`).
It comes with its own tokenizer, characters or byte-level BPE, kept as it is: ids unchanged,
nothing trained again.

The run folder it makes is the run that starts from those weights, as ``train --init-from
SOURCE`` would start it (:mod:`.init_from`): the default options with the model's shape, the
text ``--text`` (default: the embedded corpus) tokenized by the model's tokenizer, step 0 and
fresh Adam moments, and ``config.json`` says where it started. So ``sample``, ``eval`` and
``export`` read it as any run, and ``train --resume RUN`` trains it further on that text
(``--steps N`` for how long), bit for bit as ``train --init-from SOURCE`` would have.
``--context T`` takes a shorter window than the source's (learned positions keep their first T
rows), for a run that fits.

Importing trains nothing: its memory check sizes the weights, twice while they are copied into
the run's model, not a training step. The run's own check comes when it trains.
"""

from __future__ import annotations

from pathlib import Path

from .folder import checkpoint_path, new_run_folder
from .init_from import new_run, source_options
from .options import OPTIONS
from .outputs import UsageError
from .sources import read_source


def import_model(source: str | Path, out: str | Path, text: str | None = None,
                 force: bool = False, context: int | None = None) -> Path:
    """Write the run folder ``out`` that starts from the model of ``source``; returns it.

    Parameters
    ----------
    source : path
        A transformers folder of GPT-2's or LLaMA's shape, or an export's
        ``model.safetensors`` (the file, or the folder holding it).
    out : path
        The new run folder (refused if it holds files, unless ``force``).
    text : path, optional
        The UTF-8 text a ``train --resume`` trains on; default the embedded corpus. The
        model's tokenizer must encode it (a BPE encodes any text).
    force : bool
        Replace the run files of a non-empty ``out``.
    context : int, optional
        The run's window T; default the source's ``max_len``. At most the rows of a learned
        position table.

    Raises
    ------
    UsageError
        One line: a source that is neither kind, foreign or broken, a model that is not a
        language model, no tokenizer, a tokenizer with more ids than the model's embedding
        rows, a text it cannot encode, a context too long, an ``out`` in use.
    OSError
        If the folder cannot be written.
    """
    read = read_source(source, f"import {source}")
    if read.is_run:
        raise UsageError(f"import {source}: a run folder of this library already; sample, eval "
                         f"and train --resume take it as it is")
    given = {o.key: None for o in OPTIONS if o.store and o.key != "task"}
    given.update(text=text, max_len=context, init_from=str(source))
    config_fields, options = source_options(read, given, "import")
    try:
        run = new_run(read, config_fields, options, training=False)
    except ValueError as e:  # load_text and friends name the problem
        raise UsageError(str(e)) from None
    with new_run_folder(str(out), run.description(), force) as held:
        run.save(checkpoint_path(held.folder))
        return held.folder

"""A run read back from disk: a run folder or checkpoint file, of any format version this
library reads, and the run or the model rebuilt from it.

:func:`read_run` reads a run folder or a checkpoint file into today's format: ``train
--resume``, ``sample`` and ``export`` all read one through it. :func:`rebuild_run` then
rebuilds the same :class:`~.state.Run` and loads its checkpoint into it (that is all
``--resume`` needs before training on); :func:`model_from_checkpoint` rebuilds just the model
and its tokenizer, for sampling and export; :func:`load_run` is the documented Python loader
(``numpy_transformer.load_run``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from ..bpe import BPETokenizer, tokenizer_from_dict
from ..checkpoint import FORMAT_VERSION, Checkpoint, CheckpointError, load_checkpoint
from ..data import CharTokenizer
from .folder import checkpoint_path, read_description
from .options import MODEL_CONFIGS, MODEL_KEYS, RunOptions, fill_missing, stored_options
from .outputs import CONFIG, UsageError, say
from .state import Run, model_class


class StoredRun(NamedTuple):
    """A run read back from disk, in today's format (:func:`read_run`)."""

    source: Path  # the file its config and options came from: a checkpoint, or config.json
    config: dict  # the model's config, every field
    options: RunOptions  # the training options, task and model among them
    model_class: type  # the model those options train
    checkpoint: Checkpoint | None  # with the config and options above (as on disk, in
    #   today's format); None: the run stopped before its first checkpoint (a folder holding
    #   only its config.json)


def read_run(target: str | Path, note: Callable[[str], None] = say) -> StoredRun:
    """Read the run of a run folder or checkpoint file ``target``: the one way ``train
    --resume``, ``sample`` and ``export`` read one.

    1. A folder means its checkpoint, or its ``config.json`` if it has none yet.
    2. A newer format version than :data:`~numpy_transformer.checkpoint.FORMAT_VERSION` is
       refused, naming both.
    3. An older one is brought to today's format: each option its version did not record
       takes the value that reproduces what it did (:func:`~.options.fill_missing`), and
       ``note`` gets one line naming them.
    4. The options are checked as the command line checks its own, and must train the model
       the checkpoint holds.

    Raises
    ------
    CheckpointError
        Naming the file and the first thing that does not fit.
    UsageError
        If ``config.json`` does not describe a run.
    """
    target = Path(target)
    path = checkpoint_path(target)
    if target.is_dir() and not os.path.lexists(path) and os.path.lexists(target / CONFIG):
        held, ckpt, source = read_description(target), None, target / CONFIG
        version, config, options = held["format_version"], held["config"], held["options"]
    else:
        ckpt, source = load_checkpoint(path), path
        version, config, options = ckpt.version, ckpt.config, ckpt.options
    config, options, filled = fill_missing(config, options, version)
    if filled:
        note(f"{source}: written in format version {version}, read as version "
             f"{FORMAT_VERSION} with what it did not record filled in as it did: "
             f"{', '.join(filled)}")
    try:
        typed = stored_options(config, options)
    except UsageError as e:
        raise CheckpointError(f"{source}: {e}") from None
    model = model_class(typed)
    if ckpt is not None:
        if ckpt.meta.get("model") != model.__name__:
            raise CheckpointError(f"{source}: the checkpoint holds a {ckpt.meta.get('model')!r} "
                                  f"but its options train a {model.__name__} (--task "
                                  f"{typed.task} --model {typed.model})")
        ckpt = dataclasses.replace(ckpt, config=config, options=options)
    return StoredRun(source, config, typed, model, ckpt)


def rebuild_run(stored: StoredRun) -> Run:
    """The :class:`Run` that ``stored`` describes, with its checkpoint (if any) loaded into
    it: the data, config and weights must be those it was trained with.

    Raises
    ------
    CheckpointError
        Naming the file and what does not fit.
    """
    source, ckpt, options = stored.source, stored.checkpoint, stored.options
    fields = {k: stored.config[k] for k in MODEL_KEYS[options.model]}
    started = options.init_from
    if started and ckpt is None:
        raise CheckpointError(f"{source}: a run started from {started}, stopped before its "
                              f"first checkpoint; start it again with --force")
    try:
        own = (started or options.tokenizer != "char") and tokenizer_from_dict(
            ckpt.tokenizer)  # the source's, or a BPE's: the checkpoint's, not made again
        run = Run(fields, options, tokenizer=own or None,
                  started_from=ckpt and ckpt.meta.get("started_from"),
                  vocab=stored.config.get("vocab") if own else None)
    except (ValueError, TypeError, KeyError) as e:  # e.g. the --text file is gone
        raise CheckpointError(f"{source}: cannot rebuild the run: {e}") from None
    if ckpt is not None:
        same_tokens = ckpt.tokenizer == (run.tokenizer.to_dict() if run.tokenizer else None)
        if run.data_fingerprint != ckpt.meta.get("data_fingerprint") or not same_tokens:
            what = options.text or "the embedded corpus"
            raise CheckpointError(f"{source}: the training data changed since the checkpoint "
                                  f"was written ({what}); cannot resume exactly")
    built = dataclasses.asdict(run.config)
    if built != stored.config:
        diff = sorted(k for k in set(built) | set(stored.config)
                      if built.get(k) != stored.config.get(k))
        raise CheckpointError(f"{source}: the config does not match the model it describes "
                              f"(differs in {diff})")
    if ckpt is not None:
        run.restore(ckpt, source)
    return run


def model_from_checkpoint(target: str | Path, note: Callable[[str], None] = say):
    """``(model, tokenizer or None, checkpoint)`` of the run in a run folder or checkpoint
    file ``target`` (read by :func:`read_run`; the checkpoint's config and options in today's
    format), for sampling and export.

    Raises
    ------
    CheckpointError
        If there is no checkpoint, or it does not describe a model this library can build.
    """
    stored = read_run(target, note)
    path, name = stored.source, stored.model_class.__name__
    if stored.checkpoint is None:
        raise CheckpointError(f"{checkpoint_path(target)}: no such checkpoint file (its run "
                              f"stopped before its first save)")
    try:
        config = MODEL_CONFIGS[stored.options.model](**stored.config).validate()
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: bad {name} config: {e}") from None
    model = stored.model_class(config)
    try:
        model.load_state_dict(stored.checkpoint.params)
    except ValueError as e:
        raise CheckpointError(f"{path}: the weights do not match the model of its config: "
                              f"{e}") from None
    tokenizer = None
    if stored.checkpoint.tokenizer is not None:
        try:
            tokenizer = tokenizer_from_dict(stored.checkpoint.tokenizer)
        except (ImportError, ValueError) as e:
            raise CheckpointError(f"{path}: bad tokenizer: {e}") from None
    return model, tokenizer, stored.checkpoint


class LoadedRun(NamedTuple):
    """A trained run, ready to use from Python (:func:`load_run`)."""

    model: object  # DecoderLM, EncoderClassifier, EncoderDecoder or LSTMLM, in eval mode
    tokenizer: CharTokenizer | BPETokenizer | None  # None for the synthetic tasks (digits)
    config: object  # the model's TransformerConfig or LSTMConfig
    options: RunOptions  # the training options it was trained with (task, steps, lr, ...)
    step: int  # the updates it had made when its checkpoint was written


def load_run(path: str | Path) -> LoadedRun:
    """The model of a run folder (or checkpoint file) that ``numpy-transformer train`` wrote,
    with its tokenizer and config, read the way ``sample`` and ``export`` read it.

    Parameters
    ----------
    path : str or Path
        A run folder (``runs/char-lm``) or its ``checkpoint.npz``.

    Returns
    -------
    LoadedRun
        ``(model, tokenizer, config, options, step)``; the model is in evaluation mode
        (dropout off), as ``sample`` uses it; ``model.train()`` switches it back.

    Raises
    ------
    CheckpointError
        A ``ValueError`` naming the file: no checkpoint yet, a newer format, a file that does
        not describe a model this library builds.

    Examples
    --------
    >>> run = load_run("runs/char-lm")  # doctest: +SKIP
    >>> run.tokenizer.decode(generate(run.model, run.tokenizer.encode("def "), steps=40))
    ... # doctest: +SKIP
    """
    model, tokenizer, ckpt = model_from_checkpoint(path)
    return LoadedRun(model.eval(), tokenizer, model.config, RunOptions(**ckpt.options),
                     ckpt.step)

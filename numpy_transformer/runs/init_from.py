"""``train --init-from SOURCE``: a new run that starts from another model's weights.

The source is a run folder (its ``checkpoint.npz``, the weights it ended with), a checkpoint
``.npz`` (a run's ``best.npz``, say), a folder ``numpy-transformer export`` wrote (its
``model.safetensors``), or a Hugging Face folder (``config.json`` and ``model.safetensors``
of GPT-2's or LLaMA's shape, ``export --format hf``). It must hold a language model and its
tokenizer.

The new run takes from the source what its weights need: the model's options (its shape) and
the tokenizer (characters, which must cover the new text, or a BPE). Everything else is the
new run's: the text, the steps, the optimiser and its settings (fresh moments, step 0), the
seed (data order, dropout), and the dtype, backend and dropout rates, which the weights do
not fix. A model option given
that differs from the source's is refused, naming each. ``config.json`` records where the run
started: ``"started_from": {"path", "weights_sha256", "step"}``, the SHA-256 of the weights
(``data.fingerprint``) as the new run's first step finds them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import NamedTuple

from ..bpe import BPETokenizer
from ..data import CharTokenizer, fingerprint
from ..nn import LSTMLM, DecoderLM, Module
from .options import BY_KEY, MODEL_KEYS, flag, resolve_options, shown
from .outputs import UsageError
from .state import Run
from .stored import model_from_checkpoint

# config fields the weights do not fix
FREE_FIELDS = ("dtype", "backend", "dropout", "attn_dropout")
WEIGHTS = "model.safetensors"  # what an exported folder holds (export.WEIGHTS_FILE)


class Source(NamedTuple):
    """The model a run starts from (:func:`read_source`)."""

    path: Path  # what --init-from named, absolute
    model: Module  # DecoderLM or LSTMLM
    tokenizer: CharTokenizer | BPETokenizer
    step: int | None  # the updates a checkpoint had made; None for an exported folder

    def record(self) -> dict:
        """What the new run's ``config.json`` says of it."""
        return {"path": str(self.path), "weights_sha256": fingerprint(self.model.state_dict()),
                "step": self.step}

    def new_run(self, config_fields: dict, options: dict) -> Run:
        """The run of ``options`` with the source's tokenizer and, at step 0, its weights."""
        run = Run(config_fields, options, tokenizer=self.tokenizer, started_from=self.record())
        run.model.load_state_dict(self.model.state_dict())  # cast to the run's dtype
        return run


def read_source(target: str | Path) -> Source:
    """The language model and tokenizer of ``target`` (see the module docstring).

    Raises
    ------
    UsageError
        One line: no such file or folder, nothing this library reads, a package to install,
        or a model that is not a language model with a tokenizer.
    """
    path = Path(target).absolute()
    if not path.exists():
        raise UsageError(f"--init-from {target}: no such file or folder")
    try:
        if path.is_dir() and (path / WEIGHTS).is_file() or path.suffix == ".safetensors":
            from ..export import load_model

            exported = load_model(path)
            model, tokenizer, step = exported.model, exported.tokenizer, exported.info.get("step")
        else:
            model, tokenizer, ckpt = model_from_checkpoint(path)
            step = ckpt.step
    except (ImportError, ValueError) as e:  # CheckpointError is a ValueError
        raise UsageError(f"--init-from {target}: {e}") from None
    if tokenizer is None or not isinstance(model, (DecoderLM, LSTMLM)):
        raise UsageError(f"--init-from {target}: holds a {type(model).__name__}"
                         f"{'' if tokenizer else ' without a tokenizer'}; a run starts from a "
                         f"language model and its tokenizer")
    return Source(path, model, tokenizer, step if isinstance(step, int) else None)


def resolve_init_from(given: dict) -> tuple[dict, dict, Source]:
    """The options of a run that starts from ``given["init_from"]``: ``given`` (the options of
    the command line, ``None`` = not given) with the model's options taken from the source.

    Returns ``(config_fields, train_options, source)``, as
    :func:`~.options.resolve_options` and the source for :meth:`Source.new_run`.

    Raises
    ------
    UsageError
        If the source cannot be read, a task other than ``lm`` is asked for, or model options
        were given that differ from the source's (all of them named).
    """
    task = given.pop("task", None)
    if task not in (None, "lm"):
        raise UsageError(f"--init-from starts a language model, not --task {task}")
    source = read_source(given["init_from"])
    kind = "lstm" if isinstance(source.model, LSTMLM) else "transformer"
    config = dataclasses.asdict(source.model.config)
    bpe = isinstance(source.tokenizer, BPETokenizer)
    fixed = {"model": kind, **{k: config[k] for k in MODEL_KEYS[kind] if k not in FREE_FIELDS},
             "tokenizer": "bpe" if bpe else "char",
             "vocab_size": source.tokenizer.vocab_size if bpe else None}
    conflicts = [f"{flag(k)} {shown(BY_KEY[k], given[k])} (the source's: "
                 f"{shown(BY_KEY[k], value)})" for k, value in fixed.items()
                 if given.get(k) is not None and given[k] != value]
    if conflicts:
        raise UsageError(f"--init-from {given['init_from']} takes the model's options from it: "
                         f"drop {', '.join(conflicts)}")
    free = {k: config[k] for k in FREE_FIELDS if k in config and given.get(k) is None}
    config_fields, options = resolve_options("lm", {**given, **fixed, **free})
    return config_fields, options, source

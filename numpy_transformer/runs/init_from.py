"""``train --init-from SOURCE``: a new run that starts from another model's weights.

The source is a run folder (its ``checkpoint.npz``, the weights it ended with), a checkpoint
``.npz`` (a run's ``best.npz``, say), a folder ``numpy-transformer export`` wrote (its
``model.safetensors``), or a Hugging Face folder (``config.json`` and ``model.safetensors``
of GPT-2's or LLaMA's shape, ``export --format hf``). It must hold a language model and its
tokenizer.

The new run takes from the source what its weights need: the model's options (its shape) and
the tokenizer (characters, which must cover the new text, or a BPE, ids unchanged, with as
many embedding rows as the source has). Everything else is the new run's: the text, the
steps, the optimiser and its settings (fresh moments, step 0), the seed (data order,
dropout), the dtype, backend and dropout rates, which the weights do not fix, and the context
``--context T``: any length for sinusoidal or rotary positions, at most the rows of a learned
position table, of which it keeps the first T. A model option given that differs from the
source's is refused, naming each. ``config.json`` records where the run started:
``"started_from": {"path", "weights_sha256", "step"}``, the SHA-256 of the weights
(``data.fingerprint``) as the source holds them.
"""

from __future__ import annotations

import dataclasses

from ..bpe import BPETokenizer
from ..nn import LSTMLM
from .options import BY_KEY, MODEL_KEYS, RunOptions, flag, resolve_options, shown
from .outputs import UsageError
from .sources import Source, read_source
from .state import Run

# config fields the weights do not fix
FREE_FIELDS = ("dtype", "backend", "dropout", "attn_dropout")


def new_run(source: Source, config_fields: dict[str, object], options: RunOptions,
            training: bool = True) -> Run:
    """The run of ``options`` with the source's tokenizer and, at step 0, its weights (the
    first ``max_len`` rows of a learned position table, for a shorter context); not
    ``training``: sized as ``import`` needs it (:class:`~.state.Run`)."""
    run = Run(config_fields, options, tokenizer=source.tokenizer, started_from=source.record(),
              vocab=source.model.config.vocab, training=training)
    state = source.model.state_dict()
    positions = "decoder.embed.positions.table"
    if positions in state and run.config.max_len < len(state[positions]):
        state[positions] = state[positions][:run.config.max_len]  # positions 0 .. T - 1
    run.model.load_state_dict(state)  # cast to the run's dtype
    return run


def resolve_init_from(given: dict[str, object]
                      ) -> tuple[dict[str, object], RunOptions, Source]:
    """The options of a run that starts from ``given["init_from"]``: ``given`` (the options of
    the command line, ``None`` = not given) with the model's options taken from the source.

    Returns ``(config_fields, options, source)``, as
    :func:`~.options.resolve_options` and the source for :func:`new_run`.

    Raises
    ------
    UsageError
        If the source cannot be read, a task other than ``lm`` is asked for, or model options
        were given that differ from the source's (all of them named).
    """
    task = given.pop("task", None)
    if task not in (None, "lm"):
        raise UsageError(f"--init-from starts a language model, not --task {task}")
    source = read_source(given["init_from"], f"--init-from {given['init_from']}")
    return (*source_options(source, given, "--init-from"), source)


def source_options(source: Source, given: dict[str, object], what: str
                   ) -> tuple[dict[str, object], RunOptions]:
    """``(config_fields, options)`` of a run that starts from ``source``: ``given``
    (``None`` = not given) with the model's options taken from it; a ``--context`` of its
    own where the positions allow one (learned positions: at most the source's rows).

    Raises
    ------
    UsageError
        If model options were given that differ from the source's (all of them named), or a
        context longer than a learned position table.
    """
    kind = "lstm" if isinstance(source.model, LSTMLM) else "transformer"
    config = dataclasses.asdict(source.model.config)
    bpe = isinstance(source.tokenizer, BPETokenizer)
    free = FREE_FIELDS + ("max_len",)
    fixed = {"model": kind, **{k: config[k] for k in MODEL_KEYS[kind] if k not in free},
             "tokenizer": "bpe" if bpe else "char",
             "vocab_size": source.tokenizer.vocab_size if bpe else None}
    context = given.get("max_len")
    if context is not None and config.get("positions") == "learned" \
            and context > config["max_len"]:
        raise UsageError(f"{what} {source.path}: --context {context} is longer than its "
                         f"learned position table of {config['max_len']} rows; give at most "
                         f"{config['max_len']}")
    conflicts = [f"{flag(k)} {shown(BY_KEY[k], given[k])} (the source's: "
                 f"{shown(BY_KEY[k], value)})" for k, value in fixed.items()
                 if given.get(k) is not None and given[k] != value]
    if conflicts:
        raise UsageError(f"{what} {source.path} takes the model's options from it: drop "
                         f"{', '.join(conflicts)}")
    kept = {k: config[k] for k in free if k in config and given.get(k) is None}
    return resolve_options("lm", {**given, **fixed, **kept})

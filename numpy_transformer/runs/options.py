"""What a run is asked to do: the tasks and their defaults, the files of a run folder, the exit
codes, and the one error that means bad input.

This module is the bottom of :mod:`numpy_transformer.runs` and imports nothing but the standard
library and the config's names, so the command line can build its help and refuse a bad option
before NumPy is loaded. Every other module of the package may import it; it imports none of them.
"""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from ..config import DEFAULT_BACKEND


class UsageError(ValueError):
    """Bad input from the user: printed as one line, exit code 2."""


def say(*parts: object) -> None:
    """Print one message of the run on stdout, flushed."""
    print(*parts, flush=True)


def describe_os_error(e: OSError) -> str:
    """A failed read or write in one line: the file, then the system's reason."""
    reason = e.strerror or str(e)
    return f"{e.filename}: {reason}" if e.filename else reason


# --------------------------------------------------------------------------------------------
# Exit codes
# --------------------------------------------------------------------------------------------

EXIT_OK = 0  # finished (also: --resume of a run that had already finished)
EXIT_DIVERGED = 1  # a non-finite loss or gradient; the last good checkpoint is left untouched
EXIT_USAGE = 2  # bad input: an option, a file, a run folder, a checkpoint, a size too large
EXIT_IO = 74  # a file could not be read or written (sysexits.h's EX_IOERR): permission denied,
#   a read-only folder, a full disk, a file-size limit; the previous checkpoint is left intact
EXIT_ON_SIGNAL = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + signal number, as a shell


# --------------------------------------------------------------------------------------------
# The files of a run folder
# --------------------------------------------------------------------------------------------

RUN_FILES = {  # every file a run writes into its folder, in the order it first writes them
    "config.json": "the model config and the training options (written first)",
    "checkpoint.npz": "weights, Adam moments, step, every RNG state (see checkpoint.py)",
    "log.jsonl": 'one JSON line per step {"step", "loss", "lr", "grad_norm", "tokens_per_s"} '
                 'and per evaluation {"step", "val_loss", ["val_acc"], ["final"]}',
    "loss.png": "training loss (and held-out loss) against step",
    "attention.png": "last layer's attention weights on a held-out snippet, one panel per head",
    "sample.txt": "a sample from the final model",
}
CONFIG, CHECKPOINT, LOG, LOSS_PLOT, ATTENTION_PLOT, SAMPLE = RUN_FILES  # their names
REPORT_FILES = (LOSS_PLOT, ATTENTION_PLOT, SAMPLE)  # written after the last step (report.py)
# The files only some runs write: (option, the value of it that writes the file, who that is).
# An LSTM has no attention map; a synthetic task has no text to sample.
WRITTEN_ONLY_BY = {ATTENTION_PLOT: ("model", "transformer", "Transformers"),
                   SAMPLE: ("task", "lm", "language models")}


def files_of(task: str, model: str, names: tuple[str, ...] = tuple(RUN_FILES)) -> tuple[str, ...]:
    """Those of ``names`` that a run of ``task`` and ``model`` writes (``WRITTEN_ONLY_BY``)."""
    run = {"task": task, "model": model}
    return tuple(name for name in names if name not in WRITTEN_ONLY_BY
                 or run[WRITTEN_ONLY_BY[name][0]] == WRITTEN_ONLY_BY[name][1])


# --------------------------------------------------------------------------------------------
# The tasks and their defaults
# --------------------------------------------------------------------------------------------

TASKS = ("lm", "sort", "copy", "reverse")
DEFAULT_TASK = "lm"
MODELS = ("transformer", "lstm")  # --model of the LM: DecoderLM or LSTMLM; the tasks: the first
DEFAULT_MODEL = MODELS[0]
COPY_SHIFT = 3  # the copy task predicts the digit 3 places back
REVERSE_LENGTH = 8  # the reverse task's source length (its default --context)

# The chapter's character model and its training recipe. 1,500 steps of 0.1-0.15 s (float32,
# two cores, an otherwise idle machine) plus evaluation, plots and a sample: about four to five
# minutes. Measured under load: a step is ~0.45 s with one BLAS thread on a third of a core,
# i.e. ~0.15 s on a whole one. Lower it here if your machine is slower.
MODEL_DEFAULTS = {
    "lm": dict(width=84, heads=4, layers=2, ffn_width=168, max_len=100, norm="layernorm",
               activation="relu", positions="sinusoidal", norm_first=True, dropout=0.0,
               embed_scale=True, tie_embeddings=False, bias=True, backend=DEFAULT_BACKEND,
               dtype="float32"),
    # The synthetic tasks: short digit sequences, a small model learns them in a minute.
    "task": dict(width=64, heads=4, layers=2, ffn_width=128, max_len=10, norm="layernorm",
                 activation="relu", positions="sinusoidal", norm_first=True, dropout=0.0,
                 embed_scale=False, tie_embeddings=False, bias=True, backend=DEFAULT_BACKEND,
                 dtype="float32"),
    # --model lstm: embedding 85, one layer of 128, context 100: 132,336 parameters at the
    # chapter's vocabulary of 104, the Transformer's 132,488 less 0.11% (the chapter's own LSTM
    # had 133,224). The LSTMConfig of experiments/charlm.py, trained with the LM's recipe.
    "lstm": dict(hidden=128, embed=85, layers=1, max_len=100, backend=DEFAULT_BACKEND,
                 dtype="float32"),
}
TRAIN_DEFAULTS = {
    "lm": dict(steps=1500, batch=64, lr=2e-3, optimizer="adam", weight_decay=0.0, warmup=0,
               schedule="constant", clip=1.0, seed=0, eval_every=250, save_every=100,
               text=None),
    "task": dict(steps=600, batch=64, lr=1e-3, optimizer="adam", weight_decay=0.0, warmup=0,
                 schedule="constant", clip=1.0, seed=0, eval_every=200, save_every=100,
                 text=None),
}
# The config fields a run of each model sets (not vocab and seed: the data and --seed set them)
MODEL_KEYS = {"transformer": tuple(MODEL_DEFAULTS["lm"]), "lstm": tuple(MODEL_DEFAULTS["lstm"])}
TRAIN_KEYS = tuple(TRAIN_DEFAULTS["lm"])
# The options of one model only, e.g. --width (Transformer) and --hidden (LSTM), by model
ONLY_OF = {model: tuple(k for k in keys
                        if not any(k in MODEL_KEYS[other] for other in MODELS if other != model))
           for model, keys in MODEL_KEYS.items()}
OPTION_KEYS = ("model", *MODEL_KEYS["transformer"], *ONLY_OF["lstm"],
               *TRAIN_KEYS)  # every option of train but --task: the user's
OPTIMIZERS = ("adam", "adamw")
SCHEDULES = ("constant", "cosine")

# What a finished language model writes to sample.txt, and what `numpy-transformer sample` does
# unless told otherwise.
SAMPLE_PROMPT = "def "  # the embedded corpus is Python; a vocabulary without it starts elsewhere
SAMPLE_LENGTH, SAMPLE_TEMPERATURE = 300, 0.8
MAX_SAMPLE_LENGTH = 1_000_000  # sample --length: a few minutes of the char model, not days


# --------------------------------------------------------------------------------------------
# What each numeric option accepts
# --------------------------------------------------------------------------------------------

class Rule(NamedTuple):
    """A numeric option's type, the values it accepts and how a refusal describes them."""

    kind: type  # int or float
    ok: Callable[[float], bool]
    expected: str


POSITIVE_INT = Rule(int, lambda v: v > 0, "a positive integer")
NONNEG_INT = Rule(int, lambda v: v >= 0, "an integer >= 0")
POSITIVE = Rule(float, lambda v: 0 < v < math.inf, "a positive number")
NONNEG = Rule(float, lambda v: 0 <= v < math.inf, "a number >= 0")
RATE = Rule(float, lambda v: 0 <= v < 1, "a probability in [0, 1)")
SHARE = Rule(float, lambda v: 0 < v <= 1, "a probability in (0, 1]")
LENGTH = Rule(int, lambda v: 0 < v <= MAX_SAMPLE_LENGTH,
              f"an integer from 1 to {MAX_SAMPLE_LENGTH:,}")
# The numeric options of train, by key. Sizes have no upper bound here: what cannot fit in
# memory is refused by numpy_transformer.memory before anything is allocated.
TRAIN_NUMBERS = {"width": POSITIVE_INT, "heads": POSITIVE_INT, "layers": POSITIVE_INT,
                 "ffn_width": POSITIVE_INT, "max_len": POSITIVE_INT, "dropout": RATE,
                 "hidden": POSITIVE_INT, "embed": POSITIVE_INT,
                 "lr": POSITIVE, "weight_decay": NONNEG, "warmup": NONNEG_INT, "clip": NONNEG,
                 "batch": POSITIVE_INT, "steps": POSITIVE_INT, "seed": NONNEG_INT,
                 "eval_every": NONNEG_INT, "save_every": NONNEG_INT}


FLAGS = {"max_len": "--context", "norm_first": "--post-ln"}  # the options named otherwise


def flag(key: str) -> str:
    """The command-line flag of option ``key``: ``"ffn_width"`` -> ``"--ffn-width"``."""
    return FLAGS.get(key, "--" + key.replace("_", "-"))


def parse_number(rule: Rule, text: str) -> float:
    """``text`` as a number ``rule`` accepts.

    Raises
    ------
    ValueError
        Saying what was expected and what was given (NaN is never accepted).
    """
    try:
        value = rule.kind(text)
    except ValueError:
        value = math.nan
    if value != value or not rule.ok(value):  # NaN fails every comparison but this one
        raise ValueError(f"expected {rule.expected}, got {text!r}")
    return value


def check_stored_options(config_fields: dict, options: dict) -> None:
    """Check options read back from a run folder or a checkpoint as the command line checks
    what it parses: each number's type and range, each choice's name.

    Raises
    ------
    UsageError
        Naming the first bad option.
    """
    given = {**config_fields, **options}
    for key, allowed in (("task", TASKS), ("model", MODELS), ("optimizer", OPTIMIZERS),
                         ("schedule", SCHEDULES)):
        if given.get(key) not in allowed:
            raise UsageError(f"--{key} {given.get(key)!r}: expected one of {allowed}")
    check_model_fits_task(given["task"], given["model"])
    for key in MODEL_KEYS[given["model"]] + TRAIN_KEYS:
        rule = TRAIN_NUMBERS.get(key)
        if rule is None:
            continue
        value = given.get(key)
        types = (int,) if rule.kind is int else (int, float)
        if isinstance(value, bool) or not isinstance(value, types) or not rule.ok(value):
            raise UsageError(f"{flag(key)} {value!r}: expected {rule.expected}")
    if not isinstance(given.get("text"), (str, type(None))):
        raise UsageError(f"--text {given.get('text')!r}: expected a file name")


def check_model_fits_task(task: str, model: str) -> None:
    """Refuse a model the task cannot train: only the language model may be an LSTM.

    Raises
    ------
    UsageError
    """
    if task != "lm" and model != DEFAULT_MODEL:
        raise UsageError(f"--model {model} is for --task lm; the {task} task trains a "
                         f"Transformer")


def with_model(options: dict) -> dict:
    """``options`` with its ``model``: options written before ``--model`` existed describe a
    Transformer."""
    return {"model": DEFAULT_MODEL, **options}


def default_run_folder(task: str, model: str = DEFAULT_MODEL) -> Path:
    """Where a run goes without ``--out``: ``runs/char-lm``, ``runs/char-lstm`` (``--model
    lstm``) or ``runs/<task>``."""
    if task != "lm":
        return Path("runs") / task
    return Path("runs") / ("char-lstm" if model == "lstm" else "char-lm")


def resolve_options(task: str, given: dict) -> tuple[dict, dict]:
    """Merge the options the user gave (``None`` = not given) into the defaults of the task
    and the model (``given["model"]``, default :data:`DEFAULT_MODEL`).

    Returns ``(config_fields, train_options)``: keyword arguments of the model's config,
    TransformerConfig or LSTMConfig (without ``vocab``, which the data decides), and the
    training options, ``task`` and ``model`` included.

    Raises
    ------
    UsageError
        For an unknown task, model or option, an option of the other model (``--width`` for
        an LSTM, ``--hidden`` for a Transformer), or options that do not fit together.
    """
    if task not in TASKS:
        raise UsageError(f"--task must be one of {TASKS}, got {task!r}")
    model_kind = given.get("model") or DEFAULT_MODEL
    if model_kind not in MODELS:
        raise UsageError(f"--model must be one of {MODELS}, got {model_kind!r}")
    check_model_fits_task(task, model_kind)
    foreign = [key for key, value in given.items() if value is not None
               and any(key in ONLY_OF[other] for other in MODELS if other != model_kind)]
    if foreign:
        owner = next(other for other in MODELS if foreign[0] in ONLY_OF[other])
        names = ", ".join(flag(key) for key in foreign)
        raise UsageError(f"{names} {'is an option' if len(foreign) == 1 else 'are options'} of "
                         f"--model {owner} only, not of --model {model_kind}")
    kind = "lm" if task == "lm" else "task"
    model = dict(MODEL_DEFAULTS["lstm" if model_kind == "lstm" else kind])
    if task == "reverse":
        model["max_len"] = REVERSE_LENGTH
    train = dict(TRAIN_DEFAULTS[kind])
    for key, value in given.items():
        if value is None or key == "model":
            continue
        if key in model:
            model[key] = value
        elif key in train:
            train[key] = value
        else:
            raise UsageError(f"unknown option {key!r}")
    if task != "lm" and train["text"] is not None:
        raise UsageError(f"--text is for --task lm; the {task} task makes its own data")
    if train["schedule"] == "cosine" and train["warmup"] >= train["steps"]:
        raise UsageError(f"--warmup {train['warmup']} must be smaller than --steps "
                         f"{train['steps']} for the cosine schedule")
    if task == "copy" and model["max_len"] <= COPY_SHIFT:
        raise UsageError(f"the copy task predicts the digit {COPY_SHIFT} places back: --context "
                         f"must exceed {COPY_SHIFT}, got {model['max_len']}")
    if train["text"] is not None:
        train["text"] = os.path.abspath(train["text"])  # resume works from any folder
    train["task"], train["model"] = task, model_kind
    return model, train

"""What a run is asked to do: its options, the option table of ``numpy-transformer train``
and the tasks.

A run carries its training options as :class:`RunOptions`, a frozen dataclass, and its
model's as the fields of the model's config. :data:`OPTIONS` has one row per option of
``train``, and everything else about the options is made from it: the command line's parser
and help (``cli.py``), each run's defaults (:func:`resolve_options`: the chapter's, the
presets ``TransformerConfig.chapter()`` and ``LSTMConfig.chapter()`` and the defaults of
:class:`RunOptions`, unless the row overrides them for the synthetic tasks), the checks of
options read back from disk (:func:`stored_options`), and what a run written by an older
format version lacks (:func:`fill_missing`). A new option is a row here, a field of
:class:`RunOptions` or of the config, and the code that uses it.

This module imports nothing but the standard library, the config, the file reader
(``files.py``) and :mod:`.outputs`, so the command line can build its help and refuse a bad
option (or ``--config`` file) before NumPy is loaded.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import NamedTuple

from ..config import (
    ACTIVATIONS,
    BACKENDS,
    BPE_MIN_VOCAB,
    DTYPES,
    NORMS,
    POSITIONS,
    TOKENIZERS,
    LSTMConfig,
    TransformerConfig,
)
from ..files import read_file
from .outputs import MAX_SAMPLE_LENGTH, UsageError

# --------------------------------------------------------------------------------------------
# The tasks and the models
# --------------------------------------------------------------------------------------------

TASKS = ("lm", "sort", "copy", "reverse")
DEFAULT_TASK = "lm"
# --model of the LM: DecoderLM or LSTMLM; the tasks train the first. Each model's config
# dataclass: its fields are the options a run of it sets (the rows of OPTIONS storing "config").
MODEL_CONFIGS = {"transformer": TransformerConfig, "lstm": LSTMConfig}
MODELS = tuple(MODEL_CONFIGS)
DEFAULT_MODEL = MODELS[0]
CONFIG_FIELDS = {model: {f.name: f for f in dataclasses.fields(cls)}
                 for model, cls in MODEL_CONFIGS.items()}
COPY_SHIFT = 3  # the copy task predicts the digit 3 places back
OPTIMIZERS = ("adam", "adamw")
SCHEDULES = ("constant", "cosine")


def default_run_folder(task: str, model: str = DEFAULT_MODEL) -> Path:
    """Where a run goes without ``--out``: ``runs/char-lm``, ``runs/char-lstm`` (``--model
    lstm``) or ``runs/<task>``."""
    if task != "lm":
        return Path("runs") / task
    return Path("runs") / ("char-lstm" if model == "lstm" else "char-lm")

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
BPE_VOCAB = Rule(int, lambda v: v >= BPE_MIN_VOCAB,
                 f"an integer >= {BPE_MIN_VOCAB} (the 256 bytes and a merge)")
LENGTH = Rule(int, lambda v: 0 < v <= MAX_SAMPLE_LENGTH,
              f"an integer from 1 to {MAX_SAMPLE_LENGTH:,}")


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


# --------------------------------------------------------------------------------------------
# The training options of a run
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunOptions:
    """The training options of a run, its task and model among them: what ``config.json`` and
    its checkpoints record under ``"options"`` (``dataclasses.asdict`` writes them,
    :func:`stored_options` reads them back). The model's own options are the fields of its
    config, ``TransformerConfig`` or ``LSTMConfig``.

    The defaults are the recipe of the chapter's language model; :func:`resolve_options`
    gives every run its own (the synthetic tasks': the ``overrides`` of the rows of
    :data:`OPTIONS`), and the command line's defaults are made from both.
    """

    task: str = DEFAULT_TASK  # one of TASKS
    text: str | None = None  # the LM's UTF-8 text, an absolute path; None: the embedded corpus
    init_from: str | None = None  # the model it started from, an absolute path; None: random
    #   weights from the seed
    tokenizer: str = TOKENIZERS[0]  # characters, as the chapter; or a BPE learned on the text
    vocab_size: int | None = None  # the BPE's vocabulary; None for characters
    model: str = DEFAULT_MODEL  # the LM: "transformer" (DecoderLM) or "lstm" (LSTMLM)
    optimizer: str = "adam"  # the chapter's; "adamw" decays the weights apart from Adam
    lr: float = 2e-3  # the chapter's peak learning rate
    weight_decay: float = 0.0  # none, as the chapter
    warmup: int = 0  # none: pre-LN blocks train without (Xiong et al.)
    schedule: str = "constant"  # the chapter's; "cosine" decays to zero over the steps
    clip: float = 1.0  # the chapter's global gradient-norm clip; 0 = off
    batch: int = 64  # the chapter's windows per step
    steps: int = 1500  # the chapter made 2,501 updates; these keep the default run to minutes
    #   on two cores (benchmarks/README.md times a step)
    seed: int = 0  # fixes the weights, the data order and every dropout mask
    eval_every: int = 250  # held-out loss every N steps; 0 = only at the end
    early_stop: int = 0  # stop after K evaluations without a new best; 0 = never
    stats_every: int = 0  # each tensor's gradient norm and update ratio every N steps; 0 = never
    save_every: int = 100  # a checkpoint every N steps; 0 = only at the end
    tensorboard: bool = False  # also write the log as TensorBoard events


# --------------------------------------------------------------------------------------------
# The option table
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Option:
    """One option of ``numpy-transformer train``: a row of :data:`OPTIONS`. Its default is a
    field's: of :class:`RunOptions` (a training option), or of the model's chapter preset
    (``TransformerConfig.chapter()``, ``LSTMConfig.chapter()``: a config field), unless
    ``overrides`` gives a synthetic task another one."""

    key: str  # its name in config.json (and the argparse dest)
    group: str  # the section of --help it is listed in
    _: KW_ONLY
    help: str = ""  # what it does; --help adds its defaults ([84; the tasks: 64])
    store: str | None = "options"  # where a run records it: "options", a field of RunOptions;
    #   "config", a field of the model configs that have it (MODEL_CONFIGS); None: not at all
    #   (how this command runs)
    rule: Rule | None = None  # a number: its type and range
    choices: tuple[str, ...] | None = None  # a name: the registry it is one of
    switch: str | None = None  # a boolean: "both" (--x / --no-x), "off" (the flag sets False),
    #   "on" (the flag sets True)
    overrides: dict | None = None  # the default of some runs: by the task ("reverse"), or
    #   "task" (every synthetic task), looked up in that order
    since: tuple[int, object] | None = None  # (N, X): recorded from format version N on; a
    #   run of an older version that lacks it did what X does (fill_missing). A new option
    #   takes the next version, and checkpoint.FORMAT_VERSION becomes it
    flag: str | None = None  # on the command line; None: "--" + key with dashes
    metavar: str | None = None
    shown: dict | None = None  # how --help shows a default value, where not as itself


DATA, MODEL, TRANSFORMER, LSTM = ("data", "model", f"Transformer (--model {DEFAULT_MODEL})",
                                  "LSTM (--model lstm)")
TRAINING, FOLDER = "optimisation", "run folder"

OPTIONS = (
    Option("task", DATA, help="lm: next-character model (DecoderLM, or LSTMLM with --model "
           f"lstm); sort (EncoderClassifier), copy (DecoderLM, digit {COPY_SHIFT} back), reverse "
           "(EncoderDecoder)", choices=TASKS),
    Option("text", DATA, help="UTF-8 text to train the LM on", metavar="FILE",
           shown={None: "the embedded corpus: this library's own source"}),
    Option("init_from", DATA, help="start from the weights, model options and tokenizer of a "
           "run folder (its checkpoint.npz), a checkpoint .npz or an exported folder "
           "(safetensors or Hugging Face): a new run from step 0, with fresh optimiser state",
           metavar="SOURCE", shown={None: "random weights from --seed"},
           since=(5, None)),  # runs written before it started from their seed
    Option("tokenizer", DATA, help="char: a token per character; bpe: a byte-level BPE "
           "learned on the text (needs the tokenizers package of the hf extra)",
           choices=TOKENIZERS, since=(5, TOKENIZERS[0])),  # before it: characters
    Option("vocab_size", DATA, help="the BPE's vocabulary size, --tokenizer bpe only",
           rule=BPE_VOCAB, metavar="N", shown={None: "none"}, since=(5, None)),
    Option("model", MODEL, help="the language model: a Transformer (DecoderLM) or an LSTM "
           "(LSTMLM); --task lm only", choices=MODELS,
           since=(2, DEFAULT_MODEL)),  # runs written before --model trained a Transformer
    Option("layers", MODEL, help="Transformer blocks, or stacked LSTM layers", store="config",
           rule=POSITIVE_INT),
    Option("max_len", MODEL, help="window length T = max_len, the size of a Transformer's "
           "position table", store="config", rule=POSITIVE_INT,
           overrides={"task": 10, "reverse": 8},  # the reverse task: its source length
           flag="--context", metavar="T"),
    Option("dtype", MODEL, store="config", choices=DTYPES),
    Option("backend", MODEL, help="numpy: the readable NumPy references; numba: the fused "
           "kernels (attention, norms, activations, loss, LSTM recurrence)", store="config",
           choices=BACKENDS),
    Option("width", TRANSFORMER, help="residual width C", store="config", rule=POSITIVE_INT,
           overrides={"task": 64}),
    Option("heads", TRANSFORMER, help="attention heads, must divide width", store="config",
           rule=POSITIVE_INT),
    Option("kv_heads", TRANSFORMER, help="heads of the keys and values, must divide --heads; "
           "fewer is grouped-query attention, as LLaMA 3", store="config", rule=POSITIVE_INT,
           metavar="K", shown={None: "as many as --heads"},
           since=(4, None)),  # runs written before it had one kv head per query head
    Option("ffn_width", TRANSFORMER, help="feed-forward hidden width", store="config",
           rule=POSITIVE_INT, overrides={"task": 128}),
    Option("norm", TRANSFORMER, store="config", choices=NORMS),
    Option("norm_eps", TRANSFORMER, help="the norms' epsilon", store="config", rule=POSITIVE,
           metavar="EPS", since=(4, None),  # runs written before it had the norms' defaults
           shown={None: "LayerNorm 1e-5, RMSNorm the dtype's machine epsilon"}),
    Option("activation", TRANSFORMER, store="config", choices=ACTIVATIONS),
    Option("positions", TRANSFORMER, store="config", choices=POSITIONS),
    Option("norm_first", TRANSFORMER, help="post-LN blocks as Vaswani et al.", store="config",
           switch="off", flag="--post-ln", shown={True: "pre-LN", False: "post-LN"}),
    Option("dropout", TRANSFORMER, help="on every sublayer's output and the embeddings",
           store="config", rule=RATE),
    Option("attn_dropout", TRANSFORMER, help="on the attention weights, after the softmax "
           "(GPT-2's attn_pdrop)", store="config", rule=RATE,
           since=(6, 0.0)),  # runs written before it dropped no attention weights
    Option("embed_scale", TRANSFORMER, help="multiply the token embeddings by sqrt(width), as "
           "Vaswani et al.", store="config", switch="both", overrides={"task": False}),
    Option("tie_embeddings", TRANSFORMER, help="the output head reuses the token embedding "
           "table, as GPT-2", store="config", switch="both"),
    Option("bias", TRANSFORMER, help="every linear layer adds a bias; --no-bias drops them "
           "all, as LLaMA", store="config", switch="both"),
    Option("hidden", LSTM, help="width H of the hidden and cell states", store="config",
           rule=POSITIVE_INT),
    Option("embed", LSTM, help="width E of the token embedding; the default lands near the "
           "Transformer's size", store="config", rule=POSITIVE_INT),
    Option("optimizer", TRAINING, choices=OPTIMIZERS),
    Option("lr", TRAINING, help="peak learning rate", rule=POSITIVE, overrides={"task": 1e-3}),
    Option("weight_decay", TRAINING, rule=NONNEG),
    Option("warmup", TRAINING, help="linear warmup steps", rule=NONNEG_INT),
    Option("schedule", TRAINING, choices=SCHEDULES),
    Option("clip", TRAINING, help="global gradient-norm clip, 0 = off", rule=NONNEG),
    Option("batch", TRAINING, help="windows per step", rule=POSITIVE_INT),
    Option("steps", TRAINING, help="updates; the environment variable NUMPY_TRANSFORMER_STEPS, "
           "where set, replaces the default (a quick walk through the commands)",
           rule=POSITIVE_INT, overrides={"task": 600}),
    Option("seed", TRAINING, help="fixes the weights, the data order and every dropout mask",
           rule=NONNEG_INT),
    Option("eval_every", TRAINING, help="held-out loss every N steps, 0 = only at the end",
           rule=NONNEG_INT, overrides={"task": 200}),
    Option("early_stop", TRAINING, help="stop once K held-out evaluations in a row found no "
           "new best (best.npz keeps the best), 0 = never", rule=NONNEG_INT, metavar="K",
           since=(3, 0)),  # runs written before it never stopped early
    Option("stats_every", TRAINING, help="every N steps, each tensor's gradient norm and "
           "update-to-weight ratio into log.jsonl and stats.png, 0 = never", rule=NONNEG_INT,
           since=(5, 0)),  # runs written before it kept none
    Option("save_every", TRAINING, help="checkpoint every N steps, 0 = only at the end",
           rule=NONNEG_INT),
    Option("tensorboard", TRAINING, help="also write log.jsonl's numbers as TensorBoard events "
           "into RUN_DIR/tensorboard (needs tensorboardX: pip install "
           "\"numpy_transformer[tensorboard]\")", switch="on",
           since=(5, False)),  # runs written before it wrote none
    Option("out", FOLDER, help=f"where the run goes [{default_run_folder('lm')}, "
           f"{default_run_folder('lm', 'lstm')} or {default_run_folder('TASK')}]; a folder "
           "that holds another run, or this one unfinished, is refused (--force, --resume); "
           "without --out, one that holds this run finished is said and left (exit 0)",
           store=None, metavar="RUN_DIR"),
    Option("force", FOLDER, help="reuse a non-empty run folder (our files in it are replaced)",
           store=None, switch="on"),
    Option("resume", FOLDER, help="continue the run in RUN_DIR exactly where its checkpoint "
           "left it (takes no model/optimiser options; --steps N extends it, finished or not, "
           "to the run of N steps)", store=None, metavar="RUN_DIR"),
    Option("quiet", FOLDER, help="no progress bar", store=None, switch="on"),
    Option("config", FOLDER, help="read options from a TOML file: one key = value per option, "
           "the keys those of a run's config.json (max_len = 64, norm_first = false); an "
           "option also given as a flag takes the flag's value", store=None,
           metavar="FILE.toml"),
)
BY_KEY = {option.key: option for option in OPTIONS}


def applies(option: Option, model: str) -> bool:
    """Whether a run of ``model`` has ``option``: a config field only the configs that have
    the field (``--width`` is a Transformer's, ``--hidden`` an LSTM's)."""
    return option.store != "config" or option.key in CONFIG_FIELDS.get(model, {})


# The config fields a run of each model sets (not vocab, seed, num_classes: the data and
# --seed set them) and the training options it records (task and model among them).
MODEL_KEYS = {model: tuple(o.key for o in OPTIONS if o.store == "config" and applies(o, model))
              for model in MODELS}
TRAIN_KEYS = tuple(field.name for field in dataclasses.fields(RunOptions))
# The defaults of every run but the rows' overrides: each model's chapter preset (config.py
# says why each value is what it is) and RunOptions' recipe
PRESETS = {model: dataclasses.asdict(cls.chapter()) for model, cls in MODEL_CONFIGS.items()}
RECIPE = dataclasses.asdict(RunOptions())
# The options of one model only, e.g. --width (Transformer) and --hidden (LSTM), by model
ONLY_OF = {model: tuple(k for k in keys
                        if not any(k in MODEL_KEYS[other] for other in MODELS if other != model))
           for model, keys in MODEL_KEYS.items()}
# The numeric options of train, by key. Sizes have no upper bound here: what cannot fit in
# memory is refused by numpy_transformer.memory before anything is allocated.
TRAIN_NUMBERS = {o.key: o.rule for o in OPTIONS if o.rule is not None}


def flag(key: str) -> str:
    """The command-line flag of option ``key``: ``"ffn_width"`` -> ``"--ffn-width"``."""
    option = BY_KEY.get(key)
    return option.flag if option and option.flag else "--" + key.replace("_", "-")


def default_of(option: Option, task: str, model: str) -> object:
    """The default of ``option`` (one a run records) in a run of ``task`` and ``model``: the
    row's override for the task or for every synthetic task (``"task"``), in that order; else
    the field of the model's chapter preset (a config field) or of :class:`RunOptions`.

    Raises
    ------
    LookupError
        For an option a run of ``model`` does not have (``--hidden`` of a Transformer).
    """
    overrides = option.overrides or {}
    for profile in (task, "task" if task != "lm" else None):
        if profile in overrides:
            return overrides[profile]
    defaults = PRESETS[model] if option.store == "config" else RECIPE
    if option.key not in defaults:
        raise LookupError(f"{flag(option.key)} is no option of a run of --model {model}")
    return defaults[option.key]


def shown(option: Option, value: object) -> str:
    """How ``--help`` and the notes show a value of ``option``: booleans as on / off."""
    if option.shown and value in option.shown:
        return option.shown[value]
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


# --------------------------------------------------------------------------------------------
# The options of a run: from the command line, and read back from disk
# --------------------------------------------------------------------------------------------

def resolve_options(task: str | None, given: dict[str, object]
                    ) -> tuple[dict[str, object], RunOptions]:
    """Merge the options the user gave (``None`` = not given) into the defaults of the task
    (``None``: :data:`DEFAULT_TASK`) and the model (``given["model"]``, default
    :data:`DEFAULT_MODEL`).

    Returns ``(config_fields, options)``: keyword arguments of the model's config,
    TransformerConfig or LSTMConfig (without ``vocab``, which the data decides), and the
    training options, ``task`` and ``model`` included.

    Raises
    ------
    UsageError
        For an unknown task, model or option, an option of the other model (``--width`` for
        an LSTM, ``--hidden`` for a Transformer), or options that do not fit together.
    """
    task = DEFAULT_TASK if task is None else task
    model = given.get("model") or DEFAULT_MODEL
    for key, value in (("task", task), ("model", model)):
        if value not in BY_KEY[key].choices:
            raise UsageError(f"--{key} must be one of {BY_KEY[key].choices}, got {value!r}")
    check_model_fits_task(task, model)
    unknown = [k for k in given if k not in BY_KEY or k == "task" or not BY_KEY[k].store]
    if unknown:
        raise UsageError(f"unknown option {unknown[0]!r}")
    foreign = [k for k, value in given.items() if value is not None
               and not applies(BY_KEY[k], model)]
    if foreign:
        owner = next(other for other in MODELS if foreign[0] in ONLY_OF[other])
        names = ", ".join(flag(key) for key in foreign)
        raise UsageError(f"{names} {'is an option' if len(foreign) == 1 else 'are options'} of "
                         f"--model {owner} only, not of --model {model}")
    values = {o.key: default_of(o, task, model) for o in OPTIONS if o.store and applies(o, model)}
    values.update(steps_from_environment())
    values.update({k: v for k, v in given.items() if v is not None}, task=task, model=model)
    for key in ("text", "init_from"):  # resume works from any folder
        if values[key] is not None:
            values[key] = os.path.abspath(values[key])
    config = {k: values[k] for k in MODEL_KEYS[model]}
    options = RunOptions(**{k: values[k] for k in TRAIN_KEYS})
    check_together(config, options)
    return config, options


CONFIG_FILE_LIMIT = 1 << 20  # bytes of a --config file: a run's options take a few hundred


def read_config_file(path: str | os.PathLike) -> dict:
    """The options of a TOML file (``train --config``), each checked as the command line
    checks its own: ``{key: value}`` with the keys of :data:`OPTIONS` that a run records.

    Raises
    ------
    UsageError
        Naming the file and the first thing wrong: missing, not a regular file (a folder, a
        FIFO, a device, said which), larger than :data:`CONFIG_FILE_LIMIT`, not UTF-8, not
        TOML, an unknown key (a flag's spelling, as ``context`` for ``max_len``, is named), a
        value it refuses.
    OSError
        If it cannot be read (permission denied: the command line's exit 74).
    """
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        table = tomllib.loads(read_file(path, "TOML file", CONFIG_FILE_LIMIT, text=True))
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"--config {path}: not TOML ({e})") from None
    except RecursionError:
        raise UsageError(f"--config {path}: not TOML (nested too deeply to read)") from None
    except ValueError as e:  # read_file: the wrong kind of file, named
        raise UsageError(f"--config {e}") from None
    by_flag = {flag(o.key)[2:].replace("-", "_"): o.key for o in OPTIONS}
    for key, value in table.items():
        if key not in BY_KEY or not BY_KEY[key].store:
            known = by_flag.get(key.replace("-", "_"))
            hint = f" (its key is {known!r})" if known in BY_KEY and BY_KEY[known].store else ""
            raise UsageError(f"--config {path}: {key!r} is not an option a run records{hint}")
        try:
            check_value(BY_KEY[key], value)
        except UsageError as e:
            raise UsageError(f"--config {path}: {e}") from None
    return table


STEPS_VARIABLE = "NUMPY_TRANSFORMER_STEPS"


def steps_from_environment() -> dict:
    """``{"steps": N}`` where the environment variable ``NUMPY_TRANSFORMER_STEPS`` gives the
    default number of updates of every new run (``--steps`` still wins; the README's test
    sets 2 to run each of its commands in seconds); else ``{}``.

    Raises
    ------
    UsageError
        If the variable is not a positive integer.
    """
    text = os.environ.get(STEPS_VARIABLE)
    if text is None:
        return {}
    try:
        return {"steps": parse_number(POSITIVE_INT, text)}
    except ValueError as e:
        raise UsageError(f"{STEPS_VARIABLE}: {e}") from None


def check_model_fits_task(task: str, model: str) -> None:
    """Refuse a model the task cannot train: only the language model may be an LSTM.

    Raises
    ------
    UsageError
    """
    if task != "lm" and model != DEFAULT_MODEL:
        raise UsageError(f"--model {model} is for --task lm; the {task} task trains a "
                         f"Transformer")


def check_together(config: dict[str, object], options: RunOptions) -> None:
    """Refuse options that are each fine but do not fit together.

    Raises
    ------
    UsageError
    """
    task = options.task
    for key in ("text", "init_from", "vocab_size"):
        if task != "lm" and getattr(options, key) is not None:
            raise UsageError(f"{flag(key)} is for --task lm; the {task} task makes its own data")
    if (options.tokenizer == "bpe") != (options.vocab_size is not None):
        raise UsageError("--tokenizer bpe takes its size from --vocab-size N, and only it does")
    if options.schedule == "cosine" and options.warmup >= options.steps:
        raise UsageError(f"--warmup {options.warmup} must be smaller than --steps "
                         f"{options.steps} for the cosine schedule")
    if task == "copy" and config["max_len"] <= COPY_SHIFT:
        raise UsageError(f"the copy task predicts the digit {COPY_SHIFT} places back: --context "
                         f"must exceed {COPY_SHIFT}, got {config['max_len']}")


def defaults(option: Option) -> list:
    """Every default ``option`` can take: its overrides', the presets' or RunOptions', and
    those of the config fields of its name."""
    found = list((option.overrides or {}).values())
    found += [d[option.key] for d in (RECIPE, *PRESETS.values()) if option.key in d]
    found += [fields[option.key].default for fields in CONFIG_FIELDS.values()
              if option.key in fields and fields[option.key].default is not dataclasses.MISSING]
    return found


def check_value(option: Option, value: object) -> None:
    """Refuse a value of ``option`` read back from disk that the command line would not give.

    Raises
    ------
    UsageError
        Naming the flag, the value and what was expected.
    """
    if value is None and None in defaults(option):  # an optional number left unset
        return
    if option.rule is not None:
        types = (int,) if option.rule.kind is int else (int, float)
        ok = not isinstance(value, bool) and isinstance(value, types) and option.rule.ok(value)
        expected = option.rule.expected
    elif option.choices is not None:
        ok, expected = isinstance(value, str) and value in option.choices, \
            f"one of {option.choices}"
    elif option.switch is not None:
        ok, expected = isinstance(value, bool), "true or false"
    else:
        ok, expected = isinstance(value, (str, type(None))), "a file name"
    if not ok:
        raise UsageError(f"{flag(option.key)} {value!r}: expected {expected}")


def stored_options(config: dict[str, object], options: dict[str, object]) -> RunOptions:
    """The options of a config and its options read back from a run folder or a checkpoint
    (in today's format: :func:`fill_missing`), checked as the command line checks what it
    parses: every option there and none unknown, each number's type and range, each choice's
    name, and that they fit together.

    Raises
    ------
    UsageError
        Naming the first bad option.
    """
    unknown = sorted(set(options) - set(TRAIN_KEYS))
    if unknown:
        raise UsageError(f"unknown options {unknown} (from a newer version?)")
    trained = [o for o in OPTIONS if o.store == "options"]
    _check_recorded(trained, options)
    for key in ("task", "model"):  # they decide what else there is
        check_value(BY_KEY[key], options[key])
    check_model_fits_task(options["task"], options["model"])
    fields = [o for o in OPTIONS if o.store == "config" and applies(o, options["model"])]
    _check_recorded(fields, config)
    for o in trained + fields:
        check_value(o, (config if o.store == "config" else options)[o.key])
    typed = RunOptions(**options)
    check_together(config, typed)
    return typed


def _check_recorded(rows: list[Option], values: dict) -> None:
    """Refuse ``values`` read back from disk that lack any of ``rows``."""
    missing = [flag(o.key) for o in rows if o.key not in values]
    if missing:
        raise UsageError(f"no {', '.join(missing)} recorded")


def fill_missing(config: dict, options: dict, version: int) -> tuple[dict, dict, list[str]]:
    """A run's config and options written in format ``version``, in today's format: each
    option recorded only since a later version that they lack (its row's ``since``) takes the
    value that reproduces what runs of ``version`` did.

    Returns the new config and options, and ``"--flag value"`` of each option filled in.
    """
    config, options, filled = dict(config), dict(options), []
    for store, values in (("options", options), ("config", config)):  # the model comes first
        for o in OPTIONS:
            if o.store != store or o.since is None or version >= o.since[0] or o.key in values:
                continue
            if applies(o, options.get("model")):
                values[o.key] = o.since[1]
                filled.append(f"{flag(o.key)} {shown(o, o.since[1])}")
    return config, options, filled

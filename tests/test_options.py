"""The option table of ``numpy-transformer train`` (``runs/options.py``): the defaults it
gives every run are those of before it, every config field is an option or set by the run,
and the parser, the help and the ``--resume`` refusal are made from it."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from _run_helpers import one_line_error, run_cli

from numpy_transformer import cli, cli_parser
from numpy_transformer.config import LSTMConfig, TransformerConfig
from numpy_transformer.runs.options import (
    BY_KEY,
    CONFIG_FIELDS,
    MODEL_KEYS,
    MODELS,
    OPTIONS,
    TASKS,
    TRAIN_KEYS,
    Option,
    RunOptions,
    applies,
    check_value,
    default_of,
    flag,
    resolve_options,
)
from numpy_transformer.runs.outputs import EXIT_CODES, UsageError

# What runs/options.py's MODEL_DEFAULTS and TRAIN_DEFAULTS said at 3fa17c2, before the table:
# the numbers of every run stay those (a config field added since defaults to what runs did).
BEFORE = {
    "transformer": dict(heads=4, layers=2, norm="layernorm", activation="relu",
                        positions="sinusoidal", norm_first=True, dropout=0.0,
                        tie_embeddings=False, bias=True, backend="numba", dtype="float32"),
    "lm": dict(width=84, ffn_width=168, max_len=100, embed_scale=True),
    "task": dict(width=64, ffn_width=128, max_len=10, embed_scale=False),
    "lstm": dict(hidden=128, embed=85, layers=1, max_len=100, backend="numba",
                 dtype="float32"),
    "recipe": dict(batch=64, optimizer="adam", weight_decay=0.0, warmup=0,
                   schedule="constant", clip=1.0, seed=0, save_every=100, text=None),
    "lm recipe": dict(steps=1500, lr=2e-3, eval_every=250),
    "task recipe": dict(steps=600, lr=1e-3, eval_every=200),
}
# The config fields that are no option: the data sets vocab (and the sort task num_classes),
# --seed sets seed, and embed_std keeps its dataclass default.
SET_BY_THE_RUN = {"vocab", "num_classes", "seed", "embed_std"}


@pytest.mark.parametrize("task,model", [("lm", "transformer"), ("lm", "lstm"),
                                        *((t, "transformer") for t in TASKS[1:])])
def test_every_run_has_the_defaults_of_before_the_table(task, model):
    fields, options = resolve_options(task, {"model": model})
    kind = "lm" if task == "lm" else "task"
    want = BEFORE["lstm"] if model == "lstm" else {**BEFORE["transformer"], **BEFORE[kind]}
    if task == "reverse":
        want = {**want, "max_len": 8}  # the reverse task's source length
    assert {k: fields[k] for k in want} == want  # (an option added since: see its row)
    want = {**BEFORE["recipe"], **BEFORE[f"{kind} recipe"], "task": task, "model": model}
    assert {k: getattr(options, k) for k in want} == want


@pytest.mark.parametrize("model,config", [("transformer", TransformerConfig),
                                          ("lstm", LSTMConfig)])
def test_the_language_models_defaults_are_the_chapter_presets(model, config):
    """One set of defaults: a default ``train`` (of either model) trains the config's chapter
    preset with RunOptions' recipe; the synthetic tasks' own come from the rows' overrides."""
    fields, options = resolve_options("lm", {"model": model})
    assert config(vocab=104, seed=0, **fields) == config.chapter()
    assert options == RunOptions(model=model)
    fields, options = resolve_options("sort", {})
    assert fields != {k: getattr(TransformerConfig.chapter(), k) for k in fields}
    assert options != RunOptions(task="sort")  # the tasks' recipe: see test above


def test_a_presets_changes_are_checked_fields():
    assert TransformerConfig.chapter(dtype="float64").dtype == "float64"
    assert TransformerConfig.chapter(50).vocab == 50
    with pytest.raises(TypeError, match="colour"):
        TransformerConfig.chapter(colour="red")
    assert LSTMConfig.chapter().embed_width == 85


def test_a_run_carries_its_options_frozen_and_typed():
    """RunOptions' fields are the rows a run records as options, in the table's order (the
    order config.json lists them), each with a type hint; a run cannot change them in place."""
    assert TRAIN_KEYS == tuple(o.key for o in OPTIONS if o.store == "options")
    hints = typing.get_type_hints(RunOptions)
    assert all(isinstance(getattr(RunOptions(), key), hints[key]) for key in TRAIN_KEYS)
    options = resolve_options("lm", {})[1]
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.steps = 3
    assert dataclasses.replace(options, steps=3).steps == 3 and options.steps != 3


def test_a_row_of_the_table_takes_keywords():
    assert Option("k", "g", help="h").help == "h"
    with pytest.raises(TypeError):
        Option("k", "g", "h")  # negative control: nothing past the group by position


def test_every_config_field_is_an_option_or_set_by_the_run():
    """A new field of TransformerConfig or LSTMConfig needs its row in OPTIONS (with
    ``since=`` for the runs written before it), or a place in SET_BY_THE_RUN."""
    for model in MODELS:
        options = set(CONFIG_FIELDS[model]) - SET_BY_THE_RUN
        assert set(MODEL_KEYS[model]) == options, (model, options ^ set(MODEL_KEYS[model]))
    assert all(o.key in set().union(*CONFIG_FIELDS.values())
               for o in OPTIONS if o.store == "config")


def test_the_defaults_of_the_help_come_from_the_table_and_the_dataclasses():
    shown = {key: cli_parser.defaults_shown(BY_KEY[key]) for key in
             ("width", "layers", "max_len", "embed_scale", "norm_first", "hidden", "text",
              "backend", "activation")}
    assert shown == {"width": "[84; the tasks: 64]", "layers": "[2; --model lstm: 1]",
                     "max_len": "[100; the tasks: 10; --task reverse: 8]",
                     "embed_scale": "[on; the tasks: off]", "norm_first": "[pre-LN]",
                     "hidden": "[128]",
                     "text": "[the embedded corpus: this library's own source]",
                     "backend": "[numba]", "activation": "[relu]"}
    text = cli.build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    for o in OPTIONS:
        assert flag(o.key) in text, o.key
    assert all(f"  {code} " in text for code in EXIT_CODES)


def test_the_parser_of_train_is_the_table():
    train = cli.build_parser()._subparsers._group_actions[0].choices["train"]
    parsed = {a.dest: a.option_strings for a in train._actions if a.dest != "help"}
    assert list(parsed) == [o.key for o in OPTIONS]
    for o in OPTIONS:
        assert flag(o.key) in parsed[o.key]
        if o.switch == "both":
            assert f"--no-{flag(o.key)[2:]}" in parsed[o.key]


def _given(option) -> list[str]:
    """The option on the command line, with a value it accepts."""
    if option.switch is not None:
        return [flag(option.key)]
    model = next(m for m in MODELS if applies(option, m))
    value = default_of(option, "lm", model) if option.store else "x"
    if value is None:  # an optional number (one it accepts: --vocab-size 1 is not), or a file
        value = next(v for v in (1, 1024) if option.rule.ok(v)) if option.rule else "x"
    return [flag(option.key), str(value)]


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.key not in cli.WITH_RESUME],
                         ids=lambda o: o.key)
def test_resume_takes_no_option_but_quiet(option, tmp_path):
    code, _, err = run_cli(["train", "--resume", tmp_path, *_given(option), "--quiet"])
    assert code == 2 and one_line_error(err) and f"drop {flag(option.key)}" in err, err


def test_a_config_row_belongs_to_the_models_whose_config_has_the_field():
    for o in OPTIONS:
        if o.store == "config":
            owners = [m for m in MODELS if o.key in CONFIG_FIELDS[m]]
            assert [m for m in MODELS if o.key in MODEL_KEYS[m]] == owners
            for m in owners:
                assert default_of(o, "lm", m) == getattr(
                    {"transformer": TransformerConfig, "lstm": LSTMConfig}[m].chapter(), o.key)
            others = [m for m in MODELS if m not in owners]
            for m in others:  # negative control: --hidden has no default in a Transformer
                with pytest.raises(LookupError, match=f"no option of a run of --model {m}"):
                    default_of(o, "lm", m)


def test_a_stored_number_may_be_unset_only_where_unset_is_a_default():
    # An optional number (a config field whose default is None, "each norm's own" say): a run
    # that left it unset stores null, which reads back; a number that always has a value
    # does not take null.
    for key in ("vocab_size", "norm_eps", "kv_heads", "embed"):
        check_value(BY_KEY[key], None)
    check_value(BY_KEY["norm_eps"], 0.5)
    with pytest.raises(UsageError, match="--lr None: expected a positive number"):
        check_value(BY_KEY["lr"], None)
    with pytest.raises(UsageError, match="--norm-eps -1: expected a positive number"):
        check_value(BY_KEY["norm_eps"], -1)


def test_the_steps_variable_replaces_the_default_and_a_flag_wins(monkeypatch):
    monkeypatch.setenv("NUMPY_TRANSFORMER_STEPS", "2")
    assert resolve_options("lm", {})[1].steps == 2
    assert resolve_options("sort", {})[1].steps == 2  # every task's default
    assert resolve_options("lm", {"steps": 7})[1].steps == 7
    for bad in ("0", "x", "2.5", ""):
        monkeypatch.setenv("NUMPY_TRANSFORMER_STEPS", bad)
        with pytest.raises(UsageError, match="NUMPY_TRANSFORMER_STEPS: expected a positive "):
            resolve_options("lm", {})
    monkeypatch.delenv("NUMPY_TRANSFORMER_STEPS")
    assert resolve_options("lm", {})[1].steps == RunOptions().steps

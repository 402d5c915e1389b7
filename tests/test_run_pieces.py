"""The pieces a run is built from (``runs/state.py``, ``runs/training_data.py``): the data
asked the same questions for every task, the model's config and class, the optimiser and the
learning-rate schedule, each from the run's options."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from _run_helpers import TINY_FIELDS, small_text

from numpy_transformer.nn import LSTMLM, DecoderLM, EncoderClassifier, EncoderDecoder
from numpy_transformer.optim import Adam, AdamW
from numpy_transformer.runs.options import RunOptions, resolve_options
from numpy_transformer.runs.outputs import UsageError
from numpy_transformer.runs.state import (
    Run,
    checked_config,
    lr_schedule,
    make_optimizer,
    model_class,
    model_config,
)
from numpy_transformer.runs.training_data import TASK_EVAL_SET, TaskData, training_data


@pytest.mark.parametrize("task,vocab,classes", [("sort", 10, 10), ("copy", 10, None),
                                                ("reverse", 11, None)])
def test_a_tasks_data(task, vocab, classes):
    """Its vocabulary, classes and generators; a held-out set fixed by the seed, whatever the
    batches drawn before it (negative control: another seed draws another set)."""
    options = RunOptions(task=task, batch=3)
    data = training_data(options, 6)
    assert isinstance(data, TaskData) and data.tokenizer is None and data.fingerprint is None
    assert (data.vocab, data.num_classes) == (vocab, classes)
    assert list(data.generators()) == ["data"]
    first, second = data.batch(0), data.batch(1)
    assert first.targets.shape[0] == 3 and not np.array_equal(first.targets, second.targets)
    fresh = training_data(options, 6).eval_set
    assert len(data.eval_set.targets) == TASK_EVAL_SET
    assert all(np.array_equal(a, b) for a, b in zip(data.eval_set.inputs, fresh.inputs,
                                                    strict=True))
    other = training_data(RunOptions(task=task, seed=1), 6).eval_set
    assert not np.array_equal(other.inputs[0], fresh.inputs[0])


def test_the_texts_schedule_is_the_same_for_every_length(tmp_path):
    """The first k steps' windows do not depend on the run's length: what makes a run
    extendable bit for bit (negative control: another seed, other windows)."""
    options = RunOptions(text=str(small_text(tmp_path)), batch=4)
    data = training_data(options, 16)
    assert data.generators() == {} and data.vocab == data.tokenizer.vocab_size
    data.plan(5)
    short, fingerprint = data.schedule.copy(), data.fingerprint
    data.plan(9)
    assert data.schedule.shape == (9, 4) and np.array_equal(data.schedule[:5], short)
    assert data.fingerprint != fingerprint
    other = training_data(dataclasses.replace(options, seed=1), 16)
    other.plan(5)
    assert not np.array_equal(other.schedule, short)


@pytest.mark.parametrize("task,model,cls", [("lm", "transformer", DecoderLM),
                                            ("lm", "lstm", LSTMLM),
                                            ("copy", "transformer", DecoderLM),
                                            ("sort", "transformer", EncoderClassifier),
                                            ("reverse", "transformer", EncoderDecoder)])
def test_the_model_of_each_run(task, model, cls, tmp_path):
    given = {"model": model, "text": str(small_text(tmp_path))} if task == "lm" else {}
    fields, options = resolve_options(task, given)
    assert model_class(options) is cls
    options = dataclasses.replace(options, seed=7)
    data = training_data(options, fields["max_len"])
    config = model_config(fields, options, data)
    assert (config.vocab, config.seed) == (data.vocab, 7)
    assert getattr(config, "num_classes", None) == data.num_classes


def test_the_memory_check_names_the_option_before_anything_is_drawn():
    fields, options = resolve_options("sort", {"max_len": 10 ** 12})
    data = training_data(options, fields["max_len"])
    with pytest.raises(UsageError, match="--context 1000000000000"):
        checked_config(model_config(fields, options, data), options, data)
    assert "eval_set" not in vars(data)  # the held-out set was not drawn


def test_the_optimiser_and_the_schedule():
    assert type(make_optimizer(RunOptions(), "numpy")) is Adam
    adamw = make_optimizer(RunOptions(optimizer="adamw", weight_decay=0.1), "numpy")
    assert type(adamw) is AdamW and adamw.weight_decay == 0.1
    constant = lr_schedule(RunOptions(lr=0.01))
    assert constant(1) == constant(500) == 0.01
    warm = lr_schedule(RunOptions(lr=0.01, warmup=4))
    assert [warm(s) for s in (1, 2, 4, 8)] == [0.0025, 0.005, 0.01, 0.01]
    cosine = lr_schedule(RunOptions(lr=0.01, schedule="cosine", steps=10))
    assert cosine(10) < cosine(5) < cosine(1) <= 0.01


def test_a_run_is_its_pieces(tmp_path):
    fields, options = resolve_options("lm", dict(TINY_FIELDS, text=str(small_text(tmp_path)),
                                                 steps=6))
    run = Run(fields, options)
    assert run.options is options and run.config.vocab == run.tokenizer.vocab_size
    assert run.data.schedule.shape == (6, 4) and run.trainer.lr_schedule(3) == options.lr
    assert run.description()["options"] == dataclasses.asdict(options)
    run.extend(8)
    assert run.options.steps == 8 and options.steps == 6  # a new RunOptions, the old kept
    assert run.data.schedule.shape == (8, 4)

"""A run in memory: the data, model, optimiser, trainer and every random generator of one
training run, built from its options.

:class:`Run` is put together by the small functions below it, each doing one thing: the data
(:func:`~.training_data.training_data`), the model's config (:func:`model_config`), the
memory check (:func:`checked_config`), the model (:func:`model_class`), the optimiser
(:func:`make_optimizer`) and the learning-rate schedule (:func:`lr_schedule`). It saves and
restores its checkpoints; reading a run folder back from disk is :mod:`.stored`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..bpe import BPETokenizer
from ..checkpoint import (
    FORMAT_VERSION,
    CheckpointError,
    dropout_layers,
    rng_states,
    save_checkpoint,
    set_rng_states,
)
from ..data import CharTokenizer
from ..memory import check_inference_fits, check_training_fits
from ..nn import LSTMLM, DecoderLM, EncoderClassifier, EncoderDecoder, LSTMConfig, TransformerConfig
from ..optim import Adam, AdamW
from ..schedules import constant_lr, warmup_cosine
from ..train import Batch, Trainer
from .options import MODEL_CONFIGS, RunOptions, flag
from .outputs import UsageError
from .training_data import TaskData, TextData, training_data

MODEL_CLASSES = {"lm": DecoderLM, "copy": DecoderLM, "sort": EncoderClassifier,
                 "reverse": EncoderDecoder}  # the Transformer of each task

# --------------------------------------------------------------------------------------------
# A run in memory: data, model, optimizer, generators
# --------------------------------------------------------------------------------------------

class Run:
    """Everything one training run needs in memory.

    Parameters
    ----------
    config_fields : dict
        Keywords of the model's config without ``vocab`` (and ``num_classes``, ``seed``):
        TransformerConfig's, or LSTMConfig's for ``options.model == "lstm"``.
    options : RunOptions
        Training options, including ``task`` and ``model``
        (:func:`~.options.resolve_options`).
    tokenizer : CharTokenizer or BPETokenizer, optional
        The LM's tokenizer, where it is not made from its text: that of the model it started
        from (``--init-from``, ``import``), or the one its checkpoint holds (made once: a
        BPE's).
    started_from : dict, optional
        What ``config.json`` records of the model it started from (``runs/init_from.py``).
    vocab : int, optional
        The LM's embedding rows, where they are not the tokenizer's ids: a model's vocabulary
        padded to a multiple (nanoGPT's 50,304 for GPT-2's 50,257). At least the tokenizer's.
    training : bool, default True
        Whether the run is built to train now: its memory check sizes a training step and a
        held-out evaluation. False (``import``): the weights, twice while they are copied in.

    Raises
    ------
    UsageError
        If the text has characters outside the given tokenizer (they are named), or the run
        does not fit.
    """

    def __init__(self, config_fields: dict[str, object], options: RunOptions,
                 tokenizer: CharTokenizer | BPETokenizer | None = None,
                 started_from: dict | None = None, vocab: int | None = None,
                 training: bool = True) -> None:
        self.options, self.started_from = options, started_from
        self.data = training_data(options, config_fields["max_len"], tokenizer, vocab)
        config = model_config(config_fields, options, self.data)
        self.config = checked_config(config, options, self.data, training)
        self.data.plan(options.steps)
        self.model = model_class(options)(self.config)
        self.optimizer = make_optimizer(options, self.config.backend)
        self.trainer = Trainer(self.model, self.optimizer, lr_schedule(options),
                               clip=options.clip or None, stats_every=options.stats_every)
        self.sample_rng = np.random.default_rng([options.seed, 3])

    @property
    def task(self) -> str:
        return self.options.task

    @property
    def tokenizer(self) -> CharTokenizer | BPETokenizer | None:
        """The LM's tokenizer; None for the synthetic tasks (digits are their own ids)."""
        return self.data.tokenizer

    @property
    def data_fingerprint(self) -> str | None:
        """The SHA-256 of the LM's text and window schedule; None for the synthetic tasks."""
        return self.data.fingerprint

    def extend(self, steps: int) -> None:
        """Make this run one of ``steps`` updates, from the step it is at: bit for bit the run
        configured with ``steps`` from the start, as every schedule but the cosine one is the
        same for every length (the cosine's learning rates depend on it from the first step).

        Raises
        ------
        UsageError
            If the run has made as many steps or more (a run of ``steps`` would not have
            evaluated at that step in its loop), or its schedule is the cosine one.
        """
        made, planned = self.trainer.step_count, self.options.steps
        if steps <= made and steps != planned:
            raise UsageError(f"--steps {steps}: the run has made {made} steps already; give "
                             f"more")
        if self.options.schedule == "cosine" and steps != planned:
            raise UsageError(f"--steps {steps}: the cosine schedule of this run decays over its "
                             f"{planned} steps, and one of {steps} would have had other "
                             f"learning rates from the first step; start a new run instead")
        self.options = dataclasses.replace(self.options, steps=steps)
        checked_config(self.config, self.options, self.data)
        self.data.plan(steps)
        self.trainer.lr_schedule = lr_schedule(self.options)

    def generators(self) -> dict[str, np.random.Generator]:
        """Every generator whose state a checkpoint must carry, by name."""
        gens = {f"dropout.{name}": layer.rng for name, layer in
                dropout_layers(self.model).items()}
        return {**gens, "sample": self.sample_rng, **self.data.generators()}

    def batch(self, index: int) -> Batch:
        """The batch of update ``index + 1`` (index = updates made so far)."""
        return self.data.batch(index)

    def evaluate(self) -> dict[str, float]:
        """Held-out loss (fixed windows for the LM; a fixed set for the tasks, plus accuracy),
        in evaluation mode."""
        self.model.eval()
        try:
            return self.data.evaluate(self.model)
        finally:
            self.model.train()

    def data_line(self) -> str:
        """What an LM run trains on, in one line: the text, how it is tokenized, its size."""
        o = self.options
        if self.started_from is not None:
            how = "by the tokenizer of the model it started from"
        else:
            how = "into characters" if o.tokenizer == "char" else "by a BPE learned on it"
        unit = "characters" if isinstance(self.tokenizer, CharTokenizer) else "tokens"
        return (f"data: {o.text or 'the embedded corpus'}, tokenized {how}: "
                f"{len(self.data.ids):,} {unit}, vocabulary {self.tokenizer.vocab_size}; "
                f"{o.steps} steps of {o.batch} windows")

    def summary(self) -> str:
        """The model in one line: its class, size and shape."""
        c = self.config
        head = f"{type(self.model).__name__}: {self.model.num_parameters():,} parameters"
        if self.options.model == "lstm":
            layers = f"{c.layers} LSTM layer{'s' if c.layers > 1 else ''}"
            return (f"{head}, embedding {c.embed_width}, {layers} of {c.hidden}, context "
                    f"{c.max_len}, {c.dtype}, {c.backend} recurrence")
        kv = f" ({c.kv_heads} of keys and values)" if c.kv_heads else ""
        return (f"{head}, width {c.width}, {c.heads} heads{kv}, {c.layers} layers, FFN "
                f"{c.ffn_width} {c.activation}, {c.positions} positions, context {c.max_len}, "
                f"{c.dtype}, {c.backend} attention")

    def meta(self, finished: bool, **more) -> dict:
        started = {"started_from": self.started_from} if self.started_from else {}
        return {"finished": finished, "model": type(self.model).__name__,
                "data_fingerprint": self.data_fingerprint, **started, **more}

    def description(self) -> dict:
        """What config.json holds; two runs with equal config and options are the same run.
        A run that started from another model's weights also says which ones."""
        started = {"started_from": self.started_from} if self.started_from else {}
        return {"format_version": FORMAT_VERSION, "config": dataclasses.asdict(self.config),
                "options": dataclasses.asdict(self.options), **started}

    # ---------------------------------------------------------------- checkpoints
    def save(self, path: Path, finished: bool = False, **meta) -> None:
        """A checkpoint of the run as it is now; ``meta`` joins its meta entry (the held-out
        loss of a best checkpoint, an early stop)."""
        save_checkpoint(path, step=self.trainer.step_count, model=self.model,
                        optimizer=self.optimizer, rng=rng_states(self.generators()),
                        config=dataclasses.asdict(self.config),
                        options=dataclasses.asdict(self.options),
                        tokenizer=self.tokenizer.to_dict() if self.tokenizer else None,
                        meta=self.meta(finished, **meta))

    def restore(self, ckpt, path: Path) -> None:
        """Load a checkpoint's weights, moments, step and generators into this run.

        Raises
        ------
        CheckpointError
            If anything in the checkpoint does not fit this run.
        """
        own = {n: p for n, p, _ in self.model.named_parameters()}
        for name, a in ckpt.params.items():
            if name in own and a.dtype != own[name].dtype:
                raise CheckpointError(f"{path}: param.{name} is {a.dtype} but the config says "
                                      f"{self.config.dtype}")
        try:
            self.model.load_state_dict(ckpt.params)
        except ValueError as e:
            raise CheckpointError(f"{path}: the weights do not match the model of its config: "
                                  f"{e}") from None
        if ckpt.optimizer["kind"] != type(self.optimizer).__name__:
            raise CheckpointError(f"{path}: optimizer {ckpt.optimizer['kind']} in the "
                                  f"checkpoint, {type(self.optimizer).__name__} in the options")
        try:
            self.optimizer.load_state_dict(ckpt.optimizer_state())
        except ValueError as e:
            raise CheckpointError(f"{path}: bad optimizer state: {e}") from None
        steps = self.options.steps
        if ckpt.step != self.optimizer.t or not 0 <= ckpt.step <= steps:
            raise CheckpointError(f"{path}: step {ckpt.step} does not fit optimizer step "
                                  f"{self.optimizer.t} and {steps} steps")
        set_rng_states(self.generators(), ckpt.rng, source=str(path))
        self.trainer.step_count = ckpt.step


# --------------------------------------------------------------------------------------------
# The pieces of a run
# --------------------------------------------------------------------------------------------

def model_class(options: RunOptions) -> type:
    """The model a run of ``options`` trains: the task's Transformer, or the LSTM LM."""
    return LSTMLM if options.model == "lstm" else MODEL_CLASSES[options.task]


def model_config(fields: dict[str, object], options: RunOptions,
                 data: TextData | TaskData) -> TransformerConfig | LSTMConfig:
    """The config of the run's model, not yet checked: ``fields`` with the vocabulary of its
    data (and the sort task's classes) and the run's seed."""
    classes = {} if data.num_classes is None else {"num_classes": data.num_classes}
    return MODEL_CONFIGS[options.model](vocab=data.vocab, seed=options.seed, **fields,
                                        **classes)


def checked_config(config: TransformerConfig | LSTMConfig, options: RunOptions,
                   data: TextData | TaskData, training: bool = True
                   ) -> TransformerConfig | LSTMConfig:
    """``config`` validated, once the run of ``options`` is known to fit in memory: the
    weights, gradients, Adam's moments, a step's activations (or an evaluation's, if larger)
    and the LM's window schedule (``numpy_transformer.memory``); not ``training``: the weights
    twice (a model's copied into the run's).

    A run that started from another model's weights cannot change its shape: its message
    names ``--batch`` or ``--context`` (``train --init-from``'s way out).

    Raises
    ------
    UsageError
        Naming the option that does not fit (the memory is checked first), or the bad value.
    """
    model, source = model_class(options).__name__, options.init_from
    try:
        if not training:
            check_inference_fits(config, model, 1, 1, copies=2, label=_option_label)
        else:
            hint = "" if source is None else (f" (a run of that size starts from the same "
                                              f"weights with train --init-from {source})")
            check_training_fits(config, model, options.batch, options.steps,
                                data.eval_rows(config), schedule=data.draws_up_front,
                                label=_option_label, hint=hint,
                                adjustable=None if source is None else ("batch", "max_len",
                                                                        "steps"))
        return config.validate()
    except ValueError as e:
        raise UsageError(str(e)) from None


def _option_label(key: str, value: int) -> str:
    """How a memory refusal names a size: by its flag (the vocabulary comes from the data)."""
    return f"a vocabulary of {value} characters" if key == "vocab" else f"{flag(key)} {value}"


def make_optimizer(options: RunOptions, backend: str) -> Adam:
    """The run's optimiser: Adam, or AdamW with decoupled weight decay."""
    kind = AdamW if options.optimizer == "adamw" else Adam
    return kind(lr=options.lr, weight_decay=options.weight_decay, backend=backend)


def lr_schedule(options: RunOptions) -> Callable[[int], float]:
    """The learning rate of each step: constant, after a linear warmup if any; or cosine."""
    lr, warmup = options.lr, options.warmup
    if options.schedule == "cosine":
        return warmup_cosine(lr, warmup, options.steps)
    if warmup == 0:
        return constant_lr(lr)
    return lambda step: lr * min(1.0, step / warmup)  # linear warmup, then constant

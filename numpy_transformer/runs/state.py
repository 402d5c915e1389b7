"""A run in memory: the data, model, optimiser, trainer and every random generator of one
training run, built from its options.

:class:`Run` builds everything from the options of :func:`~.options.resolve_options`, and
saves and restores its checkpoints. Reading a run folder back from disk is
:mod:`.stored`'s.
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
from ..data import (
    CharTokenizer,
    fingerprint,
    fixed_window_loss,
    get_batch,
    load_text,
    train_val_split,
    window_schedule,
)
from ..functional.softmax import cross_entropy_forward
from ..memory import check_inference_fits, check_training_fits, eval_batch
from ..nn import (
    LSTMLM,
    DecoderLM,
    EncoderClassifier,
    EncoderDecoder,
    LSTMConfig,
    TransformerConfig,
)
from ..optim import Adam, AdamW
from ..schedules import constant_lr, warmup_cosine
from ..tasks import IGNORE_INDEX, copy_back_batch, reverse_batch, sort_batch
from ..train import Batch, Trainer
from .options import COPY_SHIFT, flag
from .outputs import UsageError

MODEL_CLASSES = {"lm": DecoderLM, "copy": DecoderLM, "sort": EncoderClassifier,
                 "reverse": EncoderDecoder}  # the Transformer of each task
CONFIG_CLASSES = {DecoderLM: TransformerConfig, EncoderClassifier: TransformerConfig,
                  EncoderDecoder: TransformerConfig, LSTMLM: LSTMConfig}  # every model a run has
TASK_EVAL_SET = 512  # sequences of a synthetic task's fixed held-out set

# --------------------------------------------------------------------------------------------
# A run in memory: data, model, optimizer, generators
# --------------------------------------------------------------------------------------------

class Run:
    """Everything one training run needs in memory.

    Parameters
    ----------
    config_fields : dict
        Keywords of the model's config without ``vocab`` (and ``num_classes``, ``seed``):
        TransformerConfig's, or LSTMConfig's for ``options["model"] == "lstm"``.
    options : dict
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

    def __init__(self, config_fields: dict, options: dict,
                 tokenizer: CharTokenizer | BPETokenizer | None = None,
                 started_from: dict | None = None, vocab: int | None = None,
                 training: bool = True) -> None:
        self.options = options
        self.task = options["task"]
        self.model_kind = options["model"]  # "transformer" or "lstm" (--model)
        self.started_from = started_from
        seed = options["seed"]
        self.tokenizer: CharTokenizer | BPETokenizer | None = None
        self.length = config_fields["max_len"]  # T: LM window; task sequence length
        extra: dict = {}
        if self.task == "lm":
            vocab = self._read_text(tokenizer, vocab)
        else:
            vocab = 11 if self.task == "reverse" else 10  # digits, plus BOS for reverse
            if self.task == "sort":
                extra["num_classes"] = 10
        model_class = LSTMLM if self.model_kind == "lstm" else MODEL_CLASSES[self.task]
        config = CONFIG_CLASSES[model_class](vocab=vocab, seed=seed, **config_fields, **extra)
        try:
            self._check_memory(config, model_class.__name__, training)  # first: names options
            self.config = config.validate()
        except ValueError as e:
            raise UsageError(str(e)) from None
        if self.task == "lm":
            self._draw_schedule()
            self.data_rng = None
        else:
            self.data_rng = np.random.default_rng([seed, 1])  # one batch per step
            self.eval_set = self._task_batch(TASK_EVAL_SET, np.random.default_rng([seed, 2]))
            self.data_fingerprint = None
        self.model = model_class(self.config)
        opt_class = AdamW if options["optimizer"] == "adamw" else Adam
        self.optimizer = opt_class(lr=options["lr"], weight_decay=options["weight_decay"],
                                   backend=self.config.backend)
        self.trainer = Trainer(self.model, self.optimizer, self.lr_schedule(),
                               clip=options["clip"] or None, stats_every=options["stats_every"])
        self.sample_rng = np.random.default_rng([seed, 3])

    # ---------------------------------------------------------------- pieces
    def _read_text(self, tokenizer: CharTokenizer | BPETokenizer | None,
                   vocab: int | None) -> int:
        """The LM's text as ids (``self.ids``, split into ``train_ids`` and ``val_ids``) with
        its tokenizer (given, or made from the text); returns the model's vocabulary.

        Raises
        ------
        UsageError
            For characters the tokenizer cannot encode, a text too short for a window, a
            tokenizer with more ids than ``vocab``.
        """
        o, context = self.options, self.length
        what = o["text"] or "the embedded corpus"
        text = training_text(o)
        self.tokenizer = tokenizer or new_tokenizer(text, o)
        missing = self.tokenizer.missing(text)
        if missing:
            shown = "".join(missing[:20]) + ("..." if len(missing) > 20 else "")
            raise UsageError(f"{what} has {len(missing)} character(s) outside the tokenizer's "
                             f"vocabulary of {self.tokenizer.vocab_size}: {shown!r}")
        self.ids = self.tokenizer.encode(text)
        unit = "characters" if isinstance(self.tokenizer, CharTokenizer) else "tokens"
        if len(self.ids) < 20:
            raise UsageError(f"the text has {len(self.ids)} {unit}; a language model needs "
                             f"more to split into training and held-out parts")
        self.train_ids, self.val_ids = train_val_split(self.ids, 0.9)
        if len(self.train_ids) < context + 1:
            raise UsageError(f"the training part of {what} has {len(self.train_ids)} {unit}, "
                             f"fewer than one window of --context {context} + 1")
        if vocab is not None and vocab < self.tokenizer.vocab_size:
            raise UsageError(f"the tokenizer has {self.tokenizer.vocab_size} ids, more than the "
                             f"model's {vocab} embedding rows")
        return vocab or self.tokenizer.vocab_size

    def _check_memory(self, config: TransformerConfig | LSTMConfig, model: str,
                      training: bool = True) -> None:
        """Raise ``ValueError`` naming the option if the run cannot fit in memory: weights,
        gradients, Adam's moments, a step's activations (or an evaluation's, if larger) and
        the LM's window schedule (``numpy_transformer.memory``); not ``training``: the
        weights twice (a model's copied into the run's).

        A run that started from another model's weights cannot change its shape: its
        message names ``--batch`` or ``--context`` (``train --init-from``'s way out)."""
        if not training:
            check_inference_fits(config, model, 1, 1, copies=2, label=_option_label)
            return
        lm, source = self.task == "lm", self.options.get("init_from")
        hint = "" if source is None else (f" (a run of that size starts from the same "
                                          f"weights with train --init-from {source})")
        check_training_fits(config, model, self.options["batch"], self.options["steps"],
                            self.eval_batch(config) if lm else TASK_EVAL_SET, schedule=lm,
                            label=_option_label, hint=hint,
                            adjustable=None if source is None else ("batch", "max_len", "steps"))

    @staticmethod
    def eval_batch(config: TransformerConfig | LSTMConfig) -> int:
        """Windows per call of the LM's held-out loss (``memory.eval_batch``)."""
        return eval_batch(config)

    def _draw_schedule(self) -> None:
        """Every window start of the LM's run, drawn up front from a generator of its own
        (building the model cannot shift it); the first k steps' starts are the same for
        every number of steps >= k."""
        o = self.options
        self.schedule = window_schedule(len(self.train_ids), self.length, o["batch"],
                                        o["steps"], np.random.default_rng(o["seed"]))
        self.data_fingerprint = fingerprint(self.ids, self.schedule)

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
        made, planned = self.trainer.step_count, self.options["steps"]
        if steps <= made and steps != planned:
            raise UsageError(f"--steps {steps}: the run has made {made} steps already; give "
                             f"more")
        if self.options["schedule"] == "cosine" and steps != planned:
            raise UsageError(f"--steps {steps}: the cosine schedule of this run decays over its "
                             f"{planned} steps, and one of {steps} would have had other "
                             f"learning rates from the first step; start a new run instead")
        self.options = {**self.options, "steps": steps}
        try:
            self._check_memory(self.config, type(self.model).__name__)
        except ValueError as e:
            raise UsageError(str(e)) from None
        if self.task == "lm":
            self._draw_schedule()
        self.trainer.lr_schedule = self.lr_schedule()

    def lr_schedule(self) -> Callable[[int], float]:
        o = self.options
        if o["schedule"] == "cosine":
            return warmup_cosine(o["lr"], o["warmup"], o["steps"])
        if o["warmup"] == 0:
            return constant_lr(o["lr"])
        lr, warmup = o["lr"], o["warmup"]
        return lambda step: lr * min(1.0, step / warmup)  # linear warmup, then constant

    def generators(self) -> dict[str, np.random.Generator]:
        """Every generator whose state a checkpoint must carry, by name."""
        gens = {f"dropout.{name}": layer.rng for name, layer in
                dropout_layers(self.model).items()}
        gens["sample"] = self.sample_rng
        if self.data_rng is not None:
            gens["data"] = self.data_rng
        return gens

    def _task_batch(self, n: int, rng: np.random.Generator) -> Batch:
        length = self.length
        if self.task == "sort":
            x, y = sort_batch(n, rng, length=length)
            return Batch((x,), y)
        if self.task == "copy":
            x, y, mask = copy_back_batch(n, rng, length=length, shift=COPY_SHIFT)
            return Batch((x,), y, mask)
        src, tgt_in, tgt_out = reverse_batch(n, rng, length=length)
        return Batch((src, tgt_in), tgt_out)

    def batch(self, index: int) -> Batch:
        """The batch of update ``index + 1`` (index = updates made so far)."""
        if self.task == "lm":
            x, y = get_batch(self.train_ids, self.schedule[index], self.config.max_len)
            return Batch((x,), y)
        return self._task_batch(self.options["batch"], self.data_rng)

    def evaluate(self) -> dict:
        """Held-out loss (fixed windows for the LM; a fixed set for the tasks, plus accuracy)."""
        self.model.eval()
        try:
            if self.task == "lm":
                loss = fixed_window_loss(self.model.forward, self.val_ids, self.config.max_len,
                                         batch=self.eval_batch(self.config))
                return {"val_loss": float(loss)}
            b = self.eval_set
            logits = self.model.forward(*b.inputs)
            loss, _ = cross_entropy_forward(logits, b.targets, mask=b.mask)
            counted = b.targets != IGNORE_INDEX if b.mask is None else b.mask
            acc = float((logits.argmax(-1) == b.targets)[counted].mean())
            return {"val_loss": float(loss), "val_acc": acc}
        finally:
            self.model.train()

    def data_line(self) -> str:
        """What an LM run trains on, in one line: the text, how it is tokenized, its size."""
        o = self.options
        if self.started_from is not None:
            how = "by the tokenizer of the model it started from"
        else:
            how = "into characters" if o["tokenizer"] == "char" else "by a BPE learned on it"
        unit = "characters" if isinstance(self.tokenizer, CharTokenizer) else "tokens"
        return (f"data: {o['text'] or 'the embedded corpus'}, tokenized {how}: "
                f"{len(self.ids):,} {unit}, vocabulary {self.tokenizer.vocab_size}; "
                f"{o['steps']} steps of {o['batch']} windows")

    def summary(self) -> str:
        """The model in one line: its class, size and shape."""
        c = self.config
        head = f"{type(self.model).__name__}: {self.model.num_parameters():,} parameters"
        if self.model_kind == "lstm":
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
                "options": self.options, **started}

    # ---------------------------------------------------------------- checkpoints
    def save(self, path: Path, finished: bool = False, **meta) -> None:
        """A checkpoint of the run as it is now; ``meta`` joins its meta entry (the held-out
        loss of a best checkpoint, an early stop)."""
        save_checkpoint(path, step=self.trainer.step_count, model=self.model,
                        optimizer=self.optimizer, rng=rng_states(self.generators()),
                        config=dataclasses.asdict(self.config), options=self.options,
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
        if ckpt.step != self.optimizer.t or not 0 <= ckpt.step <= self.options["steps"]:
            raise CheckpointError(f"{path}: step {ckpt.step} does not fit optimizer step "
                                  f"{self.optimizer.t} and {self.options['steps']} steps")
        set_rng_states(self.generators(), ckpt.rng, source=str(path))
        self.trainer.step_count = ckpt.step


def _option_label(key: str, value: int) -> str:
    """How a memory refusal names a size: by its flag (the vocabulary comes from the data)."""
    return f"a vocabulary of {value} characters" if key == "vocab" else f"{flag(key)} {value}"


def new_tokenizer(text: str, options: dict) -> CharTokenizer | BPETokenizer:
    """The tokenizer of a new LM run: the characters of its text, or a BPE learned on it.

    Raises
    ------
    UsageError
        For ``--tokenizer bpe`` without the ``tokenizers`` package (one line: what to install).
    """
    if options["tokenizer"] == "char":
        return CharTokenizer(text)
    try:
        return BPETokenizer.train(text, options["vocab_size"])
    except ImportError as e:
        raise UsageError(f"--tokenizer bpe: {e}") from None


def training_text(options: dict) -> str:
    """The text an LM run trains on: its ``--text`` file, or the embedded corpus."""
    if options["text"]:
        return load_text(options["text"])
    from ..corpus import load_corpus

    return load_corpus()

"""What a run trains on and is measured on: the language model's text, cut into windows by a
schedule drawn up front, or a synthetic task's digit sequences, drawn a batch at a time.

:func:`training_data` makes the one a run's options ask for. The two answer the same
questions, so :class:`~.state.Run` asks them without looking at the task: the model's
vocabulary, the batch of each update, the held-out evaluation, the generators a checkpoint
saves.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from ..bpe import BPETokenizer
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
from ..memory import eval_batch
from ..nn import Module
from ..tasks import IGNORE_INDEX, copy_back_batch, reverse_batch, sort_batch
from ..train import Batch
from .options import COPY_SHIFT, RunOptions
from .outputs import UsageError

TASK_EVAL_SET = 512  # sequences of a synthetic task's fixed held-out set
TRAIN_SHARE = 0.9  # the LM's text: the first 90% trains it, the last 10% is held out


def training_data(options: RunOptions, context: int,
                  tokenizer: CharTokenizer | BPETokenizer | None = None,
                  vocab: int | None = None) -> TextData | TaskData:
    """The data of the run of ``options`` with windows (or sequences) of ``context``: the LM's
    text (:func:`read_text`; ``tokenizer`` and ``vocab`` as it takes them), or the task's
    sequences.

    Raises
    ------
    UsageError
        As :func:`read_text`.
    """
    if options.task == "lm":
        return read_text(options, context, tokenizer, vocab)
    return TaskData(options, context)


# --------------------------------------------------------------------------------------------
# The language model's text
# --------------------------------------------------------------------------------------------

class TextData:
    """The language model's text as ids, split into a training part and the held-out last
    tenth, with its tokenizer; every window start of the run is drawn up front
    (:meth:`plan`), from a generator of its own, so building the model cannot shift it.

    Attributes
    ----------
    tokenizer : CharTokenizer or BPETokenizer
    ids, train_ids, val_ids : ndarray of int
        The whole text, its training part and its held-out part.
    vocab : int
        The model's embedding rows: the tokenizer's ids, or more (a padded vocabulary).
    schedule : ndarray of shape (steps, batch)
        The window starts of each update (:meth:`plan`).
    fingerprint : str
        The SHA-256 of the ids and the schedule, which a resume checks.
    """

    draws_up_front = True  # the memory a run needs counts the schedule
    num_classes = None

    def __init__(self, tokenizer: CharTokenizer | BPETokenizer, ids: np.ndarray, vocab: int,
                 context: int, batch: int, seed: int) -> None:
        self.tokenizer, self.ids, self.vocab = tokenizer, ids, vocab
        self.train_ids, self.val_ids = train_val_split(ids, TRAIN_SHARE)
        self.context, self.batch_size, self.seed = context, batch, seed
        self.schedule: np.ndarray | None = None
        self.fingerprint: str | None = None

    def plan(self, steps: int) -> None:
        """Draw the window starts of a run of ``steps`` updates: the first k steps' starts are
        the same for every number of steps >= k."""
        self.schedule = window_schedule(len(self.train_ids), self.context, self.batch_size,
                                        steps, np.random.default_rng(self.seed))
        self.fingerprint = fingerprint(self.ids, self.schedule)

    def batch(self, index: int) -> Batch:
        """The windows of update ``index + 1``, and their next characters as targets."""
        x, y = get_batch(self.train_ids, self.schedule[index], self.context)
        return Batch((x,), y)

    def evaluate(self, model: Module) -> dict[str, float]:
        """The held-out loss over fixed windows of the context, each from an empty history."""
        config = model.config
        loss = fixed_window_loss(model.forward, self.val_ids, config.max_len,
                                 batch=eval_batch(config))
        return {"val_loss": float(loss)}

    @staticmethod
    def eval_rows(config) -> int:
        """Windows per call of the held-out loss (``memory.eval_batch``)."""
        return eval_batch(config)

    def generators(self) -> dict[str, np.random.Generator]:
        """None: the schedule is drawn again from the seed."""
        return {}


def read_text(options: RunOptions, context: int,
              tokenizer: CharTokenizer | BPETokenizer | None = None,
              vocab: int | None = None) -> TextData:
    """The LM's text (:func:`training_text`) as ids of ``tokenizer``, or of one made from the
    text (:func:`new_tokenizer`), for a model of ``vocab`` embedding rows (default: the
    tokenizer's ids).

    Raises
    ------
    UsageError
        For characters the tokenizer cannot encode, a text too short for a window, a
        tokenizer with more ids than ``vocab``.
    """
    what = options.text or "the embedded corpus"
    text = training_text(options)
    tokenizer = tokenizer or new_tokenizer(text, options)
    missing = tokenizer.missing(text)
    if missing:
        shown = "".join(missing[:20]) + ("..." if len(missing) > 20 else "")
        raise UsageError(f"{what} has {len(missing)} character(s) outside the tokenizer's "
                         f"vocabulary of {tokenizer.vocab_size}: {shown!r}")
    ids = tokenizer.encode(text)
    unit = "characters" if isinstance(tokenizer, CharTokenizer) else "tokens"
    if len(ids) < 20:
        raise UsageError(f"the text has {len(ids)} {unit}; a language model needs more to "
                         f"split into training and held-out parts")
    data = TextData(tokenizer, ids, vocab or tokenizer.vocab_size, context, options.batch,
                    options.seed)
    if len(data.train_ids) < context + 1:
        raise UsageError(f"the training part of {what} has {len(data.train_ids)} {unit}, "
                         f"fewer than one window of --context {context} + 1")
    if vocab is not None and vocab < tokenizer.vocab_size:
        raise UsageError(f"the tokenizer has {tokenizer.vocab_size} ids, more than the "
                         f"model's {vocab} embedding rows")
    return data


def new_tokenizer(text: str, options: RunOptions) -> CharTokenizer | BPETokenizer:
    """The tokenizer of a new LM run: the characters of its text, or a BPE learned on it.

    Raises
    ------
    UsageError
        For ``--tokenizer bpe`` without the ``tokenizers`` package (one line: what to install).
    """
    if options.tokenizer == "char":
        return CharTokenizer(text)
    try:
        return BPETokenizer.train(text, options.vocab_size)
    except ImportError as e:
        raise UsageError(f"--tokenizer bpe: {e}") from None


def training_text(options: RunOptions) -> str:
    """The text an LM run trains on: its ``--text`` file, or the embedded corpus."""
    if options.text:
        return load_text(options.text)
    from ..corpus import load_corpus

    return load_corpus()


# --------------------------------------------------------------------------------------------
# A synthetic task's sequences
# --------------------------------------------------------------------------------------------

class TaskData:
    """A synthetic task's digit sequences of ``length``: each update's batch drawn when it
    comes, from a generator whose state the checkpoints save; the held-out set fixed, drawn
    from a generator of its own.

    sort: each position's class is the digit at that place of the sorted sequence; copy: the
    digit :data:`~.options.COPY_SHIFT` places back; reverse: the sequence backwards, read by a
    decoder that starts from a BOS token (an eleventh id).
    """

    draws_up_front = False
    tokenizer = None  # digits are their own ids
    fingerprint = None

    def __init__(self, options: RunOptions, length: int) -> None:
        self.task, self.length, self.seed = options.task, length, options.seed
        self.batch_size = options.batch
        self.vocab = 11 if self.task == "reverse" else 10  # the digits, and reverse's BOS
        self.num_classes = 10 if self.task == "sort" else None
        self.rng = np.random.default_rng([self.seed, 1])  # one batch per update

    def plan(self, steps: int) -> None:
        """Nothing to draw ahead: each batch is drawn when it comes."""

    def draw(self, n: int, rng: np.random.Generator) -> Batch:
        """``n`` sequences of the task, drawn from ``rng``."""
        if self.task == "sort":
            x, y = sort_batch(n, rng, length=self.length)
            return Batch((x,), y)
        if self.task == "copy":
            x, y, mask = copy_back_batch(n, rng, length=self.length, shift=COPY_SHIFT)
            return Batch((x,), y, mask)
        src, tgt_in, tgt_out = reverse_batch(n, rng, length=self.length)
        return Batch((src, tgt_in), tgt_out)

    def batch(self, index: int) -> Batch:
        """The batch of the next update (drawn now: ``index`` is the generator's position)."""
        return self.draw(self.batch_size, self.rng)

    @cached_property
    def eval_set(self) -> Batch:
        """The fixed held-out set: the same sequences whenever it is first asked for."""
        return self.draw(TASK_EVAL_SET, np.random.default_rng([self.seed, 2]))

    def evaluate(self, model: Module) -> dict[str, float]:
        """The held-out loss and the accuracy over the positions that count."""
        b = self.eval_set
        logits = model.forward(*b.inputs)
        loss, _ = cross_entropy_forward(logits, b.targets, mask=b.mask)
        counted = b.targets != IGNORE_INDEX if b.mask is None else b.mask
        acc = float((logits.argmax(-1) == b.targets)[counted].mean())
        return {"val_loss": float(loss), "val_acc": acc}

    @staticmethod
    def eval_rows(config) -> int:
        """Sequences of the held-out evaluation: the whole set in one call."""
        return TASK_EVAL_SET

    def generators(self) -> dict[str, np.random.Generator]:
        """The data generator, whose state a checkpoint carries."""
        return {"data": self.rng}

"""What ``numpy-transformer eval`` measures: a trained language model's loss on a text.

The text is cut into fixed windows of the model's context (``data.fixed_window_windows``):
window k holds ``ids[k T : k T + T + 1]``, each starts from an empty history, and their
targets cover every token after the first exactly once. The loss is the mean over those
targets of ``-ln p(target)`` (nats per token: per character, for a character model), the
perplexity ``exp(loss)`` and the bits per token ``loss / ln 2``. For a BPE the bits per
character are given too: the bits of all targets over the characters after the first, the
number that compares a BPE with a character model.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..data import (
    CharTokenizer,
    fixed_window_loss,
    fixed_window_windows,
    load_text,
    train_val_split,
)
from ..memory import check_inference_fits, eval_batch
from .outputs import UsageError
from .sources import read_source
from .training_data import TRAIN_SHARE, training_text


class Evaluation(NamedTuple):
    """A language model's loss on a text (:func:`evaluate_run`)."""

    source: str  # what was evaluated: the file, or the run's held-out part
    tokens: int  # N, the text's length in tokens (N - 1 targets)
    windows: int  # fixed windows of the model's context T
    context: int  # T
    loss: float  # nats per token
    characters: int | None = None  # the text's length in characters, where a token is a
    #   BPE's (None: a token is a character)

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss)

    @property
    def bits_per_token(self) -> float:
        return self.loss / math.log(2)

    def lines(self) -> list[str]:
        """What the command prints: the window schedule, then the numbers; for a BPE, also
        the bits per character (the loss of every target, spread over the characters)."""
        last = (self.tokens - 1) % self.context or self.context
        unit = "character" if self.characters is None else "token"
        lines = [f"{self.source}: {self.tokens:,} {unit}s in {self.windows:,} fixed windows of "
                 f"{self.context} (each from an empty history; the last holds {last} targets)",
                 f"loss {self.loss:.4f} nats per {unit}, perplexity {self.perplexity:.3f}, "
                 f"{self.bits_per_token:.4f} bits per {unit}"]
        if self.characters is not None:
            per_character = self.bits_per_token * (self.tokens - 1) / (self.characters - 1)
            lines.append(f"{self.characters:,} characters: {per_character:.4f} bits per "
                         f"character")
        return lines


def evaluate_run(target: str | Path, text_file: str | Path | None = None) -> Evaluation:
    """The loss of the language model of ``target`` (a run folder or checkpoint, a
    transformers folder or an export's: :func:`~.sources.read_source`) on ``text_file``,
    tokenized by the model's own tokenizer; without one, on a run's own held-out part (the
    held-out loss its report gives). The model runs in evaluation mode: it keeps nothing.

    Raises
    ------
    UsageError
        If the source holds no language model, a folder from elsewhere comes without
        ``text_file``, the text is missing, unreadable as UTF-8, shorter than two tokens or
        holds characters outside the model's vocabulary (the first one is named; a run's own
        text: ``--text`` is the way out), or the model does not fit in memory.
    CheckpointError
        If the run cannot be read.
    """
    source = read_source(target, f"eval {target}")
    model, tokenizer = source.model.eval(), source.tokenizer
    if text_file is None:
        if not source.is_run:
            raise UsageError(f"eval {target}: a model from elsewhere has no held-out text of "
                             f"its own; give one with --text FILE")
        what = source.options.text or "the embedded corpus"
        described = f"the held-out {1 - TRAIN_SHARE:.0%} of {what}"
        try:
            ids = train_val_split(tokenizer.encode(training_text(source.options)),
                                  TRAIN_SHARE)[1]
        except ValueError as e:  # the run's text is gone, or holds new characters
            reason = str(e) if what in str(e) else f"{what}: {e}"
            raise UsageError(f"eval {target}: its training text cannot be read back "
                             f"({reason}); give the text to measure with --text FILE") from None
        text = tokenizer.decode(ids)
    else:
        described = str(text_file)
        try:
            text = load_text(text_file)
            ids = tokenizer.encode(text)
        except ValueError as e:  # load_text's name the file already
            raise UsageError(str(e) if described in str(e) else f"{described}: {e}") from None
    if len(ids) < 2:
        raise UsageError(f"{described}: {len(ids)} token(s); the loss needs at least 2")
    config = model.config
    batch = eval_batch(config)
    try:
        check_inference_fits(config, type(model).__name__, batch, adjustable=())
    except ValueError as e:
        raise UsageError(f"eval {target}: {e}") from None
    with np.errstate(over="ignore"):
        loss = fixed_window_loss(model.forward, ids, config.max_len, batch=batch)
    characters = None if isinstance(tokenizer, CharTokenizer) else len(text)
    return Evaluation(described, len(ids), len(fixed_window_windows(ids, config.max_len)),
                      config.max_len, float(loss), characters)

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

from ..data import fixed_window_loss, fixed_window_windows, load_text, train_val_split
from .outputs import UsageError
from .state import LM_EVAL_BATCH, training_text
from .stored import load_run


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
    """The loss of the language model in a run folder (or checkpoint) on ``text_file``, or,
    without one, on the run's own held-out part (the held-out loss its report gives).

    Raises
    ------
    UsageError
        If the run is not a language model's, the text is shorter than two characters or
        holds characters outside the model's vocabulary (the first one is named).
    CheckpointError
        If the run cannot be read.
    """
    run = load_run(target)
    if run.tokenizer is None:
        raise UsageError(f"{target}: a {run.options['task']} run; eval measures a language "
                         f"model (--task lm)")
    if text_file is None:
        source = f"the held-out 10% of {run.options['text'] or 'the embedded corpus'}"
        ids = train_val_split(run.tokenizer.encode(training_text(run.options)), 0.9)[1]
        text = run.tokenizer.decode(ids)
    else:
        source = str(text_file)
        try:
            text = load_text(text_file)
            ids = run.tokenizer.encode(text)
        except ValueError as e:  # load_text's name the file already
            raise UsageError(str(e) if source in str(e) else f"{source}: {e}") from None
    if len(ids) < 2:
        raise UsageError(f"{source}: {len(ids)} token(s); the loss needs at least 2")
    context = run.config.max_len
    with np.errstate(over="ignore"):
        loss = fixed_window_loss(run.model.forward, ids, context, batch=LM_EVAL_BATCH)
    characters = None if run.options["tokenizer"] == "char" else len(text)
    return Evaluation(source, len(ids), len(fixed_window_windows(ids, context)), context,
                      float(loss), characters)

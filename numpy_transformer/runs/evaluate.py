"""What ``numpy-transformer eval`` measures: a trained language model's loss on a text.

The text is cut into fixed windows of the model's context (``data.fixed_window_windows``):
window k holds ``ids[k T : k T + T + 1]``, each starts from an empty history, and their
targets cover every character after the first exactly once. The loss is the mean over those
targets of ``-ln p(target)`` (nats per character), the perplexity ``exp(loss)`` and the bits
per character ``loss / ln 2``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..data import fixed_window_loss, fixed_window_windows, load_text, train_val_split
from .outputs import UsageError
from .state import LM_EVAL_BATCH, load_run, training_text


class Evaluation(NamedTuple):
    """A language model's loss on a text (:func:`evaluate_run`)."""

    source: str  # what was evaluated: the file, or the run's held-out part
    characters: int  # N, the text's length in characters (N - 1 targets)
    windows: int  # fixed windows of the model's context T
    context: int  # T
    loss: float  # nats per character

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss)

    @property
    def bits_per_character(self) -> float:
        return self.loss / math.log(2)

    def lines(self) -> list[str]:
        """What the command prints: the window schedule, then the numbers."""
        last = (self.characters - 1) % self.context or self.context
        return [f"{self.source}: {self.characters:,} characters in {self.windows:,} fixed "
                f"windows of {self.context} (each from an empty history; the last holds "
                f"{last} targets)",
                f"loss {self.loss:.4f} nats per character, perplexity {self.perplexity:.3f}, "
                f"{self.bits_per_character:.4f} bits per character"]


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
    else:
        source = str(text_file)
        try:
            ids = run.tokenizer.encode(load_text(text_file))
        except ValueError as e:  # load_text's name the file already
            raise UsageError(str(e) if source in str(e) else f"{source}: {e}") from None
    if len(ids) < 2:
        raise UsageError(f"{source}: {len(ids)} character(s); the loss needs at least 2")
    context = run.config.max_len
    with np.errstate(over="ignore"):
        loss = fixed_window_loss(run.model.forward, ids, context, batch=LM_EVAL_BATCH)
    return Evaluation(source, len(ids), len(fixed_window_windows(ids, context)), context,
                      float(loss))

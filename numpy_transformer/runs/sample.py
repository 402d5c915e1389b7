"""Text from a trained language model: the sample a finished run writes, and what
``numpy-transformer sample`` prints."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..data import CharTokenizer
from ..generate import generate
from ..nn import DecoderLM
from .folder import checkpoint_path
from .options import SAMPLE_PROMPT, UsageError
from .state import model_from_checkpoint


def default_prompt(tokenizer: CharTokenizer) -> str:
    """``"def "`` when the vocabulary has it (the corpus is Python), else its first character."""
    return SAMPLE_PROMPT if all(ch in tokenizer.chars for ch in SAMPLE_PROMPT) \
        else tokenizer.chars[0]


def sample_checkpoint(target: str | Path, prompt: str | None, length: int, seed: int,
                      **sampling) -> str:
    """Continue ``prompt`` (default: :func:`default_prompt`) with the language model of a run
    folder or checkpoint file ``target``; ``sampling``: the keywords of
    :func:`~numpy_transformer.generate.generate`. Returns the prompt and what followed it.

    Raises
    ------
    UsageError
        If the checkpoint holds no character language model, or the prompt is empty or has a
        character outside the vocabulary.
    CheckpointError
        If the checkpoint cannot be read.
    """
    path = checkpoint_path(target)
    model, tokenizer, _ = model_from_checkpoint(path)
    if tokenizer is None or not isinstance(model, DecoderLM):
        raise UsageError(f"{path}: sample needs a character language model (a --task lm run)")
    prompt = default_prompt(tokenizer) if prompt is None else prompt
    if not prompt:
        raise UsageError("--prompt is empty; give at least one character")
    try:
        ids = tokenizer.encode(prompt)
    except ValueError as e:
        raise UsageError(f"--prompt: {e.args[0].split('; pass')[0]}") from None
    out = generate(model, ids, length, np.random.default_rng(seed), **sampling)
    return tokenizer.decode(out)

"""Text from a trained language model: the sample a finished run writes, and what
``numpy-transformer sample`` prints."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ..bpe import BPETokenizer
from ..data import CharTokenizer
from ..generate import generate
from ..nn import LSTMLM, DecoderLM
from .folder import checkpoint_path
from .options import LENGTH
from .outputs import SAMPLE_PROMPT, UsageError
from .stored import model_from_checkpoint


def default_prompt(tokenizer: CharTokenizer | BPETokenizer) -> str:
    """``"def "`` when the vocabulary has it (the corpus is Python), else its first token."""
    return tokenizer.decode([0]) if tokenizer.missing(SAMPLE_PROMPT) else SAMPLE_PROMPT


def sample_checkpoint(target: str | Path, prompt: str | None, length: int, seed: int,
                      **sampling) -> str:
    """Continue ``prompt`` (default: :func:`default_prompt`) with the language model of a run
    folder or checkpoint file ``target``; ``sampling``: the keywords of
    :func:`~numpy_transformer.generate.generate`. Returns the prompt and what followed it;
    what reading a run of an older format filled in is said on stderr.

    Raises
    ------
    UsageError
        If ``length`` is out of its range, the checkpoint holds no character language model,
        the prompt is empty, is not text (a byte that is not UTF-8) or has a character outside
        the vocabulary, or the model's logits are not finite.
    CheckpointError
        If the checkpoint cannot be read.
    """
    if not LENGTH.ok(length):
        raise UsageError(f"--length {length}: expected {LENGTH.expected}")
    path = checkpoint_path(target)
    notes: list[str] = []  # what reading a run of an older format filled in (said below)
    model, tokenizer, _ = model_from_checkpoint(target, note=notes.append)
    if tokenizer is None or not isinstance(model, (DecoderLM, LSTMLM)):
        raise UsageError(f"{path}: sample needs a language model (a --task lm run)")
    prompt = default_prompt(tokenizer) if prompt is None else prompt
    if not prompt:
        raise UsageError("--prompt is empty; give at least one character")
    check_prompt_text(prompt)
    try:
        ids = tokenizer.encode(prompt)
    except ValueError as e:
        raise UsageError(f"--prompt: {e.args[0].split('; pass')[0]}") from None
    try:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            out = generate(model, ids, length, np.random.default_rng(seed), **sampling)
    except ValueError as e:  # a bad sampling option, or logits that are not finite
        hint = "; the weights are too large to compute with" if "logits" in str(e) else ""
        raise UsageError(f"{path}: cannot sample: {e}{hint}") from None
    for line in notes:  # on stderr (stdout is the text), and only when there was no error
        print(line, file=sys.stderr, flush=True)
    return tokenizer.decode(out)


def check_prompt_text(prompt: str) -> None:
    """Refuse a prompt that is not text, naming the first character at fault.

    A command-line argument holding a byte that is not UTF-8 reaches Python as a lone
    surrogate U+DC80..U+DCFF (``os.fsdecode``'s "surrogateescape"); any other lone surrogate
    (U+D800..U+DFFF) is no character either.

    Raises
    ------
    UsageError
    """
    for pos, ch in enumerate(prompt):
        if "\udc80" <= ch <= "\udcff":
            raise UsageError(f"--prompt: byte {ord(ch) - 0xDC00:#04x} at position {pos} is not "
                             f"UTF-8; give the prompt as UTF-8 text")
        if "\ud800" <= ch <= "\udfff":
            raise UsageError(f"--prompt: U+{ord(ch):04X} at position {pos} is a lone "
                             f"surrogate, not a character")

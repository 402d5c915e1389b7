"""Text from a trained language model: the sample a finished run writes, and what
``numpy-transformer sample`` prints."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ..bpe import BPETokenizer
from ..data import CharTokenizer
from ..generate import generate
from ..memory import check_inference_fits
from .options import LENGTH
from .outputs import SAMPLE_PROMPT, UsageError
from .sources import read_source


def default_prompt(tokenizer: CharTokenizer | BPETokenizer) -> str:
    """``"def "`` when the vocabulary has it (the corpus is Python), else its first token."""
    return tokenizer.decode([0]) if tokenizer.missing(SAMPLE_PROMPT) else SAMPLE_PROMPT


def sample_checkpoint(target: str | Path, prompt: str | None, length: int, seed: int,
                      **sampling) -> str:
    """Continue ``prompt`` (default: :func:`default_prompt`) with the language model of a run
    folder, a checkpoint file, a transformers folder or an export's (``target``, read by
    :func:`~.sources.read_source`); ``sampling``: the keywords of
    :func:`~numpy_transformer.generate.generate`. Returns the prompt and what followed it;
    what reading a run of an older format filled in is said on stderr.

    Only the tokenizer's ids are drawn, where the model has more embedding rows than that.

    Raises
    ------
    UsageError
        If ``length`` is out of its range, the source holds no language model, the prompt is
        empty, is not text (a byte that is not UTF-8) or has a character outside the
        vocabulary, the model does not fit in memory, or its logits are not finite.
    CheckpointError
        If the checkpoint cannot be read.
    """
    if not LENGTH.ok(length):
        raise UsageError(f"--length {length}: expected {LENGTH.expected}")
    notes: list[str] = []  # what reading a run of an older format filled in (said below)
    source = read_source(target, f"sample {target}", note=notes.append)
    model, tokenizer = source.model, source.tokenizer
    prompt = default_prompt(tokenizer) if prompt is None else prompt
    if not prompt:
        raise UsageError("--prompt is empty; give at least one character")
    check_prompt_text(prompt)
    try:
        ids = tokenizer.encode(prompt)
    except ValueError as e:
        raise UsageError(f"--prompt: {e.args[0].split('; pass')[0]}") from None
    try:  # the weights and one forward of the window: no cache, no gradient
        check_inference_fits(model.config, type(model).__name__, 1, adjustable=())
    except ValueError as e:
        raise UsageError(f"sample {target}: {e}") from None
    try:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            out = generate(model, ids, length, np.random.default_rng(seed),
                           vocab=tokenizer.vocab_size, **sampling)
    except ValueError as e:  # a bad sampling option, or logits that are not finite
        hint = "; the weights are too large to compute with" if "logits" in str(e) else ""
        raise UsageError(f"{target}: cannot sample: {e}{hint}") from None
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

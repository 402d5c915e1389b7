"""Our tokenizers as ``tokenizers`` tokenizers that ``transformers`` loads, and back.

A byte-level BPE (``bpe.py``) is one already, and is written as it is. For characters:

``transformers`` has no tokenizer class that reads a character vocabulary from a file, so the
export writes a ``tokenizer.json`` of the ``tokenizers`` package: a word-level model whose
words are our characters with our ids, a pre-tokenizer that cuts the text into single
characters (the pattern ``(?m).``: in the Oniguruma syntax of ``tokenizers``, ``(?m)`` lets
the dot match a newline too), and a decoder that joins the pieces without spaces. Saved
through ``transformers``' own ``PreTrainedTokenizerFast``, it comes with the
``tokenizer_config.json`` that ``AutoTokenizer`` and ``pipeline`` read.

Our tokenizer's replacement character, if it has one, is the word-level model's unknown token;
without one, the unknown token is ``tokenizers``' default ``<unk>``, outside the vocabulary,
and text with an unknown character cannot be encoded, as here.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..bpe import BPETokenizer
from ..data import CharTokenizer
from ._require import require

EACH_CHARACTER = r"(?m)."


def save_tokenizer(directory: str | Path, tokenizer: CharTokenizer | BPETokenizer) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` for ``tokenizer`` in ``directory``.

    Parameters
    ----------
    directory : path of an existing directory
    tokenizer : CharTokenizer or BPETokenizer
        A BPE is written as it is: it is a ``tokenizers`` tokenizer already.
    """
    tokenizers = require("tokenizers", "the Hugging Face tokenizer export")
    transformers = require("transformers", "the Hugging Face tokenizer export")
    if isinstance(tokenizer, BPETokenizer):
        tok = tokenizer.backend
    else:
        vocab = {ch: i for i, ch in enumerate(tokenizer.chars)}
        tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab,
                                                               unk_token=tokenizer.replacement))
        tok.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex(EACH_CHARACTER),
                                                            behavior="isolated")
        tok.decoder = tokenizers.decoders.Fuse()
    transformers.PreTrainedTokenizerFast(  # no clean-up: " ," stays " ," as in the text
        tokenizer_object=tok, clean_up_tokenization_spaces=False).save_pretrained(str(directory))


def load_tokenizer(directory: str | Path) -> CharTokenizer | BPETokenizer | None:
    """Our tokenizer from a ``tokenizer.json`` written by :func:`save_tokenizer`.

    Returns
    -------
    tokenizer : CharTokenizer, BPETokenizer or None
        None if the directory has no ``tokenizer.json``.

    Raises
    ------
    ValueError
        If it is neither a byte-level BPE (``bpe.check_bpe_spec``) nor a vocabulary of one
        character per id in the order of a ``CharTokenizer`` (sorted by code point, ids
        0 .. V-1); or not UTF-8 JSON.
    """
    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        spec = path.read_text(encoding="utf-8")
        d = json.loads(spec)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise ValueError(f"{path}: not a tokenizer.json ({reason})") from None
    model = d.get("model") if isinstance(d, dict) else None
    model = model if isinstance(model, dict) else {}
    if model.get("type") != "WordLevel":
        try:
            return BPETokenizer(spec)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        raise ValueError(f"{path} is not a character vocabulary (a WordLevel model)")
    chars = sorted(vocab, key=vocab.get)
    if any(len(ch) != 1 for ch in chars) or [vocab[ch] for ch in chars] != list(range(len(chars))) \
            or chars != sorted(chars):
        raise ValueError(f"{path}: the vocabulary is not one character per id, in code-point "
                         f"order, as a CharTokenizer's")
    unknown = model.get("unk_token")  # "<unk>", outside the vocabulary, when there is none
    return CharTokenizer("".join(chars), replacement=unknown if unknown in vocab else None)

"""A byte-level BPE tokenizer (``train --tokenizer bpe``, or GPT-2's and LLaMA's as Hugging
Face ships them), and the one reader of a run's tokenizer of either kind.

The tokenizer is GPT-2's scheme, trained with the ``tokenizers`` package (the ``hf`` extra):
the text is cut into words and the spaces before them (``pre_tokenizers.ByteLevel``), each
word is UTF-8 bytes written as 256 printable stand-ins, and the trainer merges the most
frequent adjacent pair of symbols until the vocabulary has ``vocab_size`` entries (the 256
bytes first, so every text can be encoded: nothing is unknown). Decoding joins the bytes and
reads them as UTF-8; ids that stop inside a character give U+FFFD there.

:class:`BPETokenizer` also takes a model's own ``tokenizer.json`` as it is, ids unchanged: any
BPE of the ``tokenizers`` package that can encode every text, because its pre-tokenizer is
byte-level (GPT-2; LLaMA 3, a split then byte-level) or its model falls back to bytes (LLaMA 2).
A text is encoded as it is, without the special tokens a post-processor would add (LLaMA's
``<s>``): ``encode("a b")`` is the ids of "a b" and nothing else, as GPT-2's tokenizer gives
them. Decoding keeps special tokens (``<|endoftext|>``) in the text.

:class:`BPETokenizer` has the interface of :class:`~numpy_transformer.data.CharTokenizer` the
runs use (``vocab_size``, ``encode``, ``decode``, ``missing``, ``to_dict``), so a run, its
checkpoint, ``sample``, ``eval`` and the exports take either; :func:`tokenizer_from_dict`
reads back what ``to_dict`` wrote.

References
----------
Sennrich, Haddow & Birch, "Neural Machine Translation of Rare Words with Subword Units", 2016.
Radford et al., "Language Models are Unsupervised Multitask Learners" (GPT-2), 2019.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from types import ModuleType

import numpy as np

from .config import BPE_MIN_VOCAB
from .data import CharTokenizer, decodable_ids

__all__ = ["BPETokenizer", "tokenizer_from_dict"]


def _tokenizers() -> ModuleType:
    """The ``tokenizers`` package, or a one-line ``ImportError`` saying what to install."""
    from .export._require import require  # here: export's tokenizer module imports this one

    return require("tokenizers", "the BPE tokenizer")


def _types(part: object) -> list[str]:
    """The ``type`` of a part of a ``tokenizer.json`` (a pre-tokenizer, a decoder) and of
    every part of a ``Sequence`` of them."""
    if not isinstance(part, dict):
        return []
    inner = part.get("pretokenizers") or part.get("decoders") or []
    return [str(part.get("type"))] + [t for p in inner for t in _types(p)]


def check_bpe_spec(spec: str) -> dict:
    """The ``tokenizer.json`` text ``spec`` as a dict, if it is a BPE that can encode every
    text (see the module docstring).

    Raises
    ------
    ValueError
        In one line: not JSON (or nested too deeply to read), not a BPE, a BPE with dropout
        (its encoding is random), or one with neither a byte-level pre-tokenizer nor byte
        fallback (a text outside its alphabet would have no ids).
    """
    try:
        d = json.loads(spec)
    except (ValueError, RecursionError) as e:
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise ValueError(f"not a tokenizer.json ({reason})") from None
    model = d.get("model") if isinstance(d, dict) else None
    kind = model.get("type") if isinstance(model, dict) else None
    if kind != "BPE":
        raise ValueError(f"a {kind or 'model-less'} tokenizer, not byte-level BPE or characters")
    if model.get("dropout"):
        raise ValueError(f"a BPE with dropout {model['dropout']!r}: its encoding is random")
    if "ByteLevel" not in _types(d.get("pre_tokenizer")) and not model.get("byte_fallback"):
        raise ValueError("a BPE that is not byte-level (no ByteLevel pre-tokenizer, no byte "
                         "fallback): a text outside its alphabet would have no ids")
    return d


class BPETokenizer:
    """Byte-level BPE: a ``tokenizers.Tokenizer`` with the interface of ``CharTokenizer``.

    Parameters
    ----------
    spec : str
        The tokenizer as ``tokenizers`` serialises it (the text of a ``tokenizer.json``):
        what :meth:`train` made, what :meth:`to_dict` stored, or a model's own (GPT-2's,
        LLaMA's).

    Raises
    ------
    ValueError
        If ``spec`` is not a BPE that encodes every text (:func:`check_bpe_spec`).
    ImportError
        Without the ``tokenizers`` package (one line: what to install).
    """

    def __init__(self, spec: str) -> None:
        tokenizers = _tokenizers()
        vocab = check_bpe_spec(spec)["model"].get("vocab")
        try:
            self.backend = tokenizers.Tokenizer.from_str(spec)
        except Exception as e:  # the package's own error for a malformed spec
            reason = " ".join(str(e).split())  # one line
            raise ValueError(f"not a tokenizers tokenizer ({type(e).__name__}: {reason})") \
                from None
        ids = self.backend.get_vocab(with_added_tokens=True).values()
        self._size = 1 + max(ids, default=-1)  # every id below it is a row of the model's
        if not isinstance(vocab, dict) or not ids:
            raise ValueError("a BPE tokenizer without a vocabulary")

    @classmethod
    def train(cls, text: str, vocab_size: int) -> BPETokenizer:
        """The byte-level BPE of ``vocab_size`` entries (fewer if the text runs out of pairs
        to merge) learned on ``text``.

        Raises
        ------
        ValueError
            If ``vocab_size`` < ``config.BPE_MIN_VOCAB`` or ``text`` is empty.
        """
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) \
                or vocab_size < BPE_MIN_VOCAB:
            raise ValueError(f"vocab_size must be an integer >= {BPE_MIN_VOCAB} (the 256 bytes and "
                             f"a merge), got {vocab_size!r}")
        if not isinstance(text, str) or not text:
            raise ValueError("a BPE tokenizer needs a non-empty text to learn its merges on")
        tk = _tokenizers()
        byte_level = tk.pre_tokenizers.ByteLevel
        tok = tk.Tokenizer(tk.models.BPE())
        tok.pre_tokenizer = byte_level(add_prefix_space=False)
        tok.decoder = tk.decoders.ByteLevel()
        # Each merge joins two symbols of the text: it has fewer merges than bytes. The
        # trainer reserves memory for the size it is asked for (72 TB for 10^12): ask no more.
        reachable = BPE_MIN_VOCAB - 1 + len(text.encode("utf-8"))
        trainer = tk.trainers.BpeTrainer(vocab_size=min(vocab_size, reachable),
                                         show_progress=False,
                                         initial_alphabet=byte_level.alphabet(),
                                         special_tokens=[])
        tok.train_from_iterator([text], trainer)
        return cls(tok.to_str())

    @property
    def vocab_size(self) -> int:
        """V, one more than the largest id: the 256 bytes, the merges and any special tokens
        (GPT-2's ``<|endoftext|>``, 50,256)."""
        return self._size

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size})"

    def encode(self, text: str) -> np.ndarray:
        """The ids of ``text``, and no special token added: ndarray of int64, shape (N,).
        Every text can be encoded."""
        if not isinstance(text, str):
            raise ValueError(f"encode takes a str, got {type(text).__name__}")
        return np.asarray(self.backend.encode(text, add_special_tokens=False).ids,
                          dtype=np.int64)

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """The text of a 1-D sequence of ids (U+FFFD where they cut a character's bytes).

        Raises
        ------
        ValueError
            If an id is not an integer in ``[0, vocab_size)`` or ``ids`` is not 1-D.
        """
        return self.backend.decode(decodable_ids(ids, self.vocab_size).tolist(),
                                   skip_special_tokens=False)

    def missing(self, text: str) -> list[str]:
        """The characters of ``text`` it cannot encode: none, as every byte is a token."""
        return []

    def to_dict(self) -> dict:
        """A JSON-able description: ``{"bpe": the tokenizer.json text, "vocab_size": V}``."""
        return {"bpe": self.backend.to_str(), "vocab_size": self.vocab_size}


def tokenizer_from_dict(d: Mapping) -> CharTokenizer | BPETokenizer:
    """The tokenizer a ``to_dict`` of either kind describes.

    Raises
    ------
    ValueError
        If ``d`` describes neither, or its ``vocab_size`` is not its tokenizer's.
    ImportError
        For a BPE tokenizer without the ``tokenizers`` package.
    """
    if not isinstance(d, Mapping) or set(d) != {"bpe", "vocab_size"}:
        return CharTokenizer.from_dict(d)
    if not isinstance(d["bpe"], str):
        raise ValueError(f"a BPE tokenizer dict holds its tokenizer.json text, got "
                         f"{type(d['bpe']).__name__}")
    tokenizer = BPETokenizer(d["bpe"])
    if tokenizer.vocab_size != d["vocab_size"]:
        raise ValueError(f"the BPE tokenizer has {tokenizer.vocab_size} entries, its dict says "
                         f"{d['vocab_size']!r}")
    return tokenizer

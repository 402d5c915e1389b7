"""Character-level data: tokenizer, split, window schedule, batches and fixed-window evaluation.

The pieces of the chapters' "paired protocol": a contiguous 90/10 split, a schedule of window
starts drawn UP FRONT from an explicit generator (so building a model, which also consumes
random numbers, cannot shift the windows), a SHA-256 fingerprint of the schedule and of the
initial parameters, and a deterministic held-out loss over fixed, non-overlapping windows.

Synthetic tasks (sorting, copying, reversing) live in :mod:`numpy_transformer.tasks`; the
embedded corpus in :mod:`numpy_transformer.corpus`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np

from ._checks import check_ids
from .files import check_file, read_file
from .functional.softmax import cross_entropy_forward
from .memory import SCHEDULE_ITEM, check_fits, format_bytes

__all__ = ["CharTokenizer", "load_text", "train_val_split", "window_schedule", "get_batch",
           "fingerprint", "fixed_window_windows", "fixed_window_loss"]

UNKNOWN_POLICIES = ("error", "skip", "replace")
TEXT_BYTES = 14  # per byte of a text file: the bytes, the str (>= 1), code points (4), ids (8)


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _code_points(name: str, text: str) -> np.ndarray:
    """The Unicode code points of ``text`` as a uint32 array, without a Python loop.

    Raises ``ValueError`` naming ``name`` for a lone surrogate (U+D800 to U+DFFF): half of a
    UTF-16 pair, which Python strings can hold (from ``surrogateescape`` decoding, say) but
    which is no character.
    """
    try:
        return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    except UnicodeEncodeError as error:
        pos = error.start
        raise ValueError(f"{name} holds a lone surrogate U+{ord(text[pos]):04X} at position "
                         f"{pos}: half of a UTF-16 pair, not a character") from None


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------

def decodable_ids(ids: Iterable[int] | np.ndarray, vocab_size: int) -> np.ndarray:
    """``ids`` checked for a tokenizer's ``decode``: a 1-D integer array of ids in
    ``[0, vocab_size)`` (an empty one for no ids).

    Raises
    ------
    ValueError
        If an id is not an integer in ``[0, vocab_size)`` or ``ids`` is not 1-D.
    """
    ids = np.asarray(ids)
    if ids.size == 0:
        return np.zeros(0, np.int64)
    ids = check_ids("ids", ids, vocab_size)
    if ids.ndim != 1:
        raise ValueError(f"decode takes a 1-D sequence of ids, got shape {ids.shape}")
    return ids


class CharTokenizer:
    """One token per character; ids are positions in the sorted list of distinct characters.

    Parameters
    ----------
    text : str
        The text whose distinct characters form the vocabulary (non-empty).
    replacement : str, optional
        A single character of the vocabulary that ``encode(..., unknown="replace")``
        substitutes for characters outside it. Without one, "replace" is not available.

    Raises
    ------
    ValueError
        If ``text`` is empty, or ``replacement`` is not one character of the vocabulary.

    Examples
    --------
    >>> tok = CharTokenizer("hello world", replacement=" ")
    >>> tok.vocab_size, tok.encode("hold")
    (8, array([3, 5, 4, 1]))
    >>> tok.decode(tok.encode("hi!", unknown="replace"))
    'h  '
    """

    def __init__(self, text: str, replacement: str | None = None) -> None:
        if not isinstance(text, str) or not text:
            raise ValueError(f"a tokenizer needs a non-empty text to take characters from, "
                             f"got {text!r}")
        self.chars: list[str] = sorted(set(text))  # id -> character
        for char in self.chars:  # each distinct character once, to say where a bad one is
            if "\ud800" <= char <= "\udfff":
                _code_points("text", text[:text.index(char) + 1])  # raises
        # Sorted by code point, so searchsorted maps a code point to its id.
        self._codes = _code_points("text", "".join(self.chars))  # (V,) uint32, increasing
        if replacement is not None and (not isinstance(replacement, str)
                                        or len(replacement) != 1
                                        or replacement not in self.chars):
            raise ValueError(f"replacement must be one character of the vocabulary, got "
                             f"{replacement!r}")
        self.replacement = replacement

    @property
    def vocab_size(self) -> int:
        """Number of distinct characters, V."""
        return len(self.chars)

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size}, replacement={self.replacement!r})"

    def encode(self, text: str, unknown: str = "error") -> np.ndarray:
        """Map each character to its id.

        Parameters
        ----------
        text : str
        unknown : {"error", "skip", "replace"}, default "error"
            What to do with a character outside the vocabulary: raise, drop it, or map it to
            the ``replacement`` character given when the tokenizer was built.

        Returns
        -------
        ids : ndarray of int64, shape (len(text),), shorter with "skip"

        Raises
        ------
        ValueError
            For an unknown policy; with "error", naming the first unseen character and its
            position; with "replace" when the tokenizer has no replacement character.
        """
        if unknown not in UNKNOWN_POLICIES:
            raise ValueError(f"unknown must be one of {UNKNOWN_POLICIES}, got {unknown!r}")
        if unknown == "replace" and self.replacement is None:
            raise ValueError("unknown='replace' needs a replacement character, given when the "
                             "tokenizer is built: CharTokenizer(text, replacement=...)")
        if not isinstance(text, str):
            raise ValueError(f"encode takes a str, got {type(text).__name__}")
        codes = _code_points("text", text)  # (N,)
        ids = np.searchsorted(self._codes, codes).astype(np.int64)  # (N,) candidate ids
        known = self._codes[np.minimum(ids, self.vocab_size - 1)] == codes
        if known.all():
            return ids
        if unknown == "error":
            pos = int(np.argmin(known))  # first False
            raise ValueError(f"character {text[pos]!r} (U+{ord(text[pos]):04X}) at position "
                             f"{pos} is not in the vocabulary of {self.vocab_size} characters; "
                             f"pass unknown='skip' or unknown='replace'")
        if unknown == "skip":
            return ids[known]
        return np.where(known, ids, self.chars.index(self.replacement))

    def missing(self, text: str) -> list[str]:
        """The distinct characters of ``text`` outside the vocabulary, sorted."""
        return sorted(set(text) - set(self.chars))

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """The text of a 1-D sequence of ids.

        Raises
        ------
        ValueError
            If an id is not an integer in ``[0, vocab_size)`` or ``ids`` is not 1-D.
        """
        ids = decodable_ids(ids, self.vocab_size)
        return self._codes[ids].astype("<u4").tobytes().decode("utf-32-le")

    def to_dict(self) -> dict:
        """A JSON-able description: ``{"chars": str, "replacement": str | None}``."""
        return {"chars": "".join(self.chars), "replacement": self.replacement}

    @classmethod
    def from_dict(cls, d: Mapping) -> CharTokenizer:
        """Rebuild a tokenizer from :meth:`to_dict`; the same ids for the same characters.

        Raises
        ------
        ValueError
            If the keys are wrong or ``chars`` is not a string of distinct characters.
        """
        if not isinstance(d, Mapping) or set(d) != {"chars", "replacement"}:
            raise ValueError(f"a tokenizer dict has keys 'chars' and 'replacement', got {d!r}")
        chars = d["chars"]
        if not isinstance(chars, str) or len(set(chars)) != len(chars):
            raise ValueError(f"tokenizer 'chars' must be a string of distinct characters, got "
                             f"{chars!r}")
        return cls(chars, replacement=d["replacement"])


# --------------------------------------------------------------------------------------------
# Reading text, splitting, scheduling, batching
# --------------------------------------------------------------------------------------------

def load_text(path: str | Path) -> str:
    """Read a UTF-8 text file (a leading byte-order mark is dropped).

    Raises
    ------
    ValueError
        If the file does not exist, is not a regular file (a folder, a FIFO, a device: said
        which), is too large for the memory available, is empty, looks binary (contains NUL
        bytes) or is not valid UTF-8; the message names the file.
    OSError
        If it cannot be read (e.g. permission denied).
    """
    path = Path(path)
    size = check_file(path).st_size
    check_fits(lambda s: {"the text and its token ids": s["bytes"] * TEXT_BYTES},
               {"bytes": size}, label=lambda _, n: f"{path} ({format_bytes(n)})")
    text = read_file(path, text=True)
    if not text:
        raise ValueError(f"{path}: the file is empty")
    return text


def train_val_split(ids: np.ndarray, frac: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
    """Contiguous split: the first ``frac`` of the tokens for training, the rest held out.

    A contiguous split (rather than shuffled windows) keeps held-out text the model has never
    seen any part of. ``n_train = int(frac * len(ids))``, as the chapters.

    Returns
    -------
    train, val : ndarray views of ``ids``

    Raises
    ------
    ValueError
        If ``frac`` is not in (0, 1), ``ids`` is not 1-D, or either part would be empty.
    """
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise ValueError(f"ids must be 1-D, got shape {ids.shape}")
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac < 1:
        raise ValueError(f"frac must be a number in (0, 1), got {frac!r}")
    n = int(frac * len(ids))
    if n == 0 or n == len(ids):
        raise ValueError(f"splitting {len(ids)} tokens at frac={frac} leaves an empty part")
    return ids[:n], ids[n:]


def window_schedule(n_tokens: int, context: int, batch: int, steps: int,
                    rng: np.random.Generator) -> np.ndarray:
    """Draw every window start of a training run up front.

    Parameters
    ----------
    n_tokens : int
        Length of the training split.
    context : int
        Window length T; each window reads ``context + 1`` tokens (inputs and shifted targets).
    batch, steps : int
        Batch size B and number of updates.
    rng : numpy.random.Generator
        The explicit source of randomness; nothing else draws from it.

    Returns
    -------
    starts : ndarray of int64, shape (steps, batch)
        Uniform in ``0 .. n_tokens - context - 1`` inclusive: every full window is possible.
        (The chapter's PyTorch code draws below ``n_tokens - context - 1`` and so never picks
        the very last window; its exact draws come from torch's generator anyway.)

    Raises
    ------
    ValueError
        If a size is not a positive integer, the text is shorter than one window, or the
        schedule would not fit in the memory available.
    """
    n_tokens = _check_positive_int("n_tokens", n_tokens)
    context = _check_positive_int("context", context)
    batch = _check_positive_int("batch", batch)
    steps = _check_positive_int("steps", steps)
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    if n_tokens < context + 1:
        raise ValueError(f"n_tokens = {n_tokens} is shorter than one window of context + 1 = "
                         f"{context + 1} tokens")
    check_fits(lambda s: {"window schedule": s["steps"] * s["batch"] * SCHEDULE_ITEM},
               {"steps": steps, "batch": batch})
    return rng.integers(0, n_tokens - context, size=(steps, batch), dtype=np.int64)


def get_batch(ids: np.ndarray, starts: np.ndarray, context: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut the windows ``ids[s : s + context + 1]`` into inputs and next-token targets.

    Returns
    -------
    x, y : ndarray of shape (B, T) with T = context
        ``x[b, t] = ids[starts[b] + t]`` and ``y[b, t] = ids[starts[b] + t + 1]``.

    Raises
    ------
    ValueError
        If ``starts`` is not 1-D integer or a window would run past the end of ``ids``.
    """
    context = _check_positive_int("context", context)
    ids, starts = np.asarray(ids), np.asarray(starts)
    if ids.ndim != 1:
        raise ValueError(f"ids must be 1-D, got shape {ids.shape}")
    if starts.ndim != 1 or not np.issubdtype(starts.dtype, np.integer):
        raise ValueError(f"starts must be a 1-D integer array, got {starts.dtype} "
                         f"{starts.shape}")
    if starts.size and (starts.min() < 0 or starts.max() > len(ids) - context - 1):
        bad = starts[(starts < 0) | (starts > len(ids) - context - 1)][0]
        raise ValueError(f"start {bad} leaves no room for a window of {context + 1} tokens in "
                         f"{len(ids)} tokens")
    idx = starts[:, None] + np.arange(context + 1)  # (B, T + 1)
    windows = ids[idx]
    return windows[:, :-1], windows[:, 1:]


def fingerprint(*items: np.ndarray | Mapping[str, np.ndarray]) -> str:
    """SHA-256 hex digest of arrays (dtype, shape and bytes) or dicts of them (names sorted).

    Two runs that print the same fingerprint for their initial parameters and their window
    schedule trained from the same tensors on the same windows. Nested dicts are allowed.

    Raises
    ------
    ValueError
        If given nothing, or a dict key that is not a string.
    """
    if not items:
        raise ValueError("fingerprint needs at least one array or dict")
    h = hashlib.sha256()

    def feed(item: object) -> None:
        if isinstance(item, Mapping):
            for key in item:
                if not isinstance(key, str):
                    raise ValueError(f"fingerprint dict keys must be strings, got {key!r}")
            h.update(b"{%d" % len(item))
            for key in sorted(item):
                name = key.encode("utf-8")
                h.update(b"%d:" % len(name) + name)
                feed(item[key])
            h.update(b"}")
        else:
            a = np.ascontiguousarray(item)
            header = f"{a.dtype.str}{a.shape}".encode()  # e.g. b"<f4(3, 4)"
            h.update(b"%d:" % len(header) + header)
            h.update(a.tobytes())

    for item in items:
        feed(item)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# Fixed-window held-out evaluation
# --------------------------------------------------------------------------------------------

def fixed_window_windows(ids: np.ndarray, context: int) -> list[np.ndarray]:
    """The evaluation windows: ``ids[s : s + context + 1]`` for ``s = 0, context, 2 context, ...``

    Consecutive windows share one token (the last of one is the first input of the next), so
    their TARGETS ``window[1:]`` tile ``ids[1:]`` exactly once. Each window starts with an
    empty history (the model's state is "reset" at each window). A final partial window is
    kept when it has at least 2 tokens, i.e. at least one target.

    Returns
    -------
    windows : list of ndarray
        All of length ``context + 1`` except possibly the last (length >= 2).

    Raises
    ------
    ValueError
        If ``context`` is not a positive integer or ``ids`` has fewer than 2 tokens.
    """
    context = _check_positive_int("context", context)
    ids = np.asarray(ids)
    if ids.ndim != 1 or len(ids) < 2:
        raise ValueError(f"fixed-window evaluation needs a 1-D sequence of at least 2 tokens, "
                         f"got shape {ids.shape}")
    return [ids[s:s + context + 1] for s in range(0, len(ids) - 1, context)]


def fixed_window_loss(logits_fn: Callable[[np.ndarray], np.ndarray], ids: np.ndarray,
                      context: int, batch: int = 64) -> float:
    """Mean next-token cross-entropy over every target of ``ids``, in fixed windows.

    Parameters
    ----------
    logits_fn : callable
        ``logits_fn(x)`` with ``x`` an int array of shape (B, T) returns logits (B, T, V).
        It is called with T = ``context`` for the full windows and once with a shorter T for
        the final partial window, if any.
    ids : ndarray of int, shape (N,)
        The split to evaluate, N >= 2.
    context : int
        Window length T.
    batch : int, default 64
        Full windows per call.

    Returns
    -------
    loss : float
        ``sum over all N - 1 targets of -log p(target) / (N - 1)``: each window weighted by
        its number of targets, so a short final window counts for what it holds.

    Raises
    ------
    ValueError
        If a size is invalid or ``logits_fn`` returns the wrong shape.
    """
    batch = _check_positive_int("batch", batch)
    windows = fixed_window_windows(ids, context)
    full = [w for w in windows if len(w) == context + 1]
    groups = [np.stack(full[i:i + batch]) for i in range(0, len(full), batch)]
    if len(windows[-1]) < context + 1:
        groups.append(windows[-1][None, :])  # (1, T' + 1), the partial window on its own
    total, count = 0.0, 0
    for w in groups:  # (B, T + 1)
        x, y = w[:, :-1], w[:, 1:]
        logits = logits_fn(x)
        if not isinstance(logits, np.ndarray) or logits.ndim != 3 or logits.shape[:2] != x.shape:
            raise ValueError(f"logits_fn must return logits of shape (B, T, V) = "
                             f"{x.shape + ('V',)}, got {np.shape(logits)}")
        mean, _ = cross_entropy_forward(logits, y)
        total += mean * y.size  # back to a sum, so every target weighs the same
        count += y.size
    return total / count

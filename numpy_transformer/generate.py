"""Text generation: the decoding loops, and a key/value cache so a step costs one row.

A decoder-only model turns a sequence into next-token logits. Generating ``steps`` tokens
repeats three moves: take the logits of the last position, draw a token from them
(:func:`~numpy_transformer.sampling.sample_next`, in ``sampling.py`` with the temperature,
top-k and nucleus options), append it. Done naively every step runs the whole model over the whole
window again; the course chapter's sampler does exactly that on its last 100 characters. With
a **key/value cache** (``nn/decoding.py``: ``model.forward(tokens, cache=cache)``) every
attention layer keeps the keys and values of the positions it has already seen, so a new token
costs one query row per layer and the logits are the same (to rounding: 1e-10 in float64, 1e-5
in float32; the tests check it).

The context-window policy
-------------------------
A model accepts at most ``max_len`` positions (its position tables have that many rows). When
the sequence grows past that, something must be dropped. Which tokens the next logits are
conditioned on is the **policy**; whether they are computed with the cache is ``use_cache``.
The two are independent: ``use_cache=False`` runs a full forward over the same window as
``use_cache=True`` would use, which makes it the reference the cache is tested against.

Let L be the length of the window the model reads (the last L tokens of the sequence). The
prompt starts it at ``L = min(len(prompt), max_len)``; after every appended token

* if ``L < max_len``: the window grows, ``L = L + 1`` (the cache appends one row);
* if ``L == max_len``: the window is cut back to ``L = keep`` tokens (the cache is
  emptied and prefilled with the last ``keep`` tokens, positions 0 .. keep - 1).

``policy="recompute"`` is ``keep = max_len``: the window is always the last ``max_len``
tokens, exactly the chapter's sampler (``ids[:, -max_len:]`` every step). Once the sequence is
longer than ``max_len`` the cache cannot help: every step is a full prefill of ``max_len``
tokens. ``policy="refill"`` (the default) uses ``keep = max_len // 2`` (or the ``keep`` given):
one prefill of ``keep`` tokens buys ``max_len - keep`` cheap cached steps, so the refill is
amortised, and the model always reads between ``keep`` and ``max_len`` tokens.

Why not simply slide the cache (drop its oldest row, append the new one)? Because that is not
the model applied to any window. The cached keys and values of layer 2 and above were computed
by positions that attended the dropped tokens, and with absolute positions (sinusoidal,
learned) every cached row also carries the absolute position it had, while a recomputed
cropped window restarts at position 0. A sliding cache would thus feed the model inputs it
never saw in training. Both policies here are, at every step, exactly ``model.forward`` of a
window of the sequence; they agree with each other until the sequence first exceeds
``max_len``, and after that ``refill`` reads a shorter window than ``recompute``.

A recurrent model
-----------------
An :class:`~numpy_transformer.nn.LSTMLM` has no window and no position table: its state
(h, c) summarises the whole sequence so far. :class:`RecurrentDecoder` reads the prompt once
and then runs one step of the recurrence per new token, ``model.forward(token, state=state)``,
whatever the length: there is nothing to crop, refill or recompute, so ``policy`` and ``keep``
do not apply to it. ``use_cache=False`` re-reads the whole sequence from a zero state at every
step instead, the reference the carried state is tested against.

References
----------
Pope et al., "Efficiently Scaling Transformer Inference", 2022 (the key/value cache).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from ._checks import check_ids
from .nn.decoding import new_cache
from .nn.lstm import LSTMLM, new_state
from .nn.models import DecoderLM, EncoderDecoder
from .sampling import check_sampling, next_token_probs, sample_next

# sample_next and next_token_probs are sampling.py's; they stay importable from here
__all__ = ["POLICIES", "RecurrentDecoder", "WindowedDecoder", "generate", "generate_seq2seq",
           "next_token_probs", "sample_next"]

POLICIES = ("refill", "recompute")


# ---------------------------------------------------------------------- the window


class WindowedDecoder:
    """Next-token logits of a growing sequence, under a context-window policy.

    Holds the sequence and, with ``use_cache``, one key/value cache per block. See the module
    docstring for the policy: the logits returned are always ``model.forward`` of the last
    ``window`` tokens (computed with the cache or not).

    Parameters
    ----------
    model : DecoderLM
        Used as it is (the caller sets eval mode).
    use_cache : bool, default True
    policy : {"refill", "recompute"}, default "refill"
    keep : int, optional
        Tokens kept when the window is full; only with ``policy="refill"``. Default
        ``max(1, max_len // 2)``; 1 <= keep <= max_len.

    Attributes
    ----------
    ids : ndarray of int64, shape (B, min(T, max_len))
        The last tokens of the sequence so far: all that any window can read.
    window : int
        L, the number of last tokens the latest logits were conditioned on.
    prefills : int
        How many times the window was (re)encoded from scratch: 1 for the prompt, plus one
        per refill (with the cache) or per step (without).
    """

    def __init__(self, model: DecoderLM, use_cache: bool = True, policy: str = "refill",
                 keep: int | None = None) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        max_len = model.config.max_len
        if policy == "recompute":
            if keep is not None:
                raise ValueError(f"keep={keep!r} applies to policy='refill' only "
                                 f"(policy='recompute' always keeps max_len={max_len})")
            keep = max_len
        elif keep is None:
            keep = max(1, max_len // 2)
        elif (isinstance(keep, bool) or not isinstance(keep, (int, np.integer))
              or not 1 <= keep <= max_len):
            raise ValueError(f"keep must be an integer in [1, max_len={max_len}], got {keep!r}")
        self.model, self.use_cache, self.policy = model, use_cache, policy
        self.max_len, self.keep = max_len, int(keep)
        self.ids = None
        self.window = 0
        self.prefills = 0
        self.cache = None

    def _encode_window(self) -> np.ndarray:
        """Logits (B, V) of ``model.forward(ids[:, -window:])`` at its last position."""
        self.prefills += 1
        tokens = self.ids[:, -self.window:]  # (B, L)
        if not self.use_cache:
            return self.model.forward(tokens)[:, -1]
        self.cache.reset()
        return self.model.forward(tokens, cache=self.cache)[:, -1]

    def start(self, prompt_ids: np.ndarray) -> np.ndarray:
        """Begin with ``prompt_ids`` (B, T); returns the logits (B, V) of the next token."""
        self.ids = np.asarray(prompt_ids, dtype=np.int64)[:, -self.max_len:]  # (B, L)
        self.window = self.ids.shape[1]
        self.prefills = 0
        if self.use_cache:
            self.cache = new_cache(self.model, self.ids.shape[0])
        return self._encode_window()

    def append(self, next_ids: np.ndarray) -> np.ndarray:
        """Append one token per sequence, ``next_ids`` (B,); returns the next logits (B, V)."""
        next_ids = np.asarray(next_ids, dtype=np.int64).reshape(-1, 1)  # (B, 1)
        self.ids = np.concatenate([self.ids, next_ids], axis=1)[:, -self.max_len:]
        if self.window == self.max_len:  # full: cut back to the last `keep` tokens
            self.window = self.keep
            return self._encode_window()
        self.window += 1
        if not self.use_cache:
            return self._encode_window()
        return self.model.forward(next_ids, cache=self.cache)[:, -1]  # one new row


class RecurrentDecoder:
    """Next-token logits of a growing sequence from an :class:`LSTMLM`, its state carried.

    The same ``start`` / ``append`` interface as :class:`WindowedDecoder`, without a window:
    with ``use_cache`` the prompt is read once and each appended token costs one step;
    without, the whole sequence so far is read again from a zero state (the same logits).

    Attributes
    ----------
    ids : ndarray of int64, shape (B, T)
        The whole sequence so far.
    state : LSTMState or None
        The state after the last token read (with ``use_cache``).
    """

    def __init__(self, model: LSTMLM, use_cache: bool = True) -> None:
        self.model, self.use_cache = model, use_cache
        self.ids = self.state = None

    def start(self, prompt_ids: np.ndarray) -> np.ndarray:
        """Begin with ``prompt_ids`` (B, T); returns the logits (B, V) of the next token."""
        self.ids = np.asarray(prompt_ids, dtype=np.int64)
        self.state = new_state(self.model, self.ids.shape[0]) if self.use_cache else None
        return self.model.forward(self.ids, state=self.state)[:, -1]

    def append(self, next_ids: np.ndarray) -> np.ndarray:
        """Append one token per sequence, ``next_ids`` (B,); returns the next logits (B, V)."""
        next_ids = np.asarray(next_ids, dtype=np.int64).reshape(-1, 1)  # (B, 1)
        self.ids = np.concatenate([self.ids, next_ids], axis=1)
        if not self.use_cache:
            return self.model.forward(self.ids)[:, -1]
        return self.model.forward(next_ids, state=self.state)[:, -1]  # one step


# ---------------------------------------------------------------------- generation


def _check_prompt(name: str, ids, vocab: int) -> tuple[np.ndarray, bool]:
    """``ids`` as (B, T) int64, and whether it came as one sequence (T,)."""
    ids = check_ids(name, ids, vocab)
    if ids.ndim not in (1, 2) or ids.shape[-1] == 0:
        raise ValueError(f"{name} must have shape (T,) or (B, T) with T >= 1, got {ids.shape}")
    single = ids.ndim == 1
    return (ids[None] if single else ids).astype(np.int64), single


def _check_run(steps, rng, temperature, top_k, top_p, greedy, vocab=None,
               rows: int = 0) -> None:
    """Refuse, naming the value, a ``steps``, a sampling option or a ``vocab`` limit (None,
    or an integer in [1, rows]) a decoding loop cannot use."""
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
        raise ValueError(f"steps must be an integer >= 0, got {steps!r}")
    check_sampling(rng, temperature, top_k, top_p, greedy)
    if vocab is not None and (isinstance(vocab, bool) or not isinstance(vocab, (int, np.integer))
                              or not 1 <= vocab <= rows):
        raise ValueError(f"vocab must be an integer in [1, {rows}] (the model's rows), got "
                         f"{vocab!r}")


@contextmanager
def _evaluating(model) -> Iterator[None]:
    """Run the block with ``model`` in eval mode (dropout off), then restore its mode."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _decoder_for(model, use_cache: bool, policy: str | None,
                 keep: int | None) -> WindowedDecoder | RecurrentDecoder:
    """The decoder that gives ``model``'s next-token logits (refusing what it cannot use)."""
    if isinstance(model, LSTMLM):
        if policy is not None or keep is not None:
            raise ValueError(f"policy={policy!r} and keep={keep!r} choose a Transformer's "
                             f"window; an LSTMLM reads none (its state carries the sequence)")
        return RecurrentDecoder(model, use_cache=use_cache)
    if isinstance(model, DecoderLM):
        return WindowedDecoder(model, use_cache=use_cache, policy=policy or "refill", keep=keep)
    raise ValueError(f"generate needs a DecoderLM or an LSTMLM, got {type(model).__name__}")


def generate(model: DecoderLM | LSTMLM, prompt_ids, steps: int,
             rng: np.random.Generator | None = None, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, greedy: bool = False,
             use_cache: bool = True, policy: str | None = None,
             keep: int | None = None, vocab: int | None = None) -> np.ndarray:
    """Continue ``prompt_ids`` by ``steps`` tokens sampled from ``model``.

    Parameters
    ----------
    model : DecoderLM or LSTMLM
        Run in eval mode (dropout off); its previous mode is restored afterwards. An LSTMLM
        carries its state from token to token (:class:`RecurrentDecoder`).
    prompt_ids : array of int, shape (T,) or (B, T)
        T >= 1 token ids in ``[0, vocab)``; longer than ``max_len``, the window policy crops it.
    steps : int
        Tokens to add (0 returns the prompt).
    rng : np.random.Generator, optional
        Source of every random draw; a seeded generator makes the output repeatable. Default
        a fresh unseeded one (a different text every call); not used with ``greedy``.
    temperature, top_k, top_p, greedy
        How each token is drawn, see :func:`~numpy_transformer.sampling.sample_next`.
    use_cache : bool, default True
        Decode with the key/value cache (one new row per step), or the LSTM's carried state.
        False recomputes the window (an LSTM's whole sequence) every step: the reference.
    policy : {"refill", "recompute"}, optional
        What a DecoderLM does at ``max_len``; see the module docstring. Default ``"refill"``;
        ``"recompute"`` with ``use_cache=False`` is the chapter's cropped-window sampler. An
        LSTMLM has no window: leave it None.
    keep : int, optional
        Tokens kept when the window is full (``policy="refill"``; default ``max_len // 2``).
        Not for an LSTMLM.
    vocab : int, optional
        Draw only ids below it: a tokenizer with fewer ids than the model has rows (GPT-2's
        50,257 in nanoGPT's table of 50,304).

    Returns
    -------
    ids : ndarray of int64, shape (T + steps,) or (B, T + steps)
        The prompt followed by the generated tokens (same rank as ``prompt_ids``).

    Raises
    ------
    ValueError
        For a model that is not a ``DecoderLM`` or an ``LSTMLM``, ids outside the vocabulary,
        an empty prompt, a bad ``steps``, ``policy``, ``keep``, ``vocab`` or sampling option.
    """
    decoder = _decoder_for(model, use_cache, policy, keep)
    prompt, single = _check_prompt("prompt_ids", prompt_ids, model.config.vocab)
    rng = np.random.default_rng() if rng is None and not greedy else rng
    _check_run(steps, rng, temperature, top_k, top_p, greedy, vocab, model.config.vocab)
    new = []  # one (B,) array per step
    with _evaluating(model):
        if steps:
            logits = decoder.start(prompt)  # (B, V)
        for step in range(steps):
            new.append(sample_next(logits[:, :vocab], rng, temperature, top_k, top_p, greedy))
            if step + 1 < steps:  # the last token needs no logits after it
                logits = decoder.append(new[-1])
    ids = np.concatenate([prompt] + [t[:, None] for t in new], axis=1)  # (B, T + steps)
    return ids[0] if single else ids


def generate_seq2seq(model: EncoderDecoder, src_ids, start_ids, steps: int,
                     rng: np.random.Generator | None, src_lengths=None,
                     temperature: float = 1.0, top_k: int | None = None,
                     top_p: float | None = None, greedy: bool = False,
                     use_cache: bool = True) -> np.ndarray:
    """Decode a target for ``src_ids`` with an :class:`EncoderDecoder`.

    The encoder runs once; with ``use_cache`` every decoder block also computes the
    cross-attention keys and values of the encoder's output once, and keeps a self-attention
    key/value cache, so a step costs one query row. There is no window policy: the target
    (start tokens plus steps) must fit in ``max_len``.

    Parameters
    ----------
    model : EncoderDecoder
        Run in eval mode; its previous mode is restored afterwards.
    src_ids : array of int, shape (T_s,) or (B, T_s)
    start_ids : array of int, shape (T_0,) or (B, T_0)
        The target's first tokens, e.g. a begin-of-sequence id. Same rank as ``src_ids``.
    steps : int
    rng, temperature, top_k, top_p, greedy
        As for :func:`generate`.
    src_lengths : array of int, shape (B,), optional
        Unpadded source lengths (padded positions are masked, as in ``forward``).
    use_cache : bool, default True
        False recomputes ``forward(src, target so far)`` every step (the reference).

    Returns
    -------
    ids : ndarray of int64, shape (T_0 + steps,) or (B, T_0 + steps)
        ``start_ids`` followed by the generated tokens; no stopping at an end token.
    """
    if not isinstance(model, EncoderDecoder):
        raise ValueError(f"generate_seq2seq needs an EncoderDecoder, got {type(model).__name__}")
    vocab, max_len = model.config.vocab, model.config.max_len
    src, single = _check_prompt("src_ids", src_ids, vocab)
    tgt, single_tgt = _check_prompt("start_ids", start_ids, vocab)
    if single != single_tgt or src.shape[0] != tgt.shape[0]:
        raise ValueError(f"src_ids {np.shape(src_ids)} and start_ids {np.shape(start_ids)} "
                         f"must hold the same number of sequences")
    _check_run(steps, rng, temperature, top_k, top_p, greedy)
    if tgt.shape[1] + steps > max_len:
        raise ValueError(f"start tokens ({tgt.shape[1]}) + steps ({steps}) exceed "
                         f"max_len={max_len}")
    with _evaluating(model):
        cache = new_cache(model, src.shape[0]) if use_cache else None
        new = tgt  # with the cache: prefill with the start tokens, then one token per step
        for _ in range(steps):
            if use_cache:
                logits = model.forward(src, new, src_lengths, cache=cache)[:, -1]
            else:
                logits = model.forward(src, tgt, src_lengths)[:, -1]  # (B, V)
            new = sample_next(logits, rng, temperature, top_k, top_p, greedy)[:, None]
            tgt = np.concatenate([tgt, new], axis=1)
    return tgt[0] if single else tgt

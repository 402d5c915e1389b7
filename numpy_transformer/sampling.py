"""Sampling: choosing the next token from next-token logits.

A language model gives, for the last position, one logit per token of the vocabulary.
:func:`next_token_probs` turns them into the distribution a token is drawn from, shaped by
three options applied in this order: a **temperature** (divides the logits: below 1 sharpens,
above 1 flattens), **top-k** (only the k most probable tokens stay) and **nucleus** sampling,
top-p (only the smallest set of most probable tokens whose mass reaches p stays).
:func:`sample_next` draws one token per row from it, or takes the argmax (``greedy``).
The decoding loops that call it every step are in ``numpy_transformer/generate.py``.

References
----------
Holtzman et al., "The Curious Case of Neural Text Degeneration", 2020 (nucleus sampling).
Fan, Lewis & Dauphin, "Hierarchical Neural Story Generation", 2018 (top-k sampling).
"""

from __future__ import annotations

import numpy as np

__all__ = ["check_sampling", "next_token_probs", "sample_next"]


def check_sampling(rng: np.random.Generator | None, temperature: float = 1.0,
                   top_k: int | None = None, top_p: float | None = None,
                   greedy: bool = False) -> None:
    """Refuse sampling options :func:`sample_next` cannot use.

    Parameters
    ----------
    rng, temperature, top_k, top_p, greedy
        As for :func:`sample_next`.

    Raises
    ------
    ValueError
        Naming the first bad value: a temperature that is not a finite number > 0, a
        ``top_k`` that is not an integer >= 1, a ``top_p`` outside (0, 1], or, unless
        ``greedy``, an ``rng`` that is not a ``np.random.Generator``.
    """
    if (isinstance(temperature, bool) or not isinstance(temperature, (int, float, np.floating))
            or not np.isfinite(temperature) or not temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer))
                              or top_k < 1):
        raise ValueError(f"top_k must be an integer >= 1 (or None), got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool)
                              or not isinstance(top_p, (int, float, np.floating))
                              or not 0 < top_p <= 1):
        raise ValueError(f"top_p must lie in (0, 1] (or be None), got {top_p!r}")
    if not greedy and not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a np.random.Generator when sampling, got "
                         f"{type(rng).__name__}")


def _logit_rows(logits) -> np.ndarray:
    """``logits`` (V,) or (B, V) as rows (B, V), refused unless every row can be sampled."""
    logits = np.asarray(logits)
    if not np.issubdtype(logits.dtype, np.floating) or logits.ndim not in (1, 2):
        raise ValueError(f"logits must be a float array of shape (V,) or (B, V), got dtype "
                         f"{logits.dtype} and shape {logits.shape}")
    if logits.shape[-1] == 0:
        raise ValueError(f"logits have an empty vocabulary axis, shape {logits.shape}")
    rows = logits.reshape(-1, logits.shape[-1])  # (B, V)
    row_max = rows.max(axis=-1)  # NaN if the row holds a NaN
    if np.isnan(row_max).any() or (row_max == np.inf).any():
        raise ValueError("logits contain NaN or +inf")
    if not (row_max > -np.inf).all():
        raise ValueError("a row of logits has no finite entry: nothing can be sampled")
    return rows


def next_token_probs(logits: np.ndarray, temperature: float = 1.0, top_k: int | None = None,
                     top_p: float | None = None) -> np.ndarray:
    """The distribution :func:`sample_next` draws from: temperature, then top-k, then top-p.

    Parameters
    ----------
    logits : ndarray of shape (B, V)
    temperature, top_k, top_p
        As for :func:`sample_next` (already validated).

    Returns
    -------
    probs : ndarray of float64, shape (B, V)
        Each row sums to 1; tokens cut by top-k or top-p have probability exactly 0.

    Notes
    -----
    (1) z = logits / temperature
    (1') where (1) overflows (a temperature like 1e-310), its limit as temperature -> 0:
         z_j = 0 for the largest logits, -inf for the rest, i.e. greedy (ties share)
    (2) top-k: z_j = -inf unless j is among the k largest z (exactly k kept; ties at the
        k-th value are broken arbitrarily)
    (3) p = softmax(z)
    (4) top-p: sort p descending; keep the smallest prefix whose cumulative mass reaches
        top_p, i.e. keep sorted entry i iff the mass *before* it is < top_p; set the rest to
        0 and renormalise
    """
    with np.errstate(over="ignore"):  # handled by (1')
        z = logits.astype(np.float64) / temperature  # (1) (B, V)
    top = z.max(axis=-1)
    if not np.isfinite(top).all():  # (1') a temperature so small that (1) overflows
        rows = ~np.isfinite(top)
        best = logits[rows] == logits[rows].max(axis=-1, keepdims=True)
        z[rows] = np.where(best, 0.0, -np.inf)  # the limit T -> 0: all mass on the best
    v = z.shape[-1]
    if top_k is not None and top_k < v:  # (2)
        best = np.argpartition(-z, top_k - 1, axis=-1)[:, :top_k]  # (B, k), any order
        keep = np.zeros(z.shape, dtype=bool)
        np.put_along_axis(keep, best, True, axis=-1)
        z = np.where(keep, z, -np.inf)
    e = np.exp(z - z.max(axis=-1, keepdims=True))  # (3)
    p = e / e.sum(axis=-1, keepdims=True)
    if top_p is not None and top_p < 1:  # (4)
        order = np.argsort(-p, axis=-1, kind="stable")  # (B, V) most probable first
        sorted_p = np.take_along_axis(p, order, axis=-1)
        mass_before = np.cumsum(sorted_p, axis=-1) - sorted_p
        keep = np.zeros(p.shape, dtype=bool)
        np.put_along_axis(keep, order, mass_before < top_p, axis=-1)  # the first is always kept
        p = np.where(keep, p, 0.0)
        p = p / p.sum(axis=-1, keepdims=True)
    return p


def _draw(p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One index per row of ``p`` (B, V), by inverting the cumulative distribution.

    With one uniform u per row: the first j with cumsum(p)_j > u * sum(p). A token of
    probability 0 is never drawn.
    """
    c = np.cumsum(p, axis=-1)
    u = rng.random((p.shape[0], 1)) * c[:, -1:]  # (B, 1), in [0, total)
    ids = (c <= u).sum(axis=-1)  # index of the first c_j > u; its p_j > 0
    if (ids == p.shape[1]).any():  # u rounded up to the total: take the last p_j > 0
        last = p.shape[1] - 1 - np.argmax(p[:, ::-1] > 0, axis=-1)
        ids = np.minimum(ids, last)
    return ids


def sample_next(logits: np.ndarray, rng: np.random.Generator | None, temperature: float = 1.0,
                top_k: int | None = None, top_p: float | None = None, greedy: bool = False):
    """Draw the next token id from next-token logits.

    Parameters
    ----------
    logits : ndarray of shape (V,) or (B, V)
        Unnormalised log-probabilities of the next token (the model's last position).
    rng : np.random.Generator
        The only source of randomness (may be None when ``greedy``).
    temperature : float, default 1.0
        Divides the logits: < 1 sharpens the distribution (towards greedy as it goes to 0;
        one so small that the division overflows, such as 1e-310, is greedy), > 1 flattens it.
    top_k : int, optional
        Keep only the k most probable tokens, renormalised (k >= V keeps all).
    top_p : float, optional
        Nucleus sampling: keep the smallest set of most probable tokens whose total
        probability reaches ``top_p`` (applied after top-k), renormalised.
    greedy : bool, default False
        Return the argmax of the logits (temperature, top-k and top-p cannot change it).

    Returns
    -------
    ids : int for logits (V,); ndarray of int64, shape (B,), for logits (B, V)

    Raises
    ------
    ValueError
        For logits that are not a 1-D/2-D float array, contain NaN or +inf, or have a row
        without a finite entry; for ``temperature <= 0``, ``top_k < 1``, ``top_p`` outside
        (0, 1], or a missing ``rng`` when sampling (:func:`check_sampling`).

    Notes
    -----
    The distribution is :func:`next_token_probs`; the draw inverts its cumulative
    distribution with one uniform number per row.
    """
    check_sampling(rng, temperature, top_k, top_p, greedy)
    rows = _logit_rows(logits)  # (B, V)
    if greedy:
        ids = rows.argmax(axis=-1)
    else:
        ids = _draw(next_token_probs(rows, temperature, top_k, top_p), rng)
    ids = ids.astype(np.int64)
    return int(ids[0]) if np.ndim(logits) == 1 else ids

"""The training loop: one step is forward, cross-entropy, backward, global-norm clip, update.

A :class:`Trainer` is deliberately small. It does not draw data: it is handed batches, so the
caller decides the schedule (for the paired protocol two trainers are handed the identical,
precomputed window schedule). Each step it records the loss, the learning rate, the gradient
norm before clipping and the throughput; every ``stats_every`` steps it also records, per
parameter tensor, the gradient norm and the update-to-weight ratio ``||dW|| / ||W||``, the
numbers a reader studying the optimisation wants to plot.

A non-finite loss or gradient stops training with :class:`NonFiniteError`, which names the
step and the first tensor that went non-finite; the parameters are left as they were before
that step.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .backend import Backend, get_backend
from .data import get_batch
from .optim import clip_grad_norm, global_norm


class Batch(NamedTuple):
    """What one step consumes: the model's inputs, the targets and an optional loss mask."""

    inputs: tuple  # positional arguments of model.forward, e.g. (x,) or (src, tgt_in)
    targets: np.ndarray  # (B, T) int, ignore_index -100 where not counted
    mask: np.ndarray | None = None  # (B, T) bool, True = counted


class NonFiniteError(RuntimeError):
    """Training produced a NaN or an infinity; the message names the step and the tensor."""


@dataclass
class StepRecord:
    """One line of the loss log."""

    step: int
    loss: float
    lr: float
    grad_norm: float
    tokens_per_s: float


@dataclass
class Trainer:
    """Runs optimisation steps of ``model`` with ``optimizer``.

    Parameters
    ----------
    model : Module
        Any model with ``forward(*inputs) -> logits``, ``backward(dlogits)``, ``zero_grad``
        and ``named_parameters``; its ``loss_and_backward(*inputs, targets=, mask=)`` in
        place of the first two where it has one.
    optimizer : Adam or AdamW
    lr_schedule : callable
        Maps the number of the update about to be made (1, 2, ...) to a learning rate.
    clip : float or None
        Global-norm clipping threshold; ``None`` = no clipping (the norm is still recorded).
    stats_every : int
        Record per-tensor gradient norms and update-to-weight ratios every this many steps
        (0 = never).
    backend : str or Backend, optional
        Where the loss's ``cross_entropy_forward`` / ``_backward`` come from for a model
        without ``loss_and_backward`` (the library's models have one, on their own backend);
        default the model's, ``model.config.backend``.
    """

    model: object
    optimizer: object
    lr_schedule: Callable[[int], float]
    clip: float | None = 1.0
    stats_every: int = 0
    step_count: int = 0
    log: list[StepRecord] = field(default_factory=list)
    tensor_stats: list[dict] = field(default_factory=list)
    backend: str | Backend | None = None

    def __post_init__(self) -> None:
        backend = self.backend
        if backend is None:
            if getattr(self.model, "config", None) is None:
                raise ValueError("the model has no config to take the backend from: pass "
                                 "Trainer(..., backend=...)")
            backend = self.model.config.backend
        self.ops = get_backend(backend)

    def named_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The model's parameters and gradients as two dicts with the same keys."""
        named = list(self.model.named_parameters())
        return {n: p for n, p, _ in named}, {n: g for n, _, g in named}

    def loss_and_grads(self, batch: Batch) -> float:
        """Forward, mean cross-entropy over the counted targets, and backward into the grads.

        The library's models do it in one call, ``loss_and_backward``, which takes the head
        and the loss as one operation (``functional/head_loss.py``): on the numba backend the
        (B, T, V) logits, their probabilities and their gradient, each (1, 1024, 50304) at
        GPT-2's vocabulary and 1024 positions, are never made whole. Any other model is run as
        ``forward``, the loss, ``backward``; the logits and the probabilities are let go
        before its backward starts, when every layer's cache is still held.

        The gradients it leaves are this batch's alone, as after ``zero_grad()``: the backward
        runs in ``model.replacing_grads()``, which spares the pass that zeroes them (a model
        without that method is zeroed first).
        """
        replacing = getattr(self.model, "replacing_grads", None)
        if replacing is None:  # a model of another making: zeroed first
            self.model.zero_grad()
            replacing = contextlib.nullcontext
        with replacing():
            fused = getattr(self.model, "loss_and_backward", None)
            if fused is not None:
                return fused(*batch.inputs, targets=batch.targets, mask=batch.mask)
            logits = self.model.forward(*batch.inputs)  # (B, T, V)
            loss, cache = self.ops.cross_entropy_forward(logits, batch.targets, mask=batch.mask)
            del logits
            dlogits = self.ops.cross_entropy_backward(1.0, cache)  # (B, T, V)
            del cache
            self.model.backward(dlogits)
            return loss

    def step(self, batch: Batch) -> StepRecord:
        """One full optimisation step; returns its log record.

        Raises
        ------
        NonFiniteError
            If the loss or a gradient is not finite (nothing is updated then).
        """
        start = time.perf_counter()
        step = self.step_count + 1
        loss = self.loss_and_grads(batch)
        params, grads = self.named_arrays()
        if not math.isfinite(loss):
            raise NonFiniteError(f"step {step}: the loss is {loss}; {_weights_report(params)}")
        norm = clip_grad_norm(grads, self.clip) if self.clip else global_norm(grads)
        if not math.isfinite(norm):  # global_norm is finite when every gradient is
            first = next((n for n, g in grads.items() if not np.isfinite(g).all()), None)
            raise NonFiniteError(f"step {step}: the gradient of {first} is not finite" if first
                                 else f"step {step}: the gradient norm is beyond float range")
        lr = self.lr_schedule(step)
        keep_stats = self.stats_every and step % self.stats_every == 0
        before = {n: p.copy() for n, p in params.items()} if keep_stats else None
        self.optimizer.step(params, grads, lr=lr)
        if keep_stats:
            self.tensor_stats.append(_tensor_stats(step, params, grads, before))
        self.step_count = step
        tokens = batch.targets.size
        record = StepRecord(step, loss, lr, norm, tokens / (time.perf_counter() - start))
        self.log.append(record)
        return record

    def fit(self, batches: Iterable[Batch], total: int, *, progress: bool = True,
            on_step: Callable[[StepRecord], None] | None = None) -> list[StepRecord]:
        """Run one step per batch (``total`` of them, for the progress line); call ``on_step``
        after each step. Returns the loss log."""
        bar = ProgressBar(total) if progress else None
        for batch in batches:
            record = self.step(batch)
            if bar:
                bar.update(record)
            if on_step:
                on_step(record)
        if bar:
            bar.close()
        return self.log


def _weights_report(params: dict[str, np.ndarray]) -> str:
    """Which tensor to blame for a non-finite loss: the first weight holding a NaN or an
    infinity, else the weight of the largest magnitude (finite weights so large that the
    activations overflow)."""
    bad = next((n for n, p in params.items() if not np.isfinite(p).all()), None)
    if bad is not None:
        return f"weight {bad} holds NaN or infinity"
    peaks = {n: float(np.abs(p).max()) for n, p in params.items() if p.size}
    name = max(peaks, key=peaks.get)
    return (f"every weight is finite, but {name} reaches |w| = {peaks[name]:.3g} (a learning "
            f"rate too large?)")


def _tensor_stats(step: int, params: dict, grads: dict, before: dict) -> dict:
    """Per tensor: gradient norm (after clipping) and update-to-weight ratio ||dW|| / ||W||."""
    stats = {"step": step}
    for n, p in params.items():
        w_norm = float(np.linalg.norm(before[n]))
        stats[n] = {"grad_norm": float(np.linalg.norm(grads[n])),
                    "update_ratio": float(np.linalg.norm(p - before[n])) / max(w_norm, 1e-12)}
    return stats


class ProgressBar:
    """A one-line progress display: step, loss, learning rate, gradient norm (marked ``*``
    where it was clipped, with the count so far), smoothed tokens/s, time and the time left.

    On a terminal it redraws in place, through ``tqdm`` where that is installed (its bar, rate
    and time, these numbers after it); elsewhere (logs, CI) it prints a plain line every ~10%.

    Parameters
    ----------
    total : int
        The step the run ends at.
    stream : file, optional
        Default: ``sys.stderr``, looked up when the bar is made.
    width : int, default 24
        Characters of the bar.
    clip : float, optional
        The global-norm threshold of the run: a step whose gradient norm exceeds it was
        clipped.
    """

    SMOOTHING = 0.9  # tokens/s: an exponential average, weight of the past

    def __init__(self, total: int, stream=None, width: int = 24,
                 clip: float | None = None) -> None:
        self.total, self.width, self.clip = total, width, clip
        self.stream = sys.stderr if stream is None else stream  # looked up now, not at import
        self.tty = self.stream.isatty()
        self.start = time.perf_counter()
        self.last_line = -1
        self.first_step: int | None = None  # steps made before this bar's first (a resume)
        self.rate: float | None = None
        self.clipped = 0
        self.tqdm = _tqdm_bar(total, self.stream) if self.tty else None

    def update(self, r: StepRecord) -> None:
        if self.first_step is None:
            self.first_step = r.step - 1
            if self.tqdm is not None:  # a resume's bar starts where the run is
                self.tqdm.n = self.first_step
        done = r.step if self.total == 0 else min(r.step, self.total)
        frac = done / max(self.total, 1)
        filled = int(frac * self.width)
        elapsed = time.perf_counter() - self.start
        left = elapsed / (r.step - self.first_step) * max(self.total - done, 0)
        self.rate = r.tokens_per_s if self.rate is None else (
            self.SMOOTHING * self.rate + (1 - self.SMOOTHING) * r.tokens_per_s)
        clipped = self.clip is not None and r.grad_norm > self.clip
        self.clipped += clipped
        clip_text = f" ({self.clipped} clipped)" if self.clip is not None else ""
        status = (f"loss {r.loss:.4f} lr {r.lr:.2e} |g| {r.grad_norm:.3f}"
                  f"{'*' if clipped else ' '}{clip_text} {self.rate:,.0f} tok/s")
        if self.tqdm is not None:  # tqdm draws the bar, the rate of steps and the times
            self.tqdm.update(done - self.tqdm.n)
            self.tqdm.set_postfix_str(status)
            return
        text = (f"[{'#' * filled}{'.' * (self.width - filled)}] step {r.step}/{self.total} "
                f"{status} {elapsed:.0f}s, {left:.0f}s left")
        if self.tty:
            self.stream.write("\r" + text + "\x1b[K")  # and clear what a longer line left
            self.stream.flush()
        elif int(frac * 10) > self.last_line or r.step == self.total:
            self.last_line = int(frac * 10)
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.tqdm is not None:
            self.tqdm.close()
        elif self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _tqdm_bar(total: int, stream):
    """A ``tqdm`` bar of ``total`` steps on ``stream``, or None where tqdm is not installed."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, file=stream, unit="step", dynamic_ncols=True, leave=True)


def lm_batches(ids: np.ndarray, schedule: np.ndarray, context: int) -> Iterator[Batch]:
    """Next-token batches from a precomputed (steps, B) window schedule over ``ids``."""
    for starts in schedule:
        x, y = get_batch(ids, starts, context)  # (B, T) inputs and their shifted targets
        yield Batch((x,), y)

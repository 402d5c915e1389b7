"""What a run writes after its last step: the held-out loss, the loss plot, for a Transformer
the attention map and, for a language model, a sample (the files of
:data:`~.outputs.REPORT_FILES` that :func:`~.outputs.files_of` the run names)."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np

from ..files import atomic_write_text
from ..generate import generate
from ..plots import attention_plot, loss_plot, tensor_stats_plot
from .folder import checkpoint_path, log_path, read_log
from .outputs import (
    ATTENTION_PLOT,
    BEST_BEFORE_FINAL,
    CONFIG,
    EXIT_DIVERGED,
    EXIT_OK,
    LOSS_PLOT,
    SAMPLE,
    SAMPLE_LENGTH,
    SAMPLE_TEMPERATURE,
    STATS_PLOT,
    files_of,
    say,
)
from .sample import default_prompt
from .state import Run


class BestCheckpoint:
    """The lowest held-out loss of a run so far, kept in its ``best.npz``, and the
    evaluations since it was found (``--early-stop``). Both are read back from the log's
    evaluations every ``--eval-every`` steps (its final ones left out), so a resumed or
    extended run goes on counting where it stopped.

    The final evaluation, after the last step, joins them (:meth:`offer` with ``final``).
    Between two ``--eval-every`` steps it is one a longer run does not make: the best it
    replaces is kept as ``best-before-final.npz``, and :meth:`reopen` puts it back when the
    run is extended (``train --resume RUN --steps N``).

    Parameters
    ----------
    run_dir : Path
    patience : int
        Evaluations in a row without a new best after which :attr:`stop` is true; 0 = never.
    eval_every : int
        The run's ``--eval-every`` (0: only the final evaluation).
    """

    def __init__(self, run_dir: Path, patience: int = 0, eval_every: int = 0) -> None:
        self.path, self.patience = checkpoint_path(run_dir, best=True), patience
        self.kept, self.eval_every = run_dir / BEST_BEFORE_FINAL, eval_every
        losses = [(r["val_loss"], r["step"]) for r in read_log(run_dir)
                  if isinstance(r.get("val_loss"), (int, float)) and not r.get("final")]
        self.loss, self.step = min(losses, default=(math.inf, 0))
        self.since = sum(1 for _, step in losses if step > self.step)
        self.evaluated = {step for _, step in losses}  # the steps evaluated so far

    def offer(self, run: Run, loss: float, final: bool = False) -> None:
        """A held-out loss of the run as it is now: a new best is saved to ``best.npz``. The
        ``final`` evaluation keeps the best it replaces if a longer run would not make it."""
        step = run.trainer.step_count
        if loss < self.loss:
            between = not (self.eval_every and step % self.eval_every == 0)
            replaced = self.loss < math.inf and self.path.exists()  # a best of the evaluations
            if final and between and replaced and not self.kept.exists():
                os.replace(self.path, self.kept)  # once: a report written again keeps it
            run.save(self.path, val_loss=loss)
            self.loss, self.step, self.since = loss, step, 0
        elif not final:
            self.since += 1

    def reopen(self) -> None:
        """Before training on past a final evaluation: the best it replaced comes back."""
        if self.kept.exists():
            os.replace(self.kept, self.path)

    @property
    def stop(self) -> bool:
        return bool(self.patience) and self.since >= self.patience


def write_report(run: Run, run_dir: Path) -> int:
    """After the last step: held-out loss, the plots and (for an LM) a sample.

    Returns 0, or 1 (diverged) when the held-out loss of the final weights is not finite:
    weights that are finite but so large that the activations overflow.
    """
    # Weights that grew huge but stayed finite overflow in float32 (a LayerNorm's variance);
    # the held-out loss below is the verdict, NumPy's warnings are noise.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return _report(run, run_dir)


def _report(run: Run, run_dir: Path) -> int:
    result = run.evaluate()
    if not math.isfinite(result["val_loss"]):  # finite weights, but too large to compute with
        print(f"numpy-transformer: error: training diverged: the held-out loss after step "
              f"{run.trainer.step_count} is {result['val_loss']}; the weights of {run_dir} "
              f"cannot be sampled from", file=sys.stderr, flush=True)
        return EXIT_DIVERGED
    BestCheckpoint(run_dir, eval_every=run.options.eval_every).offer(run, result["val_loss"],
                                                                    final=True)
    with open(log_path(run_dir), "a", encoding="utf-8") as log:
        log.write(json.dumps({"step": run.trainer.step_count, **result, "final": True}) + "\n")
    line = f"held-out loss {result['val_loss']:.4f}"
    if run.task == "lm":
        unit = "character" if run.options.tokenizer == "char" else "BPE token"
        line += (f" (fixed windows of {run.config.max_len}; "
                 f"{result['val_loss'] / math.log(2):.3f} bits per {unit})")
    if "val_acc" in result:
        line += f", accuracy {result['val_acc']:.3f}"
    say(line)
    files = files_of(run.task, run.options.model)
    log = read_log(run_dir)
    loss_plot(log, run_dir / LOSS_PLOT,  # matplotlib is imported only now
              clip=run.options.clip or None)
    stats = [{"step": r["step"], **r["tensor_stats"]} for r in log if "tensor_stats" in r]
    if stats:
        tensor_stats_plot(stats, run_dir / STATS_PLOT)
        files += (STATS_PLOT,)
    if ATTENTION_PLOT in files:
        attention_plot(run, run_dir / ATTENTION_PLOT)
    if SAMPLE in files:
        prompt = default_prompt(run.tokenizer)
        ids = generate(run.model, run.tokenizer.encode(prompt), SAMPLE_LENGTH, run.sample_rng,
                       temperature=SAMPLE_TEMPERATURE, vocab=run.tokenizer.vocab_size)
        text = run.tokenizer.decode(ids)
        atomic_write_text(run_dir / SAMPLE, text + "\n")
        say(f"sample (temperature {SAMPLE_TEMPERATURE}):\n{text}")
    written = [name for name in files if name != CONFIG]  # config.json came first
    say(f"wrote {run_dir}/: {', '.join(written)}")
    return EXIT_OK

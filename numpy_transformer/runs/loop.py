"""Training a run: start a new one, resume a stopped one exactly, and the loop between them.

Exact resume
------------
Everything random is drawn from generators that are either saved or re-derived: the LM's
window schedule is drawn up front from ``default_rng(seed)`` (so it is recomputed, and its
fingerprint checked, on resume); the synthetic tasks draw each batch from a data generator
whose state is saved; every Dropout layer's generator and the sampler's generator are saved.
The step count is the position in the schedule. With the weights and Adam's moments saved
bit for bit, step k + 1 after a resume computes exactly what it would have computed.

The exit codes these functions return are those of :data:`.outputs.EXIT_CODES`.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
import time
from pathlib import Path

import numpy as np

from ..checkpoint import Checkpoint, restamp_checkpoint
from ..files import atomic_write_text
from ..train import NonFiniteError, ProgressBar, StepRecord, Trainer
from .folder import (
    checkpoint_path,
    cut_log,
    existing_run_folder,
    has_report,
    log_path,
    new_run_folder,
    write_description,
)
from .init_from import new_run
from .options import RunOptions
from .outputs import (
    BEST,
    BEST_BEFORE_FINAL,
    CHECKPOINT,
    EXIT_DIVERGED,
    EXIT_IO,
    EXIT_OK,
    EXIT_ON_SIGNAL,
    TOKENIZER,
    UsageError,
    describe_os_error,
    say,
)
from .report import BestCheckpoint, write_report
from .sources import Source
from .state import Run
from .stored import read_run, rebuild_run
from .tensorboard import EventLog, check_available, event_log


def start_run(config_fields: dict[str, object], options: RunOptions, out: str | None,
              force: bool, progress: bool = True, source: Source | None = None) -> int:
    """Build a new run (from ``source``'s weights and tokenizer, for ``--init-from``),
    prepare its folder and train it; returns the exit code (0 also when the default folder
    holds this run finished already: :func:`~.folder.new_run_folder`)."""
    try:
        run = Run(config_fields, options) if source is None else new_run(source, config_fields,
                                                                          options)
    except ValueError as e:  # load_text and friends name the problem
        raise UsageError(str(e)) from None
    if options.tensorboard:
        check_available()  # before the folder: a missing package is bad input
    held = new_run_folder(out, run.description(), force)
    if held is None:  # nothing to do: said
        return EXIT_OK
    with held:
        run_dir = held.folder
        say(f"run folder {run_dir}")
        say(run.summary())
        if run.started_from:
            start = run.started_from
            say(f"starting from {start['path']}" + ("" if start["step"] is None else
                f" (step {start['step']})") + f", weights sha256 {start['weights_sha256'][:16]}")
        if run.tokenizer is not None:
            say(run.data_line())
        if options.tokenizer == "bpe":
            atomic_write_text(run_dir / TOKENIZER, run.tokenizer.to_dict()["bpe"])
        run.save(checkpoint_path(run_dir))  # step 0: a run folder always holds a checkpoint
        return train(run, run_dir, progress)


def resume_run(run_dir: str | Path, progress: bool = True, steps: int | None = None) -> int:
    """Continue the run in ``run_dir`` from its checkpoint; returns the exit code.

    1. Hold the folder (no other process may train in it).
    2. Read it (:func:`~.stored.read_run`: a run of an older format version is brought to
       today's, saying what was filled in) and rebuild the run (:func:`~.stored.rebuild_run`
       checks that the data and config are still those it was trained with). A folder
       holding only its ``config.json`` (killed before the first save) starts the run from
       step 0.
    3. A run that finished and wrote its report: nothing to do.
    4. Drop the log lines written after the checkpoint: those steps are recomputed,
       identically; ``config.json`` is written in today's format if it was not.
    5. Finished but stopped while writing the report: write the report again (the sampler's
       generator comes from the checkpoint, so the sample is the same). Otherwise train on.

    With ``steps`` other than the run's, the run is first extended to that many steps,
    finished or not (:func:`extend`): it ends as the run configured with ``steps`` from the
    start.
    """
    with existing_run_folder(run_dir) as held:
        run_dir = held.folder
        stored = read_run(run_dir)
        run = rebuild_run(stored)
        if run.options.tensorboard:
            check_available()
        ckpt = stored.checkpoint
        if steps is not None and steps != run.options.steps:
            extend(run, run_dir, ckpt, steps)
        steps = run.options.steps
        if ckpt is None:
            say(f"{run_dir} has no checkpoint yet (stopped before its first save); starting "
                f"its run from step 0")
            run.save(checkpoint_path(run_dir))
        finished = ckpt is not None and ckpt.meta.get("finished") and (
            ckpt.step >= steps or "early_stopped" in ckpt.meta)
        if finished and has_report(run_dir, run.task, run.options.model):
            ended = (f"stopped early at step {ckpt.step} of {steps}" if ckpt.step < steps
                     else f"finished its {steps} steps")
            say(f"{run_dir} already {ended}; nothing to resume")
            return EXIT_OK
        cut_log(run_dir, run.trainer.step_count)
        write_description(run_dir, run.description())
        if finished:
            say(f"{run_dir} finished training; writing its report")
            return write_report(run, run_dir)
        if ckpt is not None:
            say(f"resuming {run_dir} at step {ckpt.step} of {steps}")
        if run.tokenizer is not None:
            say(run.data_line())
        return train(run, run_dir, progress)


def extend(run: Run, run_dir: Path, ckpt: Checkpoint | None, steps: int) -> None:
    """Make the run of ``run_dir``, restored from its checkpoint ``ckpt``, the run of
    ``steps`` updates: bit for bit the run configured with ``steps`` from the start, in its
    weights, Adam's state, log, held-out evaluations, ``best.npz`` and early stop.

    Its first updates are already those of the longer run (:meth:`~.state.Run.extend`: every
    schedule but the cosine one is the same for every length). What it did only because it
    ended is undone: the final evaluation leaves the log (:func:`~.folder.cut_log`), the
    evaluation the longer run makes at that step is made when training goes on, and the best
    the final evaluation replaced comes back (:class:`~.report.BestCheckpoint`). A run that
    stopped early is the longer run already (it stops at the same step, after the same
    evaluations): only its records change. The checkpoints kept and ``config.json`` then
    record the new length.

    Raises
    ------
    UsageError
        If the run cannot be made that long exactly (:meth:`~.state.Run.extend`).
    """
    early = ckpt is not None and ckpt.meta.get("early_stopped")
    say(f"extending {run_dir} from {run.options.steps} to {steps} steps" + (
        f": it stopped early at step {early}, where the run of {steps} steps stops too"
        if early else ""))
    run.extend(steps)
    stamp = {"data_fingerprint": run.data_fingerprint}
    for name in (CHECKPOINT, BEST, BEST_BEFORE_FINAL):
        if (run_dir / name).exists():
            restamp_checkpoint(run_dir / name, dataclasses.asdict(run.options), stamp)
    write_description(run_dir, run.description())


class _StopRequest:
    """Turns SIGINT and SIGTERM into a flag the loop checks between steps: the step in
    flight finishes, a checkpoint is written, then the run exits."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.signum is None:  # a second signal (during the save, say) changes nothing
            self.signum = signum

    def __enter__(self) -> _StopRequest:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def train(run: Run, run_dir: Path, progress: bool = True) -> int:
    """The training loop with logging, periodic evaluation and checkpoints, then the report.

    Every checkpoint is written inside the ``try``: a non-finite tensor (exit 1) or a failed
    write (exit 74) stops the run with one line, and the last checkpoint written stays whole.
    """
    o = run.options
    steps, trainer = o.steps, run.trainer
    ckpt_path = checkpoint_path(run_dir)
    saved_at = trainer.step_count
    # NumPy's overflow warnings are noise here: the Trainer checks every step for non-finite
    # values itself and stops with a NonFiniteError that names the step and the tensor.
    with _StopRequest() as stop, np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        bar = ProgressBar(steps, clip=o.clip or None) if progress else None
        try:
            best = BestCheckpoint(run_dir, o.early_stop, o.eval_every)
            best.reopen()
            with open(log_path(run_dir), "a", encoding="utf-8") as file, \
                    event_log(run_dir, o.tensorboard, trainer.step_count) as events:
                log = _Log(file, events)
                if _evaluates(o, trainer.step_count) and trainer.step_count not in best.evaluated:
                    _evaluate(run, best, log)  # a run extended past its old last step
                while trainer.step_count < steps and stop.signum is None and not best.stop:
                    r = trainer.step(run.batch(trainer.step_count))
                    _log_step(log, r, trainer)
                    if bar:
                        bar.update(r)
                    if _evaluates(o, r.step):
                        _evaluate(run, best, log)
                    if o.save_every and r.step % o.save_every == 0 and r.step < steps:
                        run.save(ckpt_path)
                        saved_at = r.step
            if best.stop:
                run.save(ckpt_path, finished=True, early_stopped=trainer.step_count)
                say(f"early stop after step {trainer.step_count}: {best.since} held-out "
                    f"evaluations without a new best; best.npz holds step {best.step} (loss "
                    f"{best.loss:.4f})")
            elif stop.signum is None:
                run.save(ckpt_path, finished=True)
            elif saved_at != trainer.step_count:
                run.save(ckpt_path)
        except NonFiniteError as e:
            return _stopped(bar, EXIT_DIVERGED, f"training diverged: {e}; the last good "
                            f"checkpoint (step {saved_at}) in {run_dir} is left untouched")
        except OSError as e:
            return _stopped(bar, EXIT_IO, f"{describe_os_error(e)}; training stopped after "
                            f"step {trainer.step_count}, the checkpoint of step {saved_at} in "
                            f"{run_dir} is left intact")
        if bar:
            bar.close()
        if stop.signum is not None:
            name = signal.Signals(stop.signum).name
            print(f"{name}: stopped after step {trainer.step_count} of {steps}; checkpoint "
                  f"saved. Continue with: numpy-transformer train --resume {run_dir}",
                  file=sys.stderr, flush=True)
            return EXIT_ON_SIGNAL[stop.signum]
    return write_report(run, run_dir)


def _evaluates(options: RunOptions, step: int) -> bool:
    """Whether the run makes a held-out evaluation after ``step`` in the loop: every
    ``--eval-every`` steps before the last (the report's final evaluation follows it)."""
    every = options.eval_every
    return bool(every) and step % every == 0 and 0 < step < options.steps


def _evaluate(run: Run, best: BestCheckpoint, log: _Log) -> None:
    """The held-out evaluation of the run as it is now: offered as the best (before its line:
    see BestCheckpoint), then logged."""
    result = run.evaluate()
    best.offer(run, result["val_loss"])
    log.write({"step": run.trainer.step_count, **result})


class _Log:
    """``log.jsonl``, open for appending, and the TensorBoard events beside it (or None)."""

    def __init__(self, file, events: EventLog | None) -> None:
        self.file, self.events = file, events

    def write(self, record: dict) -> None:
        """One line of ``log.jsonl``, on disk at once; the same numbers as events."""
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.events is not None:
            self.events.write(record)


def _log_step(log: _Log, r: StepRecord, trainer: Trainer) -> None:
    """A step's line of ``log.jsonl``, then its tensor statistics' if it kept them
    (``--stats-every``: moved from the trainer to the log, which a resume cuts and goes on)."""
    log.write({"step": r.step, "loss": r.loss, "lr": r.lr, "grad_norm": r.grad_norm,
               "tokens_per_s": r.tokens_per_s, "time": round(time.time(), 3)})
    if trainer.tensor_stats:
        tensors = {k: v for k, v in trainer.tensor_stats.pop().items() if k != "step"}
        log.write({"step": r.step, "tensor_stats": tensors})


def _stopped(bar: ProgressBar | None, code: int, message: str) -> int:
    """End the progress line, print ``message`` as the one error line, return ``code``."""
    if bar:
        bar.close()
    print(f"numpy-transformer: error: {message}", file=sys.stderr, flush=True)
    return code

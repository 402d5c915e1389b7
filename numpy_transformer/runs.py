"""Training runs on disk: start a run, train it, checkpoint it, resume it exactly, report.

The command line (:mod:`numpy_transformer.cli`) parses arguments; everything a run *does*
lives here, so it can be driven from Python and tested without a subprocess.

The run folder and its files are described in :mod:`numpy_transformer.run_dir`; the options
and the :class:`~numpy_transformer.run_setup.Run` they build, in
:mod:`numpy_transformer.run_setup`.

Exact resume
------------
Everything random is drawn from generators that are either saved or re-derived: the LM's
window schedule is drawn up front from ``default_rng(seed)`` (so it is recomputed, and its
fingerprint checked, on resume); the synthetic tasks draw each batch from a data generator
whose state is saved; every Dropout layer's generator and the sampler's generator are saved.
The step count is the position in the schedule. With the weights and Adam's moments saved
bit for bit, step k + 1 after a resume computes exactly what it would have computed.

Exit codes (:data:`EXIT_CODES`): 0 finished, 1 training diverged (non-finite loss or
gradient; the last good checkpoint is left untouched), 2 bad input (options, files, run
folder, checkpoint), 130 stopped by SIGINT (Ctrl-C), 143 stopped by SIGTERM; in the last two
cases a checkpoint was written first and ``numpy-transformer train --resume RUN_DIR``
continues.
"""

from __future__ import annotations

import json
import math
import signal
import sys
from pathlib import Path

import numpy as np

from .checkpoint import atomic_write_text, load_checkpoint
from .data import CharTokenizer
from .run_dir import prepare_run_dir, read_log
from .run_setup import Run, UsageError, run_from_checkpoint, say
from .train import NonFiniteError, ProgressBar

EXIT_OK, EXIT_DIVERGED, EXIT_USAGE = 0, 1, 2
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + signal number, as a shell
SAMPLE_LENGTH, SAMPLE_TEMPERATURE = 300, 0.8


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------

class _StopRequest:
    """Turns SIGINT and SIGTERM into a flag the loop checks between steps: the step in
    flight finishes, a checkpoint is written, then the run exits."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.previous: dict = {}

    def _handle(self, signum, frame) -> None:
        self.signum = signum

    def __enter__(self) -> _StopRequest:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def start_run(config_fields: dict, options: dict, out: str | None, force: bool,
              progress: bool = True) -> int:
    """Build a new run, prepare its folder and train it; returns the exit code."""
    try:
        run = Run(config_fields, options)
    except ValueError as e:  # load_text and friends name the problem
        raise UsageError(str(e)) from None
    run_dir = prepare_run_dir(out, options["task"], run.description(), force)
    atomic_write_text(run_dir / "config.json", json.dumps(run.description(), indent=2) + "\n")
    (run_dir / "log.jsonl").write_text("", encoding="utf-8")
    c = run.config
    say(f"run folder {run_dir}")
    say(f"{type(run.model).__name__}: {run.model.num_parameters():,} parameters, width "
         f"{c.width}, {c.heads} heads, {c.layers} layers, FFN {c.ffn_width} {c.activation}, "
         f"{c.positions} positions, context {c.max_len}, {c.dtype}, {c.backend} attention")
    if run.tokenizer is not None:
        source = options["text"] or "the embedded corpus"
        say(f"data: {source}, {len(run.train_ids) + len(run.val_ids):,} characters, "
             f"vocabulary {run.tokenizer.vocab_size}; {options['steps']} steps of "
             f"{options['batch']} windows")
    run.save(run_dir / "checkpoint.npz")  # step 0: a run folder always holds a checkpoint
    return train(run, run_dir, progress)


def resume_run(run_dir: str | Path, progress: bool = True) -> int:
    """Continue the run in ``run_dir`` from its checkpoint; returns the exit code."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"--resume {run_dir}: no such run folder")
    path = run_dir / "checkpoint.npz"
    ckpt = load_checkpoint(path)
    run = run_from_checkpoint(ckpt, path)
    steps = run.options["steps"]
    finished = ckpt.meta.get("finished") and ckpt.step >= steps
    report_files = ["loss.png", "attention.png"] + (["sample.txt"] if run.task == "lm" else [])
    if finished and all((run_dir / name).exists() for name in report_files):
        say(f"{run_dir} already finished its {steps} steps; nothing to resume")
        return EXIT_OK
    # Forget what was logged after the checkpoint: those steps are recomputed, identically.
    records = [r for r in read_log(run_dir / "log.jsonl", upto=ckpt.step) if not r.get("final")]
    atomic_write_text(run_dir / "log.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    if finished:  # stopped while writing the report: write it again (same sample generator)
        say(f"{run_dir} finished training; writing its report")
        return report(run, run_dir)
    say(f"resuming {run_dir} at step {ckpt.step} of {steps}")
    return train(run, run_dir, progress)


def train(run: Run, run_dir: Path, progress: bool = True) -> int:
    """The training loop with logging, periodic evaluation and checkpoints, then the report."""
    o = run.options
    steps, trainer = o["steps"], run.trainer
    ckpt_path = run_dir / "checkpoint.npz"
    saved_at = trainer.step_count
    bar = ProgressBar(steps) if progress else None
    # NumPy's overflow warnings are noise here: the Trainer checks every step for non-finite
    # values itself and stops with a NonFiniteError that names the step and the tensor.
    with _StopRequest() as stop, open(run_dir / "log.jsonl", "a", encoding="utf-8") as log, \
            np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        try:
            while trainer.step_count < steps and stop.signum is None:
                r = trainer.step(run.batch(trainer.step_count))
                log.write(json.dumps({"step": r.step, "loss": r.loss, "lr": r.lr,
                                      "grad_norm": r.grad_norm,
                                      "tokens_per_s": r.tokens_per_s}) + "\n")
                log.flush()
                if bar:
                    bar.update(r)
                if o["eval_every"] and r.step % o["eval_every"] == 0 and r.step < steps:
                    log.write(json.dumps({"step": r.step, **run.evaluate()}) + "\n")
                    log.flush()
                if o["save_every"] and r.step % o["save_every"] == 0 and r.step < steps:
                    run.save(ckpt_path)
                    saved_at = r.step
        except NonFiniteError as e:
            if bar:
                bar.close()
            print(f"numpy-transformer: error: training diverged: {e}; the last good "
                  f"checkpoint (step {saved_at}) in {run_dir} is left untouched",
                  file=sys.stderr, flush=True)
            return EXIT_DIVERGED
        if bar:
            bar.close()
        if stop.signum is not None:
            if saved_at != trainer.step_count:
                run.save(ckpt_path)
            name = signal.Signals(stop.signum).name
            print(f"{name}: stopped after step {trainer.step_count} of {steps}; checkpoint "
                  f"saved. Continue with: numpy-transformer train --resume {run_dir}",
                  file=sys.stderr, flush=True)
            return EXIT_CODES[stop.signum]
        run.save(ckpt_path, finished=True)
    return report(run, run_dir)


def report(run: Run, run_dir: Path) -> int:
    """After the last step: held-out loss, the two plots and (for an LM) a sample."""
    result = run.evaluate()
    with open(run_dir / "log.jsonl", "a", encoding="utf-8") as log:
        log.write(json.dumps({"step": run.trainer.step_count, **result, "final": True}) + "\n")
    line = f"held-out loss {result['val_loss']:.4f}"
    if run.task == "lm":
        line += (f" (fixed windows of {run.config.max_len}; "
                 f"{result['val_loss'] / math.log(2):.3f} bits per character)")
    if "val_acc" in result:
        line += f", accuracy {result['val_acc']:.3f}"
    say(line)
    from . import plots  # matplotlib is imported only here

    plots.loss_plot(read_log(run_dir / "log.jsonl"), run_dir / "loss.png")
    plots.attention_plot(run, run_dir / "attention.png")
    if run.task == "lm":
        from .generate import generate

        prompt = default_prompt(run.tokenizer)
        ids = generate(run.model, run.tokenizer.encode(prompt), SAMPLE_LENGTH, run.sample_rng,
                       temperature=SAMPLE_TEMPERATURE)
        text = run.tokenizer.decode(ids)
        atomic_write_text(run_dir / "sample.txt", text + "\n")
        say(f"sample (temperature {SAMPLE_TEMPERATURE}):\n{text}")
    say(f"wrote {run_dir}/: checkpoint.npz, log.jsonl, loss.png, attention.png"
         + (", sample.txt" if run.task == "lm" else ""))
    return EXIT_OK


def default_prompt(tokenizer: CharTokenizer) -> str:
    """``"def "`` when the vocabulary has it (the corpus is Python), else its first character."""
    return "def " if all(ch in tokenizer.chars for ch in "def ") else tokenizer.chars[0]

"""What a run puts out: the files of its folder, its messages, its exit codes, and the one
error that means bad input.

The bottom of :mod:`numpy_transformer.runs`: the standard library only, so the command line
reads it before NumPy is loaded, and every other module of the package may import it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class UsageError(ValueError):
    """Bad input from the user: printed as one line, exit code 2."""


def say(*parts: object) -> None:
    """Print one message of the run on stdout, flushed."""
    print(*parts, flush=True)


def describe_os_error(e: OSError) -> str:
    """A failed read or write in one line: the file, then the system's reason."""
    reason = e.strerror or str(e)
    return f"{e.filename}: {reason}" if e.filename else reason


# --------------------------------------------------------------------------------------------
# Exit codes: the one list (every command's --help prints it)
# --------------------------------------------------------------------------------------------

EXIT_CODES = {
    0: "success (also: --resume of a run that had already finished, and train without --out "
       "whose folder holds that same run finished)",
    1: "training diverged: a non-finite loss, gradient or held-out loss (the step and tensor "
       "are named; the last good checkpoint is left untouched); gradcheck: a check failed; "
       "bench: a worker failed",
    2: "bad input: an option, a file of the wrong kind (missing; a folder, FIFO, device or "
       "socket where a file belongs, or a file where a folder belongs; binary or not UTF-8 "
       "where text belongs; too large), a run folder (or one in use), a checkpoint (truncated, "
       "tampered, non-finite, of a newer format), a size that cannot fit in memory; one line "
       "on stderr, no traceback, nothing overwritten",
    74: "a file of the right kind that could not be read or written (permission, read-only "
        "folder, full disk, size limit: sysexits' EX_IOERR), named with the system's reason; "
        "the previous checkpoint is left intact",
    130: "stopped by SIGINT (Ctrl-C): train after writing a checkpoint (--resume continues "
         "exactly); every command leaves no file half-written and no worker process behind",
    143: "stopped by SIGTERM, the same way",
}
EXIT_OK, EXIT_DIVERGED, EXIT_USAGE, EXIT_IO, EXIT_SIGINT, EXIT_SIGTERM = EXIT_CODES  # in order
EXIT_ON_SIGNAL = {signal.SIGINT: EXIT_SIGINT, signal.SIGTERM: EXIT_SIGTERM}  # 128 + signal


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM (``signum``), raised wherever the command was when it came.

    A ``KeyboardInterrupt``, so what cleans up after one (a temporary file removed, a worker
    process killed) does the same for both signals, and no ``except Exception`` takes it for
    an error of its own.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Within: the first SIGINT or SIGTERM raises :class:`Interrupted`, and the ones after it
    are ignored, so a second Ctrl-C cannot break off the clean-up the first one started.

    The training loop puts its own handler in place while it runs (a signal there ends the
    step in flight and saves, :mod:`numpy_transformer.runs.loop`); the previous handlers come
    back on the way out. Outside the main thread, where Python allows no handler, nothing
    changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, frame: object) -> None:
        for sig in EXIT_ON_SIGNAL:
            signal.signal(sig, signal.SIG_IGN)
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, handle) for sig in EXIT_ON_SIGNAL}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Within: SIGINT and SIGTERM wait (blocked for this thread) and arrive on the way out, so
    a few renames that only make sense together all happen."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, EXIT_ON_SIGNAL)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


# --------------------------------------------------------------------------------------------
# The files of a run folder
# --------------------------------------------------------------------------------------------

RUN_FILES = {  # every file a run writes into its folder, in the order it first writes them
    "config.json": "the format version, the model config and the training options (written "
                   "first)",
    "tokenizer.json": "the byte-level BPE, in the tokenizers package's format (the checkpoint "
                      "holds it too)",
    "checkpoint.npz": "weights, Adam moments, step, every RNG state (see checkpoint.py)",
    "log.jsonl": 'one JSON line per step {"step", "loss", "lr", "grad_norm", "tokens_per_s", '
                 '"time" (Unix seconds)}, per evaluation {"step", "val_loss", ["val_acc"], '
                 '["final"]} and every --stats-every N steps {"step", "tensor_stats": {name: '
                 '{"grad_norm", "update_ratio"}}}',
    "best.npz": "the checkpoint of the lowest held-out loss so far (its meta holds the loss); "
                "sample, eval and export take it with --best",
    "loss.png": "training and held-out loss, learning rate, gradient norm and clipping "
                "threshold against step",
    "stats.png": "each tensor's gradient norm and update-to-weight ratio, by layer",
    "attention.png": "every layer's attention weights on a held-out snippet, a panel per layer "
                     "and head, one colour scale",
    "sample.txt": "a sample from the final model",
    "best-before-final.npz": "the best.npz that the final evaluation replaced, when it fell "
                             "between two --eval-every steps: what --resume RUN --steps N puts "
                             "back, as the run of N steps makes no evaluation there",
}
CONFIG, TOKENIZER, CHECKPOINT, LOG, BEST, LOSS_PLOT, STATS_PLOT, ATTENTION_PLOT, SAMPLE, \
    BEST_BEFORE_FINAL = RUN_FILES  # their names
# train --tensorboard: the event files (tensorboardX names them so) in a folder of the run's
EVENTS_FOLDER, EVENT_FILES = "tensorboard", "events.out.tfevents.*"
REPORT_FILES = (LOSS_PLOT, STATS_PLOT, ATTENTION_PLOT, SAMPLE)  # after the last step (report.py)
# The files only some runs write: (option, the value of it that writes the file, who that is).
# An LSTM has no attention map; a synthetic task has no text to sample.
WRITTEN_ONLY_BY = {TOKENIZER: ("tokenizer", "bpe", "--tokenizer bpe"),
                   STATS_PLOT: ("stats_every", "N", "--stats-every N"),
                   BEST_BEFORE_FINAL: ("eval_every", "N", "a new best at a final evaluation "
                                       "between two --eval-every steps"),
                   ATTENTION_PLOT: ("model", "transformer", "Transformers"),
                   SAMPLE: ("task", "lm", "language models")}


def files_of(task: str, model: str, names: tuple[str, ...] = tuple(RUN_FILES)) -> tuple[str, ...]:
    """Those of ``names`` that a run of ``task`` and ``model`` writes (``WRITTEN_ONLY_BY``;
    the files of other options, tokenizer.json and stats.png, are left out)."""
    run = {"task": task, "model": model}
    return tuple(name for name in names if name not in WRITTEN_ONLY_BY
                 or run.get(WRITTEN_ONLY_BY[name][0]) == WRITTEN_ONLY_BY[name][1])


# --------------------------------------------------------------------------------------------
# Samples
# --------------------------------------------------------------------------------------------

# What a finished language model writes to sample.txt, and what `numpy-transformer sample` does
# unless told otherwise.
SAMPLE_PROMPT = "def "  # the embedded corpus is Python; a vocabulary without it starts elsewhere
SAMPLE_LENGTH, SAMPLE_TEMPERATURE = 300, 0.8
MAX_SAMPLE_LENGTH = 1_000_000  # sample --length: a few minutes of the char model, not days

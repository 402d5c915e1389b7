"""Training runs on disk: build a run from options, train it, checkpoint it, resume it exactly.

The command line (:mod:`numpy_transformer.cli`) parses arguments; everything a run *does*
lives here, so it can be driven from Python and tested without a subprocess.

A run folder holds::

    config.json      the model config and the training options (written first)
    checkpoint.npz   weights, Adam moments, step, every RNG state (see checkpoint.py)
    log.jsonl        one JSON line per step {"step", "loss", "lr", "grad_norm", "tokens_per_s"}
                     and per evaluation {"step", "val_loss", ["val_acc"], ["final"]}
    loss.png         training loss (and held-out loss) against step
    attention.png    last layer's attention weights on a held-out snippet, one panel per head
    sample.txt       for language models: a sample from the final model

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

import dataclasses
import json
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .checkpoint import (
    CheckpointError,
    atomic_write_text,
    dropout_layers,
    load_checkpoint,
    rng_states,
    save_checkpoint,
    set_rng_states,
)
from .data import (
    CharTokenizer,
    fingerprint,
    fixed_window_loss,
    get_batch,
    load_text,
    train_val_split,
    window_schedule,
)
from .functional.softmax import cross_entropy_forward
from .nn import DecoderLM, EncoderClassifier, EncoderDecoder, TransformerConfig
from .optim import Adam, AdamW, constant_lr, warmup_cosine
from .tasks import IGNORE_INDEX, copy_back_batch, reverse_batch, sort_batch
from .train import Batch, NonFiniteError, ProgressBar, Trainer

EXIT_OK, EXIT_DIVERGED, EXIT_USAGE = 0, 1, 2
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + signal number, as a shell
TASKS = ("lm", "sort", "copy", "reverse")
RUN_FILES = ("checkpoint.npz", "log.jsonl", "loss.png", "attention.png", "config.json",
             "sample.txt")
SAMPLE_LENGTH, SAMPLE_TEMPERATURE = 300, 0.8
COPY_SHIFT = 3  # the copy task predicts the digit 3 places back

# The chapter's character model and its training recipe. 1,500 steps of 0.1-0.15 s (float32,
# two cores, an otherwise idle machine) plus evaluation, plots and a sample: about four to five
# minutes. Measured under load: a step is ~0.45 s with one BLAS thread on a third of a core,
# i.e. ~0.15 s on a whole one. Lower it here if your machine is slower.
MODEL_DEFAULTS = {
    "lm": dict(width=84, heads=4, layers=2, ffn_width=168, max_len=100, norm="layernorm",
               activation="relu", positions="sinusoidal", norm_first=True, dropout=0.0,
               embed_scale=True),
    # The synthetic tasks: short digit sequences, a small model learns them in a minute.
    "task": dict(width=64, heads=4, layers=2, ffn_width=128, max_len=10, norm="layernorm",
                 activation="relu", positions="sinusoidal", norm_first=True, dropout=0.0,
                 embed_scale=False),
}
TRAIN_DEFAULTS = {
    "lm": dict(steps=1500, batch=64, lr=2e-3, optimizer="adam", weight_decay=0.0, warmup=0,
               schedule="constant", clip=1.0, seed=0, eval_every=250, save_every=100,
               text=None),
    "task": dict(steps=600, batch=64, lr=1e-3, optimizer="adam", weight_decay=0.0, warmup=0,
                 schedule="constant", clip=1.0, seed=0, eval_every=200, save_every=100,
                 text=None),
}
TRAIN_KEYS = tuple(TRAIN_DEFAULTS["lm"])
MODEL_KEYS = tuple(MODEL_DEFAULTS["lm"]) + ("backend", "dtype")


class UsageError(ValueError):
    """Bad input from the user: printed as one line, exit code 2."""


def _say(*parts: object) -> None:
    print(*parts, flush=True)


# --------------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------------

def resolve_options(task: str, given: dict) -> tuple[dict, dict]:
    """Merge the options the user gave (``None`` = not given) into the task's defaults.

    Returns ``(config_fields, train_options)``: keyword arguments of TransformerConfig
    (without ``vocab``, which the data decides) and the training options, ``task`` included.
    """
    if task not in TASKS:
        raise UsageError(f"--task must be one of {TASKS}, got {task!r}")
    kind = "lm" if task == "lm" else "task"
    model = dict(MODEL_DEFAULTS[kind], backend="numba", dtype="float32")
    if task == "reverse":
        model["max_len"] = 8
    train = dict(TRAIN_DEFAULTS[kind])
    for key, value in given.items():
        if value is None:
            continue
        if key in model:
            model[key] = value
        elif key in train:
            train[key] = value
        else:
            raise UsageError(f"unknown option {key!r}")
    if task != "lm" and train["text"] is not None:
        raise UsageError(f"--text is for --task lm; the {task} task makes its own data")
    if train["schedule"] == "cosine" and train["warmup"] >= train["steps"]:
        raise UsageError(f"--warmup {train['warmup']} must be smaller than --steps "
                         f"{train['steps']} for the cosine schedule")
    if task == "copy" and model["max_len"] <= COPY_SHIFT:
        raise UsageError(f"the copy task predicts the digit {COPY_SHIFT} places back: --context "
                         f"must exceed {COPY_SHIFT}, got {model['max_len']}")
    if train["text"] is not None:
        train["text"] = os.path.abspath(train["text"])  # resume works from any folder
    train["task"] = task
    return model, train


# --------------------------------------------------------------------------------------------
# A run in memory: data, model, optimizer, generators
# --------------------------------------------------------------------------------------------

class Run:
    """Everything one training run needs in memory.

    Parameters
    ----------
    config_fields : dict
        TransformerConfig keywords without ``vocab`` (and ``num_classes``, ``seed``).
    options : dict
        Training options, including ``task``.
    """

    def __init__(self, config_fields: dict, options: dict) -> None:
        self.options = options
        self.task = options["task"]
        seed = options["seed"]
        self.tokenizer: CharTokenizer | None = None
        self.length = config_fields["max_len"]  # T: LM window; task sequence length
        extra: dict = {}
        if self.task == "lm":
            text = load_text(options["text"]) if options["text"] else _embedded_corpus()
            self.tokenizer = CharTokenizer(text)
            ids = self.tokenizer.encode(text)
            if len(ids) < 20:
                raise UsageError(f"the text has {len(ids)} characters; a language model needs "
                                 f"more to split into training and held-out parts")
            self.train_ids, self.val_ids = train_val_split(ids, 0.9)
            context = config_fields["max_len"]
            if len(self.train_ids) < context + 1:
                raise UsageError(f"the training part of the text has {len(self.train_ids)} "
                                 f"characters, fewer than one window of --context {context} + 1")
            vocab = self.tokenizer.vocab_size
            # Drawn up front from its own generator: building the model cannot shift it.
            self.schedule = window_schedule(len(self.train_ids), context, options["batch"],
                                            options["steps"], np.random.default_rng(seed))
            self.data_fingerprint = fingerprint(ids, self.schedule)
            self.data_rng = None
        else:
            vocab = 11 if self.task == "reverse" else 10  # digits, plus BOS for reverse
            if self.task == "sort":
                extra["num_classes"] = 10
            self.data_rng = np.random.default_rng([seed, 1])  # one batch per step
            self.eval_set = self._task_batch(512, np.random.default_rng([seed, 2]))
            self.data_fingerprint = None
        try:
            self.config = TransformerConfig(vocab=vocab, seed=seed, **config_fields,
                                            **extra).validate()
        except ValueError as e:
            raise UsageError(str(e)) from None
        model_class = {"lm": DecoderLM, "copy": DecoderLM, "sort": EncoderClassifier,
                       "reverse": EncoderDecoder}[self.task]
        self.model = model_class(self.config)
        opt_class = AdamW if options["optimizer"] == "adamw" else Adam
        self.optimizer = opt_class(lr=options["lr"], weight_decay=options["weight_decay"])
        self.trainer = Trainer(self.model, self.optimizer, self.lr_schedule(),
                               clip=options["clip"] or None)
        self.sample_rng = np.random.default_rng([seed, 3])

    # ---------------------------------------------------------------- pieces
    def lr_schedule(self) -> Callable[[int], float]:
        o = self.options
        if o["schedule"] == "cosine":
            return warmup_cosine(o["lr"], o["warmup"], o["steps"])
        if o["warmup"] == 0:
            return constant_lr(o["lr"])
        lr, warmup = o["lr"], o["warmup"]
        return lambda step: lr * min(1.0, step / warmup)  # linear warmup, then constant

    def generators(self) -> dict[str, np.random.Generator]:
        """Every generator whose state a checkpoint must carry, by name."""
        gens = {f"dropout.{name}": layer.rng for name, layer in
                dropout_layers(self.model).items()}
        gens["sample"] = self.sample_rng
        if self.data_rng is not None:
            gens["data"] = self.data_rng
        return gens

    def _task_batch(self, n: int, rng: np.random.Generator) -> Batch:
        length = self.length
        if self.task == "sort":
            x, y = sort_batch(n, rng, length=length)
            return Batch((x,), y)
        if self.task == "copy":
            x, y, mask = copy_back_batch(n, rng, length=length, shift=COPY_SHIFT)
            return Batch((x,), y, mask)
        src, tgt_in, tgt_out = reverse_batch(n, rng, length=length)
        return Batch((src, tgt_in), tgt_out)

    def batch(self, index: int) -> Batch:
        """The batch of update ``index + 1`` (index = updates made so far)."""
        if self.task == "lm":
            x, y = get_batch(self.train_ids, self.schedule[index], self.config.max_len)
            return Batch((x,), y)
        return self._task_batch(self.options["batch"], self.data_rng)

    def evaluate(self) -> dict:
        """Held-out loss (fixed windows for the LM; a fixed set for the tasks, plus accuracy)."""
        self.model.eval()
        try:
            if self.task == "lm":
                loss = fixed_window_loss(self.model.forward, self.val_ids, self.config.max_len)
                return {"val_loss": float(loss)}
            b = self.eval_set
            logits = self.model.forward(*b.inputs)
            loss, _ = cross_entropy_forward(logits, b.targets, mask=b.mask)
            counted = b.targets != IGNORE_INDEX if b.mask is None else b.mask
            acc = float((logits.argmax(-1) == b.targets)[counted].mean())
            return {"val_loss": float(loss), "val_acc": acc}
        finally:
            self.model.train()

    def meta(self, finished: bool) -> dict:
        return {"finished": finished, "model": type(self.model).__name__,
                "data_fingerprint": self.data_fingerprint}

    def description(self) -> dict:
        """What config.json holds; two runs with equal descriptions are the same run."""
        return {"config": dataclasses.asdict(self.config), "options": self.options}

    # ---------------------------------------------------------------- checkpoints
    def save(self, path: Path, finished: bool = False) -> None:
        save_checkpoint(path, step=self.trainer.step_count, model=self.model,
                        optimizer=self.optimizer, rng=rng_states(self.generators()),
                        config=dataclasses.asdict(self.config), options=self.options,
                        tokenizer=self.tokenizer.to_dict() if self.tokenizer else None,
                        meta=self.meta(finished))

    def restore(self, ckpt, path: Path) -> None:
        """Load a checkpoint's weights, moments, step and generators into this run.

        Raises
        ------
        CheckpointError
            If anything in the checkpoint does not fit this run.
        """
        own = {n: p for n, p, _ in self.model.named_parameters()}
        for name, a in ckpt.params.items():
            if name in own and a.dtype != own[name].dtype:
                raise CheckpointError(f"{path}: param.{name} is {a.dtype} but the config says "
                                      f"{self.config.dtype}")
        try:
            self.model.load_state_dict(ckpt.params)
        except ValueError as e:
            raise CheckpointError(f"{path}: the weights do not match the model of its config: "
                                  f"{e}") from None
        if ckpt.optimizer["kind"] != type(self.optimizer).__name__:
            raise CheckpointError(f"{path}: optimizer {ckpt.optimizer['kind']} in the "
                                  f"checkpoint, {type(self.optimizer).__name__} in the options")
        try:
            self.optimizer.load_state_dict(ckpt.optimizer_state())
        except ValueError as e:
            raise CheckpointError(f"{path}: bad optimizer state: {e}") from None
        if ckpt.step != self.optimizer.t or not 0 <= ckpt.step <= self.options["steps"]:
            raise CheckpointError(f"{path}: step {ckpt.step} does not fit optimizer step "
                                  f"{self.optimizer.t} and {self.options['steps']} steps")
        set_rng_states(self.generators(), ckpt.rng, source=str(path))
        self.trainer.step_count = ckpt.step


def _embedded_corpus() -> str:
    from .corpus import load_corpus

    return load_corpus()


def run_from_checkpoint(ckpt, path: Path) -> Run:
    """Rebuild the :class:`Run` a checkpoint was written by and load the checkpoint into it."""
    config, options = dict(ckpt.config), dict(ckpt.options)
    fields = {k: config.get(k) for k in MODEL_KEYS}
    if set(MODEL_KEYS) - set(config) or set(TRAIN_KEYS) | {"task"} != set(options):
        raise CheckpointError(f"{path}: config or options in the checkpoint are incomplete "
                              f"or from another version")
    try:
        run = Run(fields, options)
    except (ValueError, TypeError, KeyError) as e:  # e.g. the --text file is gone
        raise CheckpointError(f"{path}: cannot rebuild the run: {e}") from None
    same_tokens = ckpt.tokenizer == (run.tokenizer.to_dict() if run.tokenizer else None)
    if run.data_fingerprint != ckpt.meta.get("data_fingerprint") or not same_tokens:
        what = options["text"] or "the embedded corpus"
        raise CheckpointError(f"{path}: the training data changed since the checkpoint was "
                              f"written ({what}); cannot resume exactly")
    if dataclasses.asdict(run.config) != config:
        built = dataclasses.asdict(run.config)
        diff = sorted(k for k in set(built) | set(config) if built.get(k) != config.get(k))
        raise CheckpointError(f"{path}: the config in the checkpoint does not match the model "
                              f"it describes (differs in {diff})")
    run.restore(ckpt, path)
    return run


def model_from_checkpoint(path: Path):
    """``(model, tokenizer or None, checkpoint)`` of a checkpoint, for sampling."""
    ckpt = load_checkpoint(path)
    try:
        config = TransformerConfig(**ckpt.config).validate()
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: bad model config: {e}") from None
    model_class = {"DecoderLM": DecoderLM, "EncoderClassifier": EncoderClassifier,
                   "EncoderDecoder": EncoderDecoder}.get(ckpt.meta.get("model"))
    if model_class is None:
        raise CheckpointError(f"{path}: unknown model kind {ckpt.meta.get('model')!r}")
    model = model_class(config)
    try:
        model.load_state_dict(ckpt.params)
    except ValueError as e:
        raise CheckpointError(f"{path}: the weights do not match the model of its config: "
                              f"{e}") from None
    tokenizer = None
    if ckpt.tokenizer is not None:
        try:
            tokenizer = CharTokenizer.from_dict(ckpt.tokenizer)
        except ValueError as e:
            raise CheckpointError(f"{path}: bad tokenizer: {e}") from None
    return model, tokenizer, ckpt


def checkpoint_path(target: str | Path) -> Path:
    """A run folder means its ``checkpoint.npz``; a file is taken as it is."""
    target = Path(target)
    return target / "checkpoint.npz" if target.is_dir() else target


# --------------------------------------------------------------------------------------------
# The run folder
# --------------------------------------------------------------------------------------------

def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _differences(a: dict, b: dict) -> list[str]:
    keys = sorted(set(a.get("config", {})) | set(a.get("options", {})) |
                  set(b.get("config", {})) | set(b.get("options", {})))
    return [k for k in keys
            if a.get("config", {}).get(k) != b.get("config", {}).get(k)
            or a.get("options", {}).get(k) != b.get("options", {}).get(k)]


def prepare_run_dir(out: str | None, task: str, description: dict, force: bool) -> Path:
    """Choose and create the run folder; refuse to overwrite anything without ``force``.

    * No ``--out``: ``runs/char-lm`` (``runs/<task>`` for the tasks); if that folder is
      already in use, a fresh ``runs/char-lm-YYYYmmdd-HHMMSS`` beside it (said on stdout).
    * ``--out DIR`` that is not empty: refused (exit 2), the message says whether it holds a
      different run or this same one (then: resume it, or pass ``--force``).
    * ``--force``: our files in the folder are removed first; other files are left alone.
    """
    default = Path("runs") / ("char-lm" if task == "lm" else task)
    path = Path(out) if out is not None else default
    if path.exists() and not path.is_dir():
        raise UsageError(f"run folder {path} exists and is not a folder")
    if path.is_dir() and any(path.iterdir()):
        if force:
            for name in RUN_FILES:
                (path / name).unlink(missing_ok=True)
        elif out is None:
            stamp = f"{default.name}-{time.strftime('%Y%m%d-%H%M%S')}"
            path, n = default.with_name(stamp), 1
            while path.exists():  # two runs in one second
                n += 1
                path = default.with_name(f"{stamp}-{n}")
            _say(f"{default} is in use; this run goes to {path}")
        else:
            held = _read_json(path / "config.json")
            if held is None:
                raise UsageError(f"run folder {path} is not empty and holds no run; choose "
                                 f"another --out or pass --force")
            diff = _differences(held, description)
            if diff:
                raise UsageError(f"run folder {path} holds a different run (differs in "
                                 f"{', '.join(diff)}); choose another --out or pass --force")
            try:
                held_ckpt = load_checkpoint(path / "checkpoint.npz")
                finished, step = held_ckpt.meta.get("finished"), held_ckpt.step
            except CheckpointError:
                finished, step = False, None
            if finished:
                raise UsageError(f"run folder {path} already holds this run, finished; pass "
                                 f"--force to train it again or choose another --out")
            raise UsageError(f"run folder {path} already holds this run, stopped at step "
                             f"{step}; continue it with 'numpy-transformer train --resume "
                             f"{path}' or pass --force to start over")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-test.")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"cannot write to run folder {path}: {e.strerror or e}") from None
    return path


def read_log(path: Path, upto: int | None = None) -> list[dict]:
    """The records of ``log.jsonl`` (those with ``step <= upto`` when given)."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill
        if isinstance(r, dict) and (upto is None or r.get("step", 0) <= upto):
            records.append(r)
    return records


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
    _say(f"run folder {run_dir}")
    _say(f"{type(run.model).__name__}: {run.model.num_parameters():,} parameters, width "
         f"{c.width}, {c.heads} heads, {c.layers} layers, FFN {c.ffn_width} {c.activation}, "
         f"{c.positions} positions, context {c.max_len}, {c.dtype}, {c.backend} attention")
    if run.tokenizer is not None:
        source = options["text"] or "the embedded corpus"
        _say(f"data: {source}, {len(run.train_ids) + len(run.val_ids):,} characters, "
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
        _say(f"{run_dir} already finished its {steps} steps; nothing to resume")
        return EXIT_OK
    # Forget what was logged after the checkpoint: those steps are recomputed, identically.
    records = [r for r in read_log(run_dir / "log.jsonl", upto=ckpt.step) if not r.get("final")]
    atomic_write_text(run_dir / "log.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    if finished:  # stopped while writing the report: write it again (same sample generator)
        _say(f"{run_dir} finished training; writing its report")
        return report(run, run_dir)
    _say(f"resuming {run_dir} at step {ckpt.step} of {steps}")
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
    _say(line)
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
        _say(f"sample (temperature {SAMPLE_TEMPERATURE}):\n{text}")
    _say(f"wrote {run_dir}/: checkpoint.npz, log.jsonl, loss.png, attention.png"
         + (", sample.txt" if run.task == "lm" else ""))
    return EXIT_OK


def default_prompt(tokenizer: CharTokenizer) -> str:
    """``"def "`` when the vocabulary has it (the corpus is Python), else its first character."""
    return "def " if all(ch in tokenizer.chars for ch in "def ") else tokenizer.chars[0]

"""The ``numpy-transformer`` command: train, sample, gradcheck, export, bench.

``numpy-transformer train`` with no arguments trains the chapter's character model (width 84,
4 heads, 2 layers, FFN 168 ReLU, sinusoidal positions, scaled embeddings, context 100, batch
64, Adam lr 2e-3, clipping at 1.0, float32) on the embedded corpus in about five minutes on
two cores, and leaves ``runs/char-lm/`` with a checkpoint, the loss log, two plots and a
sample. ``numpy-transformer train --model lstm`` trains the LSTM of about the same size
(embedding 85, one layer of 128: 132,336 parameters at the chapter's vocabulary of 104) with
the same recipe into ``runs/char-lstm/``: the same files but the attention map, which an
LSTM does not have. ``numpy-transformer sample RUN_DIR`` continues a prompt with either.
``python -m numpy_transformer`` is the same command.

Exit codes
----------
0    success (also: ``--resume`` of a run that already finished)
1    training diverged: a non-finite loss or gradient, or weights too large to compute with
     (the step and tensor are named; the last good checkpoint, always finite, is left
     untouched); ``gradcheck``: a check failed; ``bench``: a benchmark's worker failed
2    bad input: an option, a file (a folder, FIFO or device where a file belongs is named for
     what it is), a run folder (also: one another process is training in), a checkpoint
     (truncated, tampered, non-finite), or sizes that cannot fit in memory. One line on
     stderr, no traceback, nothing overwritten (unless ``--force``)
74   a file could not be read or written (sysexits' EX_IOERR): permission denied, a read-only
     folder, a full disk, a file-size limit. The previous checkpoint is left intact
130  training stopped by SIGINT (Ctrl-C), 143 by SIGTERM: a checkpoint was written first;
     ``numpy-transformer train --resume RUN_DIR`` continues exactly where it stopped

Limits
------
Before anything is allocated, the memory a run needs (weights, gradients, Adam's moments, a
step's activations, the window schedule: ``numpy_transformer/memory.py``) is compared with the
memory available; a run that cannot fit is refused naming the option. ``sample --length`` is
at most 1,000,000. A run folder is held by one process at a time (its ``.lock`` file).
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import textwrap

from ._version import __version__
from .allocator import reuse_freed_memory
from .config import (
    ACTIVATIONS,
    BACKENDS,
    BENCH_CONFIGS,
    DTYPES,
    EXPORT_FORMATS,
    NORMS,
    POSITIONS,
)
from .runs.options import (
    COPY_SHIFT,
    DEFAULT_MODEL,
    DEFAULT_TASK,
    EXIT_DIVERGED,
    EXIT_IO,
    EXIT_OK,
    EXIT_ON_SIGNAL,
    EXIT_USAGE,
    LENGTH,
    MAX_SAMPLE_LENGTH,
    MODEL_DEFAULTS,
    MODELS,
    NONNEG_INT,
    OPTIMIZERS,
    OPTION_KEYS,
    POSITIVE,
    POSITIVE_INT,
    REVERSE_LENGTH,
    RUN_FILES,
    SAMPLE_LENGTH,
    SAMPLE_PROMPT,
    SAMPLE_TEMPERATURE,
    SCHEDULES,
    SHARE,
    TASKS,
    TRAIN_DEFAULTS,
    TRAIN_NUMBERS,
    WRITTEN_ONLY_BY,
    Rule,
    UsageError,
    default_run_folder,
    describe_os_error,
    flag,
    parse_number,
    resolve_options,
)
from .threads import set_blas_threads

# Everything else this command runs (NumPy, numba, matplotlib, the run package) is imported
# inside the command that needs it: --help and a bad option answer before any of it loads.

PROG = "numpy-transformer"


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error instead of usage + error."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Let "--lr -1e-3" reach the value check ("expected a positive number") instead of
        # reading "-1e-3" as an option: argparse's own pattern has no exponents.
        self._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$", re.I)

    def error(self, message: str) -> None:
        print(f"{self.prog}: error: {message} (see '{self.prog} --help')", file=sys.stderr)
        sys.exit(EXIT_USAGE)


# --------------------------------------------------------------------------------------------
# Value types: each names what it expected
# --------------------------------------------------------------------------------------------

def number(rule: Rule):
    """The argparse type of a numeric option: :func:`~.runs.options.parse_number` of ``rule``."""
    def parse(text: str) -> float:
        try:
            return parse_number(rule, text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def option(key: str):
    """The argparse type of the train option ``key``, from its rule in ``TRAIN_NUMBERS``."""
    return number(TRAIN_NUMBERS[key])


# --------------------------------------------------------------------------------------------
# The parser
# --------------------------------------------------------------------------------------------

LM = {**MODEL_DEFAULTS["lm"], **TRAIN_DEFAULTS["lm"]}  # the defaults the help shows
LSTM = MODEL_DEFAULTS["lstm"]
TASK = {**MODEL_DEFAULTS["task"], **TRAIN_DEFAULTS["task"]}


def default(key: str) -> str:
    """``[value]``: the language model's default of option ``key``, for a help line (with the
    LSTM's, where it has the option and its default differs)."""
    if key in LSTM and LSTM[key] != LM.get(key, LSTM[key]):
        return f"[{LM[key]}; --model lstm: {LSTM[key]}]"
    return f"[{LM[key] if key in LM else LSTM[key]}]"


TRAIN_DESCRIPTION = "Train a Transformer or an LSTM and write a run folder:\n" + textwrap.fill(
    ", ".join(f"{name} ({WRITTEN_ONLY_BY[name][2]} only)" if name in WRITTEN_ONLY_BY else name
              for name in RUN_FILES) + ".", width=80)
TRAIN_EPILOG = """\
examples:
  numpy-transformer train                      # the chapter's char model, ~5 min, runs/char-lm
  numpy-transformer train --text notes.txt --steps 3000 --out runs/notes
  numpy-transformer train --model lstm         # the LSTM of the same size, runs/char-lstm
  numpy-transformer train --task sort --steps 300
  numpy-transformer train --width 16 --heads 2 --layers 1 --ffn-width 32 --context 32 \\
      --steps 40 --out runs/tiny
  numpy-transformer train --resume runs/tiny   # after Ctrl-C: continues bit for bit

""" + textwrap.fill(
    "Defaults in brackets are the language model's; the synthetic tasks default to width "
    f"{TASK['width']}, FFN {TASK['ffn_width']}, context {TASK['max_len']} ({REVERSE_LENGTH} "
    f"for reverse), {TASK['steps']} steps, lr {TASK['lr']}. Ctrl-C (SIGINT) or SIGTERM writes "
    "a checkpoint and exits with 130 / 143; --resume continues exactly. Sizes that cannot fit "
    "in the memory available are refused before anything is allocated.", width=90) + """

exit codes:
  0    finished (or --resume of a finished run)
  1    diverged: a non-finite loss, gradient or held-out loss; the last good checkpoint is kept
  2    bad input: an option, a file, a run folder (or one in use), a checkpoint, a size that
       cannot fit in memory
  74   a file could not be read or written (permission, read-only, disk full, size limit);
       the previous checkpoint is left intact
  130  stopped by Ctrl-C (SIGINT), 143 by SIGTERM, after writing a checkpoint
"""


def build_parser() -> Parser:
    parser = Parser(prog=PROG, description="A Transformer written from scratch in NumPy:\n"
                    "train one, sample from it, check its gradients, time it.",
                    epilog="example: numpy-transformer train   (then: numpy-transformer "
                    "sample runs/char-lm --prompt 'def ')\n\nRun '%(prog)s COMMAND --help' "
                    "for each command's options.\n\nexit codes: 0 success, 1 training "
                    "diverged, 2 bad input (one line on stderr),\n74 a file could not be read "
                    "or written, 130 / 143 stopped by SIGINT / SIGTERM.",
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    raw = argparse.RawDescriptionHelpFormatter

    # The train options' argparse default is None, "not given": resolve_options fills in the
    # task's own defaults, and --resume refuses any option that was given.
    t = sub.add_parser("train", help="train a model (default: the char LM, ~5 minutes)",
                       description=TRAIN_DESCRIPTION, epilog=TRAIN_EPILOG, formatter_class=raw)
    g = t.add_argument_group("data")
    g.add_argument("--task", choices=TASKS, default=DEFAULT_TASK,
                   help="lm: next-character model (DecoderLM, or LSTMLM with --model "
                   "lstm); sort (EncoderClassifier), "
                   f"copy (DecoderLM, digit {COPY_SHIFT} back), reverse (EncoderDecoder) "
                   f"[{DEFAULT_TASK}]")
    g.add_argument("--text", metavar="FILE", help="UTF-8 text to train the LM on "
                   "[the embedded corpus: this library's own source]")
    g = t.add_argument_group("model")
    g.add_argument("--model", choices=MODELS, help="the language model: a Transformer "
                   f"(DecoderLM) or an LSTM (LSTMLM); --task lm only [{DEFAULT_MODEL}]")
    g.add_argument("--layers", type=option("layers"),
                   help=f"Transformer blocks, or stacked LSTM layers {default('layers')}")
    g.add_argument("--context", type=option("max_len"), dest="max_len", metavar="T",
                   help="window length T = max_len, the size of a Transformer's position "
                   f"table {default('max_len')}")
    g.add_argument("--dtype", choices=DTYPES, help=default("dtype"))
    g.add_argument("--backend", choices=BACKENDS,
                   help="numpy: the readable NumPy references; numba: the fused kernels "
                        f"(attention, norms, activations, loss, LSTM recurrence) "
                        f"{default('backend')}")
    g = t.add_argument_group(f"Transformer (--model {DEFAULT_MODEL})")
    g.add_argument("--width", type=option("width"), help=f"residual width C {default('width')}")
    g.add_argument("--heads", type=option("heads"),
                   help=f"attention heads, must divide width {default('heads')}")
    g.add_argument("--ffn-width", type=option("ffn_width"),
                   help=f"feed-forward hidden width {default('ffn_width')}")
    g.add_argument("--norm", choices=NORMS, help=default("norm"))
    g.add_argument("--activation", choices=ACTIVATIONS, help=default("activation"))
    g.add_argument("--positions", choices=POSITIONS, help=default("positions"))
    g.add_argument("--post-ln", dest="norm_first", action="store_const", const=False,
                   help="post-LN blocks as Vaswani et al. "
                   f"[{'pre-LN' if LM['norm_first'] else 'post-LN'}]")
    g.add_argument("--dropout", type=option("dropout"), help=default("dropout"))
    on_off = argparse.BooleanOptionalAction
    g.add_argument("--embed-scale", action=on_off, help="multiply the token embeddings by "
                   "sqrt(width), as Vaswani et al. [on for --task lm, off for the tasks]")
    g.add_argument("--tie-embeddings", action=on_off, help="the output head reuses the token "
                   "embedding table, as GPT-2 [off]")
    g.add_argument("--bias", action=on_off, help="every linear layer adds a bias; --no-bias "
                   "drops them all, as LLaMA [on]")
    g = t.add_argument_group("LSTM (--model lstm)")
    g.add_argument("--hidden", type=option("hidden"),
                   help=f"width H of the hidden and cell states {default('hidden')}")
    g.add_argument("--embed", type=option("embed"), help="width E of the token embedding; "
                   f"the default lands near the Transformer's size {default('embed')}")
    g = t.add_argument_group("optimisation")
    g.add_argument("--optimizer", choices=OPTIMIZERS, help=default("optimizer"))
    g.add_argument("--lr", type=option("lr"), help=f"peak learning rate {default('lr')}")
    g.add_argument("--weight-decay", type=option("weight_decay"), help=default("weight_decay"))
    g.add_argument("--warmup", type=option("warmup"),
                   help=f"linear warmup steps {default('warmup')}")
    g.add_argument("--schedule", choices=SCHEDULES, help=default("schedule"))
    g.add_argument("--clip", type=option("clip"),
                   help=f"global gradient-norm clip, 0 = off {default('clip')}")
    g.add_argument("--batch", type=option("batch"), help=f"windows per step {default('batch')}")
    g.add_argument("--steps", type=option("steps"), help=f"updates {default('steps')}")
    g.add_argument("--seed", type=option("seed"), help="fixes the weights, the data order and "
                   f"every dropout mask {default('seed')}")
    g.add_argument("--eval-every", type=option("eval_every"), help="held-out loss every N steps, "
                   f"0 = only at the end {default('eval_every')}")
    g.add_argument("--save-every", type=option("save_every"), help="checkpoint every N steps, "
                   f"0 = only at the end {default('save_every')}")
    g = t.add_argument_group("run folder")
    g.add_argument("--out", metavar="RUN_DIR", help="where the run goes "
                   f"[{default_run_folder('lm')}, {default_run_folder('lm', 'lstm')} or "
                   f"{default_run_folder('TASK')}; if in use, a new folder with a timestamp "
                   "suffix]")
    g.add_argument("--force", action="store_true",
                   help="reuse a non-empty --out (our files in it are replaced)")
    g.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR "
                   "exactly where its checkpoint left it (takes no model/optimiser options)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")

    s = sub.add_parser("sample", help="generate text from a trained language model",
                       description="Continue a prompt with a trained language model, a "
                       "Transformer (with its key/value cache) or an LSTM (carrying its "
                       "state).",
                       epilog="example:\n  numpy-transformer sample runs/char-lm --prompt "
                       "'def ' --length 400 --temperature 0.7 --top-k 20", formatter_class=raw)
    s.add_argument("run", nargs="?", default=str(default_run_folder("lm")),
                   metavar="RUN_DIR|CHECKPOINT",
                   help="a run folder or a checkpoint .npz [%(default)s]")
    s.add_argument("--prompt", help="text to continue; every character must be in the "
                   f"model's vocabulary [{SAMPLE_PROMPT!r}]")
    s.add_argument("--length", type=number(LENGTH), default=SAMPLE_LENGTH,
                   help=f"characters to generate, at most {MAX_SAMPLE_LENGTH:,} [%(default)s]")
    s.add_argument("--temperature", type=number(POSITIVE), default=SAMPLE_TEMPERATURE,
                   help="divides the logits; < 1 is more conservative [%(default)s]")
    s.add_argument("--top-k", type=number(POSITIVE_INT), help="keep the k most likely tokens")
    s.add_argument("--top-p", type=number(SHARE), help="keep the smallest set of tokens with "
                   "this much probability (nucleus sampling)")
    s.add_argument("--greedy", action="store_true", help="always take the most likely token")
    s.add_argument("--seed", type=number(NONNEG_INT), default=0, help="sampling seed [%(default)s]")

    c = sub.add_parser("gradcheck", help="check every hand-written backward by finite "
                       "differences", description="Print the gradient-check tables: each "
                       "named tensor's worst error of the backward against central "
                       "differences in float64. Exit code 1 if any check fails.",
                       epilog="examples:\n  numpy-transformer gradcheck\n  "
                       "numpy-transformer gradcheck --list\n  numpy-transformer gradcheck "
                       "NAME [NAME ...] --tol 1e-7", formatter_class=raw)
    c.add_argument("names", nargs="*", metavar="NAME", help="pieces to check [all]; see --list")
    c.add_argument("--tol", type=number(POSITIVE), default=1e-6,
                   help="largest relative error accepted [%(default)g]")
    c.add_argument("--list", action="store_true", help="list the names and exit")

    e = sub.add_parser("export", help="write a trained model as safetensors (for PyTorch) or "
                       "a Hugging Face directory", description="Write a run's model where other "
                       "tools read it (numpy_transformer.export). safetensors: model.safetensors "
                       "(the PyTorch twin's names and layouts; config and tokenizer in its "
                       "metadata) and optimizer.safetensors (Adam's state). hf: a transformers "
                       "directory, for a DecoderLM of GPT-2's or LLaMA's shape. Read them back "
                       "with numpy_transformer.export.load_safetensors / load_hf.",
                       epilog="examples:\n  numpy-transformer export runs/char-lm\n  "
                       "torchrun --nproc_per_node 2 examples/continue_ddp.py "
                       "runs/char-lm/safetensors\n  numpy-transformer export runs/gpt --format "
                       "hf --out gpt-hf", formatter_class=raw)
    e.add_argument("run", metavar="RUN_DIR|CHECKPOINT", help="a run folder or a checkpoint .npz")
    e.add_argument("--format", choices=EXPORT_FORMATS, default=EXPORT_FORMATS[0],
                   help=f"[{EXPORT_FORMATS[0]}]")
    e.add_argument("--out", metavar="DIR", help="where the files go [RUN_DIR/FORMAT]")

    b = sub.add_parser("bench", help="a training step against PyTorch, the cold compile, the "
                       "sgemm ceiling", description="Time a training step of ours (numba "
                       "backend) and of PyTorch eager side by side, in two worker processes "
                       "asked in turn; the first step on an empty compile cache; the machine's "
                       "float32 matrix-product rate as the ceiling (numpy_transformer.bench). "
                       "The long scripts are in the repository's benchmarks/ folder.",
                       epilog="examples:\n  numpy-transformer bench --quick\n  "
                       "numpy-transformer bench --config wide --threads 2", formatter_class=raw)
    b.add_argument("--config", choices=BENCH_CONFIGS, default=BENCH_CONFIGS[0],
                   help="chapter: the chapter's char model, batch 64 x 100; small, wide (6 "
                   "layers, width 384, 16 x 256), long (T = 1024), lstm (the chapter's LSTM) "
                   "[%(default)s]")
    b.add_argument("--threads", type=number(POSITIVE_INT),
                   help="threads of both frameworks [the cores available]")
    b.add_argument("--quick", action="store_true", help="a few steps: that it runs, at a glance")
    return parser


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------

def cmd_train(args: argparse.Namespace) -> int:
    set_blas_threads(1)  # the numba kernels use the cores; see numpy_transformer/threads.py
    reuse_freed_memory()  # no fresh pages for every step's buffers; see allocator.py
    given = {k: getattr(args, k) for k in OPTION_KEYS}
    if args.resume is not None:
        extra = [flag(k) for k, v in given.items() if v is not None]
        extra += [flag for flag, on in (("--task", args.task != DEFAULT_TASK),
                                        ("--out", args.out), ("--force", args.force)) if on]
        if extra:
            raise UsageError(f"--resume continues a run exactly as it was configured; drop "
                             f"{' '.join(extra)}")
        from .runs.loop import resume_run

        return resume_run(args.resume, progress=not args.quiet)
    config_fields, options = resolve_options(args.task, given)
    from .runs.loop import start_run

    return start_run(config_fields, options, args.out, args.force, progress=not args.quiet)


def cmd_sample(args: argparse.Namespace) -> int:
    from .runs.sample import sample_checkpoint

    set_blas_threads(1)
    text = sample_checkpoint(args.run, args.prompt, args.length, args.seed,
                             temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                             greedy=args.greedy)
    print(text, flush=True)
    return EXIT_OK


def cmd_gradcheck(args: argparse.Namespace) -> int:
    from . import gradcheck_tables as tables

    if args.list:
        print("\n".join(tables.SECTIONS))
        return EXIT_OK
    unknown = [n for n in args.names if n not in tables.SECTIONS]
    if unknown:
        raise UsageError(f"unknown gradcheck name(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(tables.SECTIONS)}")
    if tables.print_tables(args.names or None, tol=args.tol):
        return EXIT_OK
    print(f"{PROG}: gradient checks FAILED (tolerance {args.tol:g})", file=sys.stderr)
    return EXIT_DIVERGED


def cmd_export(args: argparse.Namespace) -> int:
    from .runs.export import export_checkpoint

    written = export_checkpoint(args.run, args.format, args.out)
    print(f"wrote {', '.join(str(p) for p in written)}", flush=True)
    return EXIT_OK


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench.summary import run

    try:
        run(args.config, None if args.threads is None else int(args.threads), quick=args.quick)
    except RuntimeError as e:  # a worker process failed: its own traceback is on stderr
        print(f"{PROG}: bench failed: {str(e).splitlines()[0]}", file=sys.stderr, flush=True)
        return EXIT_DIVERGED
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``numpy-transformer`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    command = {"train": cmd_train, "sample": cmd_sample, "gradcheck": cmd_gradcheck,
               "bench": cmd_bench, "export": cmd_export}[args.command]
    try:
        return command(args)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr, flush=True)
        return EXIT_ON_SIGNAL[signal.SIGINT]
    except MemoryError:  # what the estimate before the start did not foresee
        print(f"{PROG}: error: out of memory; lower --batch, --context or the model's sizes",
              file=sys.stderr, flush=True)
        return EXIT_USAGE
    except OSError as e:  # reading or writing a file failed: permission, read-only, disk full
        print(f"{PROG}: error: {describe_os_error(e)}", file=sys.stderr, flush=True)
        return EXIT_IO
    except Exception as e:
        from .checkpoint import CheckpointError  # loads NumPy, so only once a command ran

        if not isinstance(e, (UsageError, CheckpointError)):
            raise
        print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())

"""The parser of the ``numpy-transformer`` command, made from the option table.

The options of ``train``, their defaults and checks are one table,
:data:`numpy_transformer.runs.options.OPTIONS`; :func:`build_parser` makes the parser and its
``--help`` from it, and adds the other commands' parsers. It imports only the light modules
of the command line, so ``--help`` and a bad option answer before NumPy loads.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from collections import Counter

from ._version import __version__
from .config import BENCH_CONFIGS, EXPORT_FORMATS
from .runs.options import (
    DEFAULT_MODEL,
    LENGTH,
    MODELS,
    NONNEG_INT,
    OPTIONS,
    POSITIVE,
    POSITIVE_INT,
    SHARE,
    TASKS,
    Option,
    Rule,
    applies,
    default_of,
    default_run_folder,
    flag,
    parse_number,
    shown,
)
from .runs.outputs import (
    EXIT_CODES,
    EXIT_USAGE,
    MAX_SAMPLE_LENGTH,
    RUN_FILES,
    SAMPLE_LENGTH,
    SAMPLE_PROMPT,
    SAMPLE_TEMPERATURE,
    WRITTEN_ONLY_BY,
)

PROG = "numpy-transformer"
RAW = argparse.RawDescriptionHelpFormatter


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


def number(rule: Rule):
    """The argparse type of a numeric option: :func:`~.runs.options.parse_number` of ``rule``."""
    def parse(text: str) -> float:
        try:
            return parse_number(rule, text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def exit_codes_help() -> str:
    """The ``exit codes:`` block of the help, from :data:`~.runs.outputs.EXIT_CODES`."""
    lines = ["exit codes:"]
    for code, meaning in EXIT_CODES.items():
        first, *rest = textwrap.wrap(meaning, width=83)
        lines += [f"  {code:<4} {first}", *(f"       {line}" for line in rest)]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# The parser
# --------------------------------------------------------------------------------------------

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
  numpy-transformer train --init-from runs/char-lm --text notes.txt --lr 5e-4 --out runs/ft
  numpy-transformer train --tokenizer bpe --vocab-size 512 --text notes.txt --out runs/bpe

""" + textwrap.fill(
    "Defaults in brackets are the language model's, the chapter's (TransformerConfig.chapter() "
    "and the recipe of RunOptions), then, where they differ, those of --model lstm "
    "(LSTMConfig.chapter()) and of the synthetic tasks. Ctrl-C (SIGINT) or SIGTERM writes a "
    "checkpoint; --resume continues exactly, also a run written by an older version (what its "
    "format did not record is filled in as that version did it, and said). Sizes that cannot "
    "fit in the memory available are refused before anything is allocated.", width=90) + \
    "\n\n" + exit_codes_help()


def defaults_shown(option: Option) -> str:
    """``[84; the tasks: 64]``: the default of the chapter's language model, then, where they
    differ, that of ``--model lstm`` and of the synthetic tasks."""
    runs = [("lm", model) for model in MODELS] + [(t, DEFAULT_MODEL) for t in TASKS[1:]]
    values = {run: shown(option, default_of(option, *run)) for run in runs
              if applies(option, run[1])}
    first = next(iter(values.values()))
    parts = [first]
    lstm = values.get(("lm", "lstm"))
    if lstm is not None and ("lm", DEFAULT_MODEL) in values and lstm != first:
        parts.append(f"--model lstm: {lstm}")
    tasks = {task: v for (task, _), v in values.items() if task != "lm"}
    if tasks:
        common = Counter(tasks.values()).most_common(1)[0][0]
        parts += [f"the tasks: {common}"] if common != first else []
        parts += [f"--task {task}: {v}" for task, v in tasks.items() if v != common]
    return f"[{'; '.join(parts)}]"


def option_help(option: Option) -> str:
    """The help line of a row of the option table: its text, then its defaults."""
    if option.store is None:
        return option.help
    return " ".join(part for part in (option.help, defaults_shown(option)) if part)


def add_option(group: argparse._ArgumentGroup, option: Option) -> None:
    """A row of the option table as an argument of ``train``. Its argparse default is None,
    "not given": :func:`~.runs.options.resolve_options` fills in the run's own defaults, and
    ``--resume`` refuses any option that was given."""
    kwargs: dict = {"dest": option.key, "help": option_help(option)}
    if option.switch == "both":
        kwargs["action"] = argparse.BooleanOptionalAction
    elif option.switch == "off":
        kwargs.update(action="store_const", const=False)
    elif option.switch == "on":
        kwargs.update(action="store_true", default=None)
    else:
        kwargs.update(type=option.rule and number(option.rule), choices=option.choices,
                      metavar=option.metavar)
    group.add_argument(flag(option.key), **kwargs)


def build_parser() -> Parser:
    """The parser of every command (``train``'s made from the option table)."""
    parser = Parser(prog=PROG, description="A Transformer written from scratch in NumPy:\n"
                    "train one, sample from it, check its gradients, time it.",
                    epilog="example: numpy-transformer train   (then: numpy-transformer "
                    "sample runs/char-lm --prompt 'def ')\n\nRun '%(prog)s COMMAND --help' "
                    "for each command's options.\n\n" + exit_codes_help(), formatter_class=RAW)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    train = sub.add_parser("train", help="train a model (default: the char LM, ~5 minutes)",
                           description=TRAIN_DESCRIPTION, epilog=TRAIN_EPILOG,
                           formatter_class=RAW)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for option in OPTIONS:
        if option.group not in groups:
            groups[option.group] = train.add_argument_group(option.group)
        add_option(groups[option.group], option)
    for add in (add_sample, add_eval, add_gradcheck, add_export, add_import, add_bench):
        add(sub)
    return parser


def add_lm_run(parser) -> None:
    """The language model's run a command reads: a folder or checkpoint, and ``--best``."""
    parser.add_argument("run", nargs="?", default=str(default_run_folder("lm")),
                        metavar="RUN_DIR|CHECKPOINT|HF_DIR",
                        help="a run folder, a checkpoint .npz, a transformers folder of "
                        "GPT-2's or LLaMA's shape or an export's folder [%(default)s]")
    add_best(parser)


def add_best(parser) -> None:
    parser.add_argument("--best", action="store_true", help="the run's best.npz (the lowest "
                        "held-out loss) instead of its last checkpoint")


def add_sample(sub) -> None:
    s = sub.add_parser("sample", help="generate text from a trained language model",
                       description="Continue a prompt with a trained language model, a "
                       "Transformer (with its key/value cache) or an LSTM (carrying its "
                       "state).",
                       epilog="example:\n  numpy-transformer sample runs/char-lm --prompt "
                       "'def ' --length 400 --temperature 0.7 --top-k 20", formatter_class=RAW)
    add_lm_run(s)
    s.add_argument("--prompt", help="text to continue; every character must be in a character "
                   f"model's vocabulary [{SAMPLE_PROMPT!r}, or a character model's first "
                   "character]")
    s.add_argument("--length", type=number(LENGTH), default=SAMPLE_LENGTH,
                   help=f"tokens (characters, or a BPE's subwords) to generate, at most "
                   f"{MAX_SAMPLE_LENGTH:,} [%(default)s]")
    s.add_argument("--temperature", type=number(POSITIVE), default=SAMPLE_TEMPERATURE,
                   help="divides the logits; < 1 is more conservative [%(default)s]")
    s.add_argument("--top-k", type=number(POSITIVE_INT), help="keep the k most likely tokens")
    s.add_argument("--top-p", type=number(SHARE), help="keep the smallest set of tokens with "
                   "this much probability (nucleus sampling)")
    s.add_argument("--greedy", action="store_true", help="always take the most likely token")
    s.add_argument("--seed", type=number(NONNEG_INT), default=0, help="sampling seed [%(default)s]")


def add_eval(sub) -> None:
    v = sub.add_parser("eval", help="a trained language model's loss on a text",
                       description="The loss (nats per token: per character, or per BPE "
                       "token), perplexity and bits per token of a run's language model on a "
                       "text, over fixed windows of its context, each from an empty history; "
                       "for a BPE, the bits per character too.",
                       epilog="examples:\n  numpy-transformer eval runs/char-lm\n  "
                       "numpy-transformer eval runs/char-lm --text notes.txt",
                       formatter_class=RAW)
    add_lm_run(v)
    v.add_argument("--text", metavar="FILE", help="UTF-8 text to measure, tokenized by the "
                   "model's own tokenizer [a run's held-out 10%%, as its report; a transformers "
                   "folder has none]")


def add_gradcheck(sub) -> None:
    c = sub.add_parser("gradcheck", help="check every hand-written backward by finite "
                       "differences", description="Print the gradient-check tables: each "
                       "named tensor's worst error of the backward against central "
                       "differences in float64. Exit code 1 if any check fails.",
                       epilog="examples:\n  numpy-transformer gradcheck\n  "
                       "numpy-transformer gradcheck --list\n  numpy-transformer gradcheck "
                       "NAME [NAME ...] --tol 1e-7", formatter_class=RAW)
    c.add_argument("names", nargs="*", metavar="NAME", help="pieces to check [all]; see --list")
    c.add_argument("--tol", type=number(POSITIVE), default=1e-6,
                   help="largest relative error accepted [%(default)g]")
    c.add_argument("--list", action="store_true", help="list the names and exit")


def add_export(sub) -> None:
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
                       "hf --out gpt-hf", formatter_class=RAW)
    e.add_argument("run", metavar="RUN_DIR|CHECKPOINT", help="a run folder or a checkpoint .npz")
    e.add_argument("--format", choices=EXPORT_FORMATS, default=EXPORT_FORMATS[0],
                   help=f"[{EXPORT_FORMATS[0]}]")
    e.add_argument("--out", metavar="DIR", help="where the files go [RUN_DIR/FORMAT]; a "
                   "folder that already holds files is refused")
    e.add_argument("--force", action="store_true",
                   help="replace the files of the same names in a folder that holds some")
    add_best(e)


def add_import(sub) -> None:
    i = sub.add_parser("import", help="make a run folder from a Hugging Face model or an "
                       "export", description="Make a run folder from a transformers folder of "
                       "GPT-2's or LLaMA's shape, or from an export's model.safetensors: the run "
                       "that starts from those weights (step 0, fresh Adam moments, the default "
                       "options with the model's shape, as train --init-from starts it), with "
                       "the model's own tokenizer, characters or byte-level BPE, ids unchanged. "
                       "sample, eval and export read it; train --resume trains it further on "
                       "--text (numpy_transformer.runs.importing).",
                       epilog="examples:\n  numpy-transformer import my-gpt2 --out runs/gpt2 "
                       "--context 128\n  numpy-transformer sample runs/gpt2 --prompt 'Hello'\n"
                       "  numpy-transformer export runs/gpt --format hf --out gpt-hf\n  "
                       "(fine-tune gpt-hf in transformers, save_pretrained it into tuned with "
                       "the tokenizer files)\n  numpy-transformer import tuned --out runs/tuned "
                       "--text my.txt", formatter_class=RAW)
    i.add_argument("source", metavar="HF_DIR|SAFETENSORS", help="a transformers folder, or an "
                   "export's model.safetensors (or its folder)")
    i.add_argument("--out", metavar="RUN_DIR", required=True, help="the new run folder")
    i.add_argument("--text", metavar="FILE", help="what train --resume trains on, tokenized "
                   "by the model's tokenizer, which must encode it [the embedded corpus]")
    i.add_argument("--context", type=number(POSITIVE_INT), metavar="T", help="the run's window "
                   "T, at most a learned position table's rows [the source's]")
    i.add_argument("--force", action="store_true",
                   help="reuse a non-empty --out (our files in it are replaced)")


def add_bench(sub) -> None:
    b = sub.add_parser("bench", help="a training step against PyTorch, the cold compile, the "
                       "sgemm ceiling", description="Time a training step of ours (numba "
                       "backend) and of PyTorch eager side by side, in two worker processes "
                       "asked in turn; the first step on an empty compile cache; the machine's "
                       "float32 matrix-product rate at the step's own shapes as the ceiling, "
                       "beside the CPU's SIMD level and the BLAS kernels, with a warning when "
                       "those are older than the CPU (numpy_transformer.bench). "
                       "The long scripts are in the repository's benchmarks/ folder.",
                       epilog="examples:\n  numpy-transformer bench --quick\n  "
                       "numpy-transformer bench --config wide --threads 2\n  "
                       "numpy-transformer bench --busy 1", formatter_class=RAW)
    b.add_argument("--config", choices=BENCH_CONFIGS, default=BENCH_CONFIGS[0],
                   help="chapter: the chapter's char model, batch 64 x 100; small, wide (6 "
                   "layers, width 384, 16 x 256), long (T = 1024), gpt2 (GPT-2 small's shape, "
                   "1 x 1024), lstm (the chapter's LSTM) "
                   "[%(default)s]")
    b.add_argument("--threads", type=number(POSITIVE_INT),
                   help="threads of both frameworks [the cores available]")
    b.add_argument("--quick", action="store_true", help="a few steps: that it runs, at a glance")
    b.add_argument("--busy", type=number(NONNEG_INT), metavar="N",
                   help="instead: ours and PyTorch on every core and on one, beside N "
                   "competing CPU-bound processes")


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------

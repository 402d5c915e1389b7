"""The ``numpy-transformer`` command: train, sample, eval, gradcheck, export, import, bench.

``numpy-transformer train`` with no arguments trains the chapter's character model on the
embedded corpus in about five minutes on two cores, and leaves ``runs/char-lm/`` with a
checkpoint, the loss log, two plots and a sample. ``numpy-transformer train --model lstm``
trains the LSTM of about the same size with the same recipe into ``runs/char-lstm/``: the same
files but the attention map, which an LSTM does not have. ``numpy-transformer sample RUN_DIR``
continues a prompt with either. ``python -m numpy_transformer`` is the same command.

The options of ``train``, their defaults and checks are one table,
:data:`numpy_transformer.runs.options.OPTIONS`: the parser is made from it. The exit
codes are listed once, in :data:`~numpy_transformer.runs.outputs.EXIT_CODES`; ``--help``
prints them. The parser is :mod:`numpy_transformer.cli_parser`'s.

Limits
------
Before anything is allocated, the memory a run needs (weights, gradients, Adam's moments, a
step's activations, the window schedule: ``numpy_transformer/memory.py``) is compared with the
memory available; a run that cannot fit is refused naming the option. ``sample --length`` is
at most 1,000,000. A run folder is held by one process at a time (its ``.lock`` file).
"""

from __future__ import annotations

import argparse
import signal
import sys

from .allocator import reuse_freed_memory
from .cli_parser import PROG, build_parser
from .runs.options import (
    OPTIONS,
    flag,
    read_config_file,
    resolve_options,
)
from .runs.outputs import (
    EXIT_DIVERGED,
    EXIT_IO,
    EXIT_OK,
    EXIT_ON_SIGNAL,
    EXIT_USAGE,
    UsageError,
    describe_os_error,
    interruptible,
)
from .threads import available_cores, set_blas_threads

# Everything else this command runs (NumPy, numba, matplotlib, the run package) is imported
# inside the command that needs it: --help and a bad option answer before any of it loads.


WITH_RESUME = ("resume", "quiet", "steps")  # the options of train that --resume takes


def cmd_train(args: argparse.Namespace) -> int:
    set_blas_threads(1)  # the numba kernels use the cores; see numpy_transformer/threads.py
    reuse_freed_memory()  # no fresh pages for every step's buffers; see allocator.py
    if args.resume is not None:
        extra = [flag(o.key) for o in OPTIONS
                 if o.key not in WITH_RESUME and getattr(args, o.key) is not None]
        if extra:
            raise UsageError(f"--resume continues a run exactly as it was configured (but "
                             f"for --steps, which extends it); drop {' '.join(extra)}")
        from .runs.loop import resume_run

        return resume_run(args.resume, progress=not args.quiet, steps=args.steps)
    given = {o.key: getattr(args, o.key) for o in OPTIONS if o.store}
    if args.config is not None:  # the file's options, where no flag gave one
        from_file = read_config_file(args.config)
        given.update({k: v for k, v in from_file.items() if given[k] is None})
    source = None
    if given["init_from"] is not None:  # the model's options come from the source
        from .runs.init_from import resolve_init_from

        config_fields, options, source = resolve_init_from(given)
    else:
        config_fields, options = resolve_options(given.pop("task"), given)
    from .runs.loop import start_run

    return start_run(config_fields, options, args.out, bool(args.force),
                     progress=not args.quiet, source=source)


def chosen_checkpoint(args: argparse.Namespace):
    """The run folder or checkpoint a command reads: with ``--best``, the folder's
    ``best.npz``."""
    if not args.best:
        return args.run
    from pathlib import Path

    from .runs.folder import checkpoint_path

    if not Path(args.run).is_dir():
        raise UsageError(f"--best takes a run folder, got {args.run}")
    return checkpoint_path(args.run, best=True)


def cmd_sample(args: argparse.Namespace) -> int:
    from .runs.sample import sample_checkpoint

    set_blas_threads(1)
    text = sample_checkpoint(chosen_checkpoint(args), args.prompt, args.length, args.seed,
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


def cmd_eval(args: argparse.Namespace) -> int:
    from .runs.evaluate import evaluate_run

    print("\n".join(evaluate_run(chosen_checkpoint(args), args.text).lines()), flush=True)
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    from .runs.export import export_checkpoint

    written = export_checkpoint(chosen_checkpoint(args), args.format, args.out,
                                force=args.force)
    print(f"wrote {', '.join(str(p) for p in written)}", flush=True)
    return EXIT_OK


def cmd_import(args: argparse.Namespace) -> int:
    from .runs.importing import import_model

    run_dir = import_model(args.source, args.out, args.text, force=args.force,
                           context=args.context)
    print(f"wrote {run_dir}/: config.json, checkpoint.npz (step 0); continue with: "
          f"numpy-transformer sample {run_dir}", flush=True)
    return EXIT_OK


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench.summary import run

    cores = available_cores()
    if args.threads is not None and args.threads > cores:
        raise UsageError(f"--threads {args.threads}: this process may run on {cores} "
                         f"core{'s' if cores > 1 else ''} at most")
    try:
        run(args.config, None if args.threads is None else int(args.threads), quick=args.quick,
            busy=args.busy)
    except RuntimeError as e:  # a worker process failed: its own traceback is on stderr
        print(f"{PROG}: bench failed: {str(e).splitlines()[0]}", file=sys.stderr, flush=True)
        return EXIT_DIVERGED
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``numpy-transformer`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    command = {"train": cmd_train, "sample": cmd_sample, "eval": cmd_eval,
               "gradcheck": cmd_gradcheck,
               "bench": cmd_bench, "export": cmd_export, "import": cmd_import}[args.command]
    try:
        from .runs.environment import check_environment

        check_environment()
        with interruptible():
            return command(args)
    except KeyboardInterrupt as e:  # Interrupted: SIGINT or SIGTERM; a bare one: Ctrl-C
        signum = getattr(e, "signum", signal.SIGINT)
        print(f"{PROG}: stopped by {signal.Signals(signum).name}", file=sys.stderr, flush=True)
        return EXIT_ON_SIGNAL[signum]
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

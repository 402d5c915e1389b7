"""Compile a run's kernels in parallel processes when Numba's cache does not hold them yet.

On an empty Numba cache the first training step compiles every kernel it calls, one after
the other, on one core. Kernels compile independently of each other, so before the first
step :func:`precompile` gives them to worker processes, one per group of kernels
(``GROUPS``). The workers compile the kernels' first tier, the plain loops, which compile in
a third of the time of the parallel ones (``kernels/_tiers.py``); the run starts on them, and
a background process, started at the first step boundary, compiles the parallel tier while
it trains; each kernel switches to it at the first step boundary after it is in the cache:

* each worker builds the same run and does what the run will: its first training step, an
  evaluation forward and, for a language model, the first tokens of the report's sample. It
  does them on the numba backend limited to its group (``NUMPY_TRANSFORMER_KERNELS``,
  :mod:`numpy_transformer.backend`); the other operations run their NumPy references. Numba
  saves what the worker compiles in its cache. The references return what the kernels
  return, memory layout included (``tests/test_precompile.py`` holds the groups to it), so
  each kernel is compiled for the very signatures the run calls it with;
* the run then loads every kernel from the cache (``tests/test_precompile.py`` holds it to
  compiling nothing).

The run's numbers do not change: a kernel loaded from the cache is the code the run would
have compiled itself, and the two tiers give the same bits. Whether the cache is cold is read
from Numba's cache index of the group's largest kernel (the attention's forward, the LSTM's
backward): no entry there on either tier for the run's dtype means the kernels were never
compiled on this machine, or the library or Numba changed since. A warm cache costs that one
read. On a single core, or when a worker fails, the run compiles as it always did, in its
first step (the serial tier there too).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..backend import KERNELS_VARIABLE
from ..bpe import tokenizer_from_dict
from ..config import KERNEL_MODULES
from ..generate import generate
from ..memory import available_memory, training_bytes
from ..threads import available_cores
from .options import MODEL_KEYS
from .outputs import say
from .sample import default_prompt
from .state import Run

# Kernels compiled together, one worker per group (see the docstring): kernel modules, or one
# operation of a module (``lstm.lstm_backward``); tests/test_precompile.py holds the groups to
# compiling every signature a run calls. The first group of each model holds its largest
# kernel, whose cache entries tell whether the cache is cold; the second every other kernel
# (config.KERNEL_MODULES: a new kernel module joins it unlisted, and a worker only compiles
# what its run calls). Measured one after the other on the benchmark machine, on an empty
# cache: the attention's two kernels 14.0 s, the rest 12.7 s; the LSTM's backward 8.0 s, its
# forward 3.5 s, the rest of the LSTM run 4.6 s. (The attention's backward cannot go to a
# worker of its own: it takes the cache of the kernel's forward, which the reference forward
# does not make. The LSTM's kernels share the reference's cache.)
GROUPS = {
    "transformer": (("attention",),
                    tuple(m for m in KERNEL_MODULES if m != "attention")),
    "lstm": (("lstm.lstm_backward",),
             ("lstm.lstm_forward", *(m for m in KERNEL_MODULES if m != "lstm"))),
}
LARGEST = {"transformer": ("attention", "_sdpa_forward_kernel"),
           "lstm": ("lstm", "_backward_kernel")}
# A worker's own interpreter, NumPy and Numba compiling: the attention worker of the default
# run peaked at 385 MiB resident, 50 MiB of which its run's arrays
WORKER_BYTES = 400 * 2**20
# A worker imports this very package, first on its path: not another copy that the working
# directory may hold (its kernels would go to another cache).
WORKER = (f"import sys; sys.path.insert(0, {str(Path(__file__).parents[2])!r}); "
          f"from {__name__} import work_from_stdin; work_from_stdin()")


def is_cached(model: str, dtype: str) -> bool:
    """Whether Numba's cache holds the largest kernel of a ``model`` run for ``dtype``, on
    either tier (``kernels/_tiers.py``)."""
    import numba

    from ..kernels._tiers import PARALLEL, SERIAL

    module, name = LARGEST[model]
    kernel = getattr(importlib.import_module(f"..kernels.{module}", __package__), name)
    wanted = numba.from_dtype(np.dtype(dtype))
    return any(getattr(t, "dtype", None) == wanted for tier in (SERIAL, PARALLEL)
               for signature in kernel.cached_signatures(tier) for t in signature)


def precompile(run: Run, stopping: Callable[[], bool] = lambda: False) -> bool:
    """Compile the kernels of ``run`` in parallel worker processes if Numba's cache is cold.

    Returns whether workers ran. Nothing is done on the numpy backend, on a single core, when
    the workers' runs would not fit in the memory available beside this one, or when the
    cache holds the run's kernels already. The workers run in sessions of their own (Ctrl-C
    at the terminal reaches this process only); once ``stopping()`` is true, which the
    training loop's SIGINT and SIGTERM handler makes it, they are ended and this returns.
    """
    config = run.config
    model = run.model_kind
    if config.backend != "numba" or available_cores() < 2 or is_cached(model, config.dtype):
        return False
    groups = GROUPS[model]
    # each worker holds a run of its own: all of them beside this one, or none
    worker_bytes = WORKER_BYTES + sum(training_bytes(config, type(run.model).__name__,
                                                     run.options["batch"], 1).values())
    available = available_memory()
    if available is not None and len(groups) * worker_bytes > available:
        return False
    say(f"compiling the kernels in {len(groups)} processes (once per machine and version: "
        f"Numba keeps them in its cache)")
    job = json.dumps(worker_job(run))
    with contextlib.ExitStack() as files:
        workers = []
        for group in groups:
            errors = files.enter_context(tempfile.TemporaryFile("w+"))  # a pipe could fill
            worker = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE,
                                      stdout=subprocess.DEVNULL, stderr=errors,
                                      env=worker_env(group), text=True, start_new_session=True)
            worker.stdin.write(job + "\n")  # one line, and the pipe kept open: a worker
            worker.stdin.flush()  # ends itself when this process dies (exit_with_parent)
            files.callback(worker.stdin.close)
            workers.append((group, worker, errors))
        while any(worker.poll() is None for _, worker, _ in workers):
            if stopping():
                for _, worker, _ in workers:
                    worker.kill()
                    worker.wait()
                return True
            time.sleep(0.05)
        for group, worker, errors in workers:
            if worker.returncode != 0:
                errors.seek(0)
                last = errors.read().strip().splitlines()[-1:] or ["no message"]
                say(f"the worker compiling {', '.join(group)} failed ({last[0]}); the first "
                    f"step compiles what it left")
    return True


def worker_env(group: tuple[str, ...]) -> dict:
    """The environment of the worker compiling ``group``: this process's, kernels limited.

    Thread counts stay as they are, like every other setting: a worker must call the kernels
    as the run will.
    """
    return {**os.environ, KERNELS_VARIABLE: ",".join(group)}


def worker_job(run: Run) -> dict:
    """What a worker needs to build the run again: its config fields and options (one step)."""
    fields = {k: getattr(run.config, k) for k in MODEL_KEYS[run.model_kind]}
    return {"config": fields, "options": {**run.options, "steps": 1},
            "tokenizer": run.tokenizer and run.tokenizer.to_dict()}


def work_from_stdin() -> None:
    """A worker process: :func:`work` on the job of its standard input's first line, ended
    as soon as the pipe closes (this process's parent died, by any signal)."""
    from ..kernels._tiers import exit_with_parent

    job = json.loads(sys.stdin.readline())
    exit_with_parent()
    work(job)


def work(job: dict) -> None:
    """One worker's job (:func:`worker_job`), on the kernels of ``NUMPY_TRANSFORMER_KERNELS``
    (the rest on the references): what the run calls, the run's first step, an evaluation
    forward and, for a language model, the report's sample (one new row at a time). The
    kernels compile their serial tier, the run's first (``kernels/_tiers.py``)."""
    from ..kernels._tiers import SERIAL, set_tier

    set_tier(SERIAL)
    tokenizer = job["tokenizer"] and tokenizer_from_dict(job["tokenizer"])
    run = Run(job["config"], job["options"], tokenizer=tokenizer or None)
    batch = run.batch(0)
    run.trainer.step(batch)
    run.model.eval()
    run.model.forward(*batch.inputs)
    if run.tokenizer is not None:
        prompt = run.tokenizer.encode(default_prompt(run.tokenizer))
        generate(run.model, prompt, 2, np.random.default_rng(0))

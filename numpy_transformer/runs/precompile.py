"""The command line's first step on an empty Numba cache: the kernels compiled in two processes.

:func:`~numpy_transformer.compile_ahead.compile_ahead` does it for any trainer's first step: a
worker compiles the largest kernels (the attention's) while this process compiles the others.
Before the first step of a run, the training loop calls it through :func:`precompile` with what
else the run will call: the held-out evaluation and, for a language model, the report's sample,
whose first tokens are compiled too. It says so in a line of its own, and in one more if the
worker failed (the run then compiles what the worker left, in its first step, as it always
did). On a warm cache, one core, the numpy backend, or too little memory for the two models
beside the run's own, nothing is done or said.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..compile_ahead import compile_ahead
from .outputs import say
from .sample import default_prompt
from .state import Run


def precompile(run: Run, stopping: Callable[[], bool] = lambda: False) -> bool:
    """Compile the kernels of ``run`` in two processes if Numba's cache is cold.

    Returns whether anything was compiled ahead. ``stopping()``, which the training loop's
    SIGINT and SIGTERM handler makes true, ends the worker and returns early.
    """
    prompt = None if run.tokenizer is None else np.asarray(
        run.tokenizer.encode(default_prompt(run.tokenizer)))
    result = compile_ahead(run.model, run.sample_batch(), prompt=prompt, evaluate=True,
                           stopping=stopping, starting=lambda: say(
                               "compiling the kernels in two processes (once per machine and "
                               "version: Numba keeps them in its cache)"))
    if result not in (None, "compiled"):
        say(f"{result}; the first step compiles what it left")
    return result is not None

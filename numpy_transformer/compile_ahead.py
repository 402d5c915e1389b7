"""A model's first step on an empty Numba cache: its kernels compiled in two processes at once.

On an empty cache the first training step compiles every kernel it calls, one after the
other, on one core: about 10 s for the chapter's model on the benchmark machine, the other core
idle. Kernels compile independently of each other, so :func:`compile_ahead` shares them out:

* a worker process compiles the model family's largest kernels (``FAMILIES``: the attention's
  forward and backward, which alone take about as long as all the others; an LSTM's backward);
* meanwhile this process compiles the rest;

each by making the calls the real step will make, in the same order, with a model of its own:
built again from the model's class and config, on the numba backend limited to its share of
the kernels (:func:`~numpy_transformer.backend.only_kernels`), the other operations on their
references. The references return what the kernels return, memory layout included
(``tests/test_compile_ahead.py`` holds the two shares to covering every signature the real
step calls), so each kernel compiles for the very signatures of the real step. The worker
saves its kernels in Numba's cache; the real step then loads them from there and finds the
others compiled in this process. Nothing of the caller's model, optimiser or generators is
touched: the numbers of the real step do not change.

Both shares compile the kernels' first tier, the plain loops (``kernels/_tiers.py``); the
parallel tier follows in the background while the run trains.

Who calls it: :meth:`Trainer.step <numpy_transformer.train.Trainer.step>` before a trainer's
first step (the library API), and the command line's training loop before its first step, with
the held-out evaluation and the report's sample added (``runs/precompile.py``).

Whether the cache is cold is read from Numba's cache index of the family's largest kernel
(``FAMILIES``): no entry there on either tier for the model's dtype means the kernels were
never compiled on this machine, or the library or Numba changed since. A warm cache costs that
one read, once per process, family and dtype. Nothing starts on one core, in a process that
may not start compiling processes (:func:`~numpy_transformer.kernels._tiers.set_background`),
on a tier other than ``"auto"`` (a compile worker itself), or where the two models would not
fit in the memory available; the step then compiles what it calls, as it always did.
"""

from __future__ import annotations

import base64
import importlib
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .backend import only_kernels
from .config import KERNEL_MODULES
from .generate import generate
from .memory import available_memory, training_bytes
from .nn.lstm import LSTMLM
from .nn.models import DecoderLM, EncoderClassifier, EncoderDecoder
from .optim import Adam
from .threads import available_cores

# Per model family (a model is rebuilt from its class and config alone): the kernels the
# worker compiles, and the compiled function (kernel module, name) whose cache entries tell a
# cold cache from a warm one, the largest of the worker's. Measured one after the other on
# the benchmark machine, on an empty cache, the chapter's model: the attention's two kernels
# 5.9 s of compiling, the rest 4.1 s. (The attention's backward cannot go to a process of its
# own: it takes the cache of the kernel's forward, which the reference forward does not make.)
_ATTENTION = (("attention",), ("attention", "_sdpa_forward_kernel"))
FAMILIES = {DecoderLM: _ATTENTION, EncoderClassifier: _ATTENTION, EncoderDecoder: _ATTENTION,
            LSTMLM: (("lstm.lstm_backward",), ("lstm", "_backward_kernel"))}
# The worker imports this very package, first on its path: not another copy that the working
# directory may hold (its kernels would go to another cache)
WORKER = (f"import sys; sys.path.insert(0, {str(Path(__file__).parents[1])!r}); "
          f"from {__name__} import work_from_stdin; work_from_stdin()")
# A worker's own interpreter, NumPy and Numba compiling: the attention worker of the default
# run peaked at 385 MiB resident, 50 MiB of which its model's arrays
WORKER_BYTES = 400 * 2**20

_looked: set[tuple[type, str]] = set()  # (model class, dtype) whose cache this process read


def rest_of(share: tuple[str, ...]) -> tuple[str, ...]:
    """The kernels that ``share`` leaves (named as :func:`~numpy_transformer.backend.only_kernels`
    names them): every other kernel module, and a module split by operation its other
    operations."""
    rest = []
    for module in KERNEL_MODULES:
        named = {m.partition(".")[2] for m in share if m.partition(".")[0] == module}
        if not named:
            rest.append(module)
        elif "" not in named:  # split: the module's other operations
            ops = importlib.import_module(f"{__package__}.kernels.{module}").__all__
            rest.extend(f"{module}.{op}" for op in ops if op not in named)
    return tuple(rest)


def is_cached(model_class: type, dtype: str) -> bool:
    """Whether Numba's cache holds the largest kernel of ``model_class``'s family for
    ``dtype``, on either tier (``kernels/_tiers.py``)."""
    import numba

    from .kernels._tiers import PARALLEL, SERIAL

    module, name = FAMILIES[model_class][1]
    kernel = getattr(importlib.import_module(f".kernels.{module}", __package__), name)
    wanted = numba.from_dtype(np.dtype(dtype))
    return any(getattr(t, "dtype", None) == wanted for tier in (SERIAL, PARALLEL)
               for signature in kernel.cached_signatures(tier) for t in signature)


def compile_ahead(model, batch, *, prompt: np.ndarray | None = None, evaluate: bool = False,
                  stopping: Callable[[], bool] = lambda: False,
                  starting: Callable[[], None] = lambda: None) -> str | None:
    """Compile the kernels of a training step of ``model`` on ``batch`` in two processes, if
    Numba's cache is cold (see the module's docstring for when nothing is done).

    Parameters
    ----------
    model : DecoderLM, EncoderClassifier, EncoderDecoder or LSTMLM
        Not touched: a model of its own is built from ``type(model)`` and ``model.config``.
    batch : Batch
        The step's inputs, targets and mask (``numpy_transformer.train.Batch``).
    prompt : ndarray of int, optional
        Also the first tokens of a sample continuing it (a language model's report).
    evaluate : bool, default False
        Also a forward pass in eval mode (a held-out evaluation).
    stopping : callable, optional
        Polled while the worker compiles: once true, the worker is ended and this returns.
    starting : callable, optional
        Called when the compiling starts (the command line says so).

    Returns
    -------
    str or None
        ``None`` where nothing was done; else what happened, in words: ``"compiled"``, or
        why the worker failed (its kernels are then compiled by the step that calls them).
    """
    if not _cold(model, len(batch.targets)):
        return None
    starting()
    share = FAMILIES[type(model)][0]
    job = {"model": type(model), "config": model.config, "batch": tuple(batch), "share": share,
           "prompt": prompt, "evaluate": evaluate}
    with tempfile.TemporaryFile() as errors:  # a pipe could fill
        # a session of its own: Ctrl-C at the terminal reaches this process only
        worker = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE,
                                  stdout=subprocess.DEVNULL, stderr=errors,
                                  start_new_session=True)
        try:
            worker.stdin.write(base64.b64encode(pickle.dumps(job)) + b"\n")
            worker.stdin.flush()  # and kept open: the worker ends itself when this process dies
            if not stopping():
                _first_calls(type(model), model.config, batch, rest_of(share), prompt,
                             evaluate)
            while worker.poll() is None and not stopping():
                time.sleep(0.02)
        finally:
            if worker.poll() is None:  # stopped, or this process's own calls raised
                worker.kill()
            worker.wait()
            worker.stdin.close()
        if worker.returncode == 0:
            return "compiled"
        errors.seek(0)
        last = errors.read().decode(errors="replace").strip().splitlines()[-1:]
        return (f"the worker compiling {', '.join(share)} ended with exit status "
                f"{worker.returncode}" + "".join(f" ({line})" for line in last))


def _cold(model, rows: int) -> bool:
    """Whether to compile ahead for ``model`` and a batch of ``rows``: a family of
    ``FAMILIES`` on the numba backend, this process on the ``"auto"`` tier and allowed to
    start processes, two cores, a cold cache (read once per process, class and dtype) and
    the memory for two more models taking a step."""
    config = getattr(model, "config", None)
    if type(model) not in FAMILIES or config is None or config.backend != "numba":
        return False
    from .kernels import _tiers

    key = (type(model), config.dtype)
    if key in _looked or not _tiers.may_start_processes() or available_cores() < 2:
        return False
    _looked.add(key)
    if is_cached(type(model), config.dtype):
        return False
    needs = WORKER_BYTES + 2 * sum(training_bytes(config, type(model).__name__, rows,
                                                  1).values())
    available = available_memory()
    return available is None or needs <= available


def _first_calls(model_class: type, config, batch, kernels: tuple[str, ...],
                 prompt: np.ndarray | None, evaluate: bool) -> None:
    """The calls of a training step of a model of ``model_class`` built from ``config`` on
    the numba backend limited to ``kernels``: forward and backward through its
    ``loss_and_backward``, Adam's update; then, if asked, an evaluation forward and two
    sampled tokens after ``prompt``."""
    inputs, targets, mask = batch
    with only_kernels(kernels):
        model = model_class(config)
        optimizer = Adam(lr=0.0, backend=config.backend)
    model.loss_and_backward(*inputs, targets=targets, mask=mask)
    named = list(model.named_parameters())
    optimizer.step({n: p for n, p, _ in named}, {n: g for n, _, g in named})
    if evaluate:
        model.eval()
        model.forward(*inputs)
    if prompt is not None:
        generate(model, prompt, 2, np.random.default_rng(0))


def work_from_stdin() -> None:
    """The worker process: the first calls (:func:`_first_calls`) of the job on its standard
    input's first line (base64 of a pickled dict), on the kernels' serial tier; ended as soon
    as the pipe closes (its parent died, by any signal)."""
    from .kernels._tiers import SERIAL, exit_with_parent, set_tier

    job = pickle.loads(base64.b64decode(sys.stdin.buffer.readline()))
    exit_with_parent()
    set_tier(SERIAL)
    _first_calls(job["model"], job["config"], job["batch"], job["share"], job["prompt"],
                 job["evaluate"])

"""Two tiers of every parallel kernel: the plain loop, which compiles fast, and the parallel one.

Numba takes about three times as long to compile a kernel with ``parallel=True`` as the same
function as a plain loop (``benchmarks/README.md``: 18 s against 5.5 s for the chapter's run),
and the plain loop runs a step a few milliseconds slower. So each kernel of this folder that
runs its work in parallel (``prange``) is a :class:`TieredKernel`, made by :func:`tiered`
from one Python function:

* tier 1, ``serial``: the function compiled with ``parallel=False`` (``prange`` runs as
  ``range``), under the name ``<function>__serial``: Numba files a cached function under its
  qualified name and line, and its index keys do not hold the ``parallel`` option, so a second
  dispatcher of the function under the same name would load, and overwrite, the other's code;
* tier 2, ``parallel``: the function as written.

Both tiers give the same bits: every kernel splits its work by rows, blocks or heads, never by
the thread count, and a reduction across work items sums per item and adds the items' sums in
order afterwards (``tests/test_tiers.py`` trains models switching tiers at different steps,
and shows that a ``prange`` sum, which Numba splits by thread, would be caught). So a process
may run any kernel on either tier at any time. The 30 ``prange`` loops, by how they split:

* one entry or one row per item, nothing summed across items: the activations (``x.size``
  entries, or blocks of ``_BLOCK``), the embedding's lookup, the cross-entropy (rows), the
  norms' forwards (blocks of rows);
* blocks of rows, each with its own partial sums, added in order by the caller: the norms'
  backwards (``dw_part``), the linear and feed-forward kernels (chunks counted from the rows,
  ``linear._chunks``; ``dw_part``, ``db_part``), the LSTM (chunks of sequences, ``db_part``),
  Adam (blocks of each parameter; no sum);
* blocks of columns, each summed over all rows in order: a vocabulary-wide linear layer's dW
  and db (``linear._BLOCK_COLUMNS``);
* the attention: (batch, query block, head) items forward; backward (batch, chunk, head)
  items, the chunks counted from the shape (``attention._BACKWARD_ITEMS``), their dk, dv
  added in order by the caller.

Scratch rows are taken per thread (``numba.get_thread_id()``, 0 on the serial tier) and
hold nothing from one item to the next.

Which tier runs (:func:`set_tier`)
----------------------------------
* ``"auto"``, the default: a kernel runs its parallel tier wherever Numba's cache holds it for
  the call's types; otherwise its serial tier, compiled or loaded, and the call's signature is
  remembered. At a step boundary (``Trainer.step`` calls :func:`poll`) one background process
  compiles the remembered signatures' parallel tier into the cache (on one thread there is
  nothing to gain and none starts); each kernel goes parallel at the first step boundary
  after its parallel tier is in the cache. A second run finds them in the cache and runs
  parallel from its first call. A caller that knows how many steps its run has left (the
  command line's training loop, ``Trainer.fit``) passes them to :func:`poll`: a run that ends
  within ``BACKGROUND_MIN_SECONDS`` of the boundary, judged by the last step that compiled
  nothing, starts no compiler, which its end would only kill.
* ``"serial"``: tier 1 only (the worker of a first step's compile, ``compile_ahead.py``).
* ``"parallel"``: tier 2 only, compiled in this process where the cache lacks it (the
  background compiler).

The background compiler is ended when this process exits (``atexit``), and it ends itself
when this process dies without exiting (``kill -9``): its standard input is a pipe from this
process, which it watches (:func:`exit_with_parent`). Numba writes a cache entry to a
temporary file and renames it into place, so a compiler ended at any point leaves no broken
entry, only the kernels it had not finished yet.
"""

from __future__ import annotations

import atexit
import base64
import functools
import importlib
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path

import numba

SERIAL, AUTO, PARALLEL = "serial", "auto", "parallel"
TIERS = (SERIAL, AUTO, PARALLEL)
SERIAL_SUFFIX = "__serial"
POLL_SECONDS = 1.0  # how often a step boundary looks for the compiler's finished kernels
# A run ending sooner than this after a step boundary starts no background compiler: its own
# start (an interpreter, NumPy, Numba) takes about 1.5 s and the parallel tier of even the
# chapter's small model tens of seconds, so the run's end would kill it having cached little
# or nothing (the test suite's short command-line runs spent about 100 s of CPU that way)
BACKGROUND_MIN_SECONDS = 10.0
# The background compiler imports this very package, first on its path (not another copy that
# the working directory may hold: its kernels would go to another cache)
COMPILER = (f"import sys; sys.path.insert(0, {str(Path(__file__).parents[2])!r}); "
            f"from {__name__} import compile_in_background; compile_in_background()")


class NotCached(Exception):
    """Raised inside a parallel dispatcher, in ``"auto"``, for a signature the cache lacks."""

    def __init__(self, signature: tuple) -> None:
        super().__init__(signature)
        self.signature = signature


class TieredKernel:
    """One kernel function compiled twice: ``serial`` (tier 1) and ``parallel`` (tier 2).

    Called like the function; ``active`` is the dispatcher that runs it (see the module's
    docstring for the rule).
    """

    def __init__(self, py_func: types.FunctionType, options: dict) -> None:
        self.serial = numba.njit(parallel=False, **options)(_renamed(py_func, SERIAL_SUFFIX))
        self.parallel = numba.njit(parallel=True, **options)(py_func)
        # Numba calls its dispatcher's compile for each new signature (loading from the cache
        # or compiling); this one refuses, in "auto", what the cache does not hold
        self.parallel.compile = functools.partial(_compile_parallel, self.parallel,
                                                  self.parallel.compile)
        self.active = self.serial if _state.mode == SERIAL else self.parallel
        functools.update_wrapper(self, py_func)
        _state.kernels.append(self)

    def __call__(self, *args):
        try:
            return self.active(*args)
        except NotCached as missing:
            self.active = self.serial
            _state.remember(self, missing.signature)
            return self.serial(*args)

    def cached_signatures(self, tier: str) -> list[tuple]:
        """The signatures Numba's cache holds for ``tier`` (``"serial"`` or ``"parallel"``)."""
        return [key[0] for key in _index(self.serial if tier == SERIAL else self.parallel)]


def tiered(options: dict) -> Callable[[types.FunctionType], TieredKernel]:
    """Decorator: a :class:`TieredKernel` of the function, compiled with ``options`` (a
    module's :func:`~._jit.jit_options`)."""
    return lambda py_func: TieredKernel(py_func, options)


def _renamed(py_func: types.FunctionType, suffix: str) -> types.FunctionType:
    """The same code, globals and defaults, under the qualified name ``<name><suffix>``."""
    copy = types.FunctionType(py_func.__code__, py_func.__globals__, py_func.__name__,
                              py_func.__defaults__, py_func.__closure__)
    copy.__qualname__ = py_func.__qualname__ + suffix
    copy.__module__ = py_func.__module__
    return copy


def _index(dispatcher) -> dict:
    """Numba's cache index of ``dispatcher``: {(signature, target, code hashes): file} (a
    private interface: if it has moved, nothing counts as cached)."""
    try:
        return dispatcher._cache._cache_file._load_index()
    except Exception:  # noqa: BLE001 - any failure means: not cached
        return {}


def _compile_parallel(dispatcher, compile_any, signature):
    """``dispatcher.compile``: as Numba's (``compile_any``) where the cache holds
    ``signature`` or in ``"parallel"``; else :class:`NotCached`."""
    if _state.mode == PARALLEL or _in_index(dispatcher, signature):
        return compile_any(signature)
    raise NotCached(signature)


def _in_index(dispatcher, signature: tuple) -> bool:
    """Whether Numba's cache index of ``dispatcher`` holds ``signature``."""
    try:
        key = dispatcher._cache._index_key(signature, dispatcher.targetctx.codegen())
    except Exception:  # noqa: BLE001 - no disk cache to load from
        return False
    return key in _index(dispatcher)


class _State:
    """This process's tier, its tiered kernels and its background compiler."""

    def __init__(self) -> None:
        self.mode = AUTO
        self.background = True  # whether "auto" may start a background compiler
        self.kernels: list[TieredKernel] = []
        self.missing: dict[TieredKernel, list[tuple]] = {}  # waiting for the compiler
        self.sent: set[tuple[int, tuple]] = set()  # (id(kernel), signature), sent once
        self.compiler: subprocess.Popen | None = None
        self.errors = None  # the compiler's standard error, a temporary file
        self.compiling: dict[TieredKernel, list[tuple]] = {}  # the running compiler's job
        self.looked = 0.0  # time.monotonic() when the cache was last looked at
        self.failed: str | None = None  # how the last compiler ended, if it failed
        self.boundary: float | None = None  # time.monotonic() at the last step boundary
        self.remembered = False  # whether a kernel fell back to its serial tier since then

    def remember(self, kernel: TieredKernel, signature: tuple) -> None:
        self.remembered = True  # this step compiled or loaded the serial tier: not timed
        waiting = self.missing.get(kernel, [])
        if (id(kernel), signature) not in self.sent and signature not in waiting:
            self.missing[kernel] = [*waiting, signature]


_state = _State()


def set_tier(mode: str) -> None:
    """Run every kernel on its serial tier, its parallel tier, or each on the parallel one
    where it is cached (``"serial"``, ``"parallel"``, ``"auto"``; see the module's docstring).

    Raises
    ------
    ValueError
        For another ``mode``.
    """
    if mode not in TIERS:
        raise ValueError(f"mode must be one of {TIERS}, got {mode!r}")
    _state.mode = mode
    for kernel in _state.kernels:
        kernel.active = kernel.serial if mode == SERIAL else kernel.parallel


def set_background(enabled: bool) -> None:
    """Whether ``"auto"`` may start compiling processes (on by default): the background
    compiler, and the worker of a first step (:mod:`numpy_transformer.compile_ahead`). Off
    ends the background compiler."""
    _state.background = enabled
    if not enabled:
        stop_background()


def may_start_processes() -> bool:
    """Whether this process may start compiling processes: on the ``"auto"`` tier, unless
    :func:`set_background` turned them off."""
    return _state.mode == AUTO and _state.background


def poll(steps_left: int | None = None) -> None:
    """A step boundary: kernels whose parallel tier is now in the cache go parallel (looked
    up at most every ``POLL_SECONDS`` while the background compiler runs, and when it ends);
    if signatures are waiting and no compiler runs, one starts, unless ``steps_left`` (the
    steps the run makes from here, this one included, where the caller knows them) would
    take less than ``BACKGROUND_MIN_SECONDS`` at the pace of the last step, or no step that
    compiled nothing has been timed yet."""
    now = time.monotonic()
    step_seconds = None if _state.boundary is None or _state.remembered else now - _state.boundary
    _state.boundary, _state.remembered = now, False
    compiler = _state.compiler
    if compiler is not None:
        ended = compiler.poll() is not None
        if ended or time.monotonic() - _state.looked >= POLL_SECONDS:
            _state.looked = time.monotonic()
            for kernel, signatures in list(_state.compiling.items()):
                if all(_in_index(kernel.parallel, s) for s in signatures):
                    kernel.active = kernel.parallel  # loads from the cache at its next call
                    del _state.compiling[kernel]
        if ended:
            if compiler.returncode != 0:
                _state.errors.seek(0)
                last = _state.errors.read().decode(errors="replace").strip().splitlines()[-1:]
                _state.failed = f"exit status {compiler.returncode}" + "".join(
                    f": {line}" for line in last)
            _end_compiler()
    long_enough = steps_left is None or (
        step_seconds is not None and steps_left * step_seconds >= BACKGROUND_MIN_SECONDS)
    if (_state.compiler is None and _state.missing and _state.mode == AUTO and long_enough
            and _state.background and _state.failed is None and numba.get_num_threads() > 1):
        _start_compiler()


def describe() -> str:
    """What the kernels called so far run on, for a progress line ("" before any call)."""
    called = [k for k in _state.kernels if k.serial.overloads or k.parallel.overloads]
    if not called:
        return ""
    if all(k.active is k.parallel for k in called):
        return "kernels: parallel"
    if _state.compiler is not None:
        return "kernels: serial, parallel compiling in the background"
    if _state.failed is not None:
        return f"kernels: serial (the parallel compile failed, {_state.failed})"
    return "kernels: serial"


def background_compiler() -> subprocess.Popen | None:
    """The running background compiler, if any."""
    return _state.compiler


def _start_compiler() -> None:
    """Send the waiting signatures to a new background compiler."""
    job = [(k.__module__, k.__name__, signatures) for k, signatures in _state.missing.items()]
    _state.compiling = _state.missing
    _state.looked = time.monotonic()
    _state.sent.update((id(k), s) for k, signatures in _state.missing.items()
                       for s in signatures)
    _state.missing = {}
    _state.errors = tempfile.TemporaryFile()  # a pipe could fill
    # a session of its own: Ctrl-C at the terminal reaches this process only
    _state.compiler = subprocess.Popen([sys.executable, "-c", COMPILER], stdin=subprocess.PIPE,
                                       stdout=subprocess.DEVNULL, stderr=_state.errors,
                                       start_new_session=True)
    _state.compiler.stdin.write(base64.b64encode(pickle.dumps(job)) + b"\n")
    _state.compiler.stdin.flush()  # and kept open: the compiler watches it


def stop_background() -> None:
    """End the background compiler, if one runs, and wait for it."""
    compiler = _state.compiler
    if compiler is not None:
        compiler.kill()
        compiler.wait()
        _end_compiler()


def _end_compiler() -> None:
    """Close what this process kept of the ended compiler."""
    _state.compiler.stdin.close()
    _state.errors.close()
    _state.compiler, _state.errors, _state.compiling = None, None, {}


atexit.register(stop_background)


def exit_with_parent() -> None:
    """End this process as soon as its standard input reaches its end: the parent holds the
    pipe open until it dies, by any signal (a thread waits for that, beside the work)."""
    def wait_for_end() -> None:
        # on the file descriptor: a daemon thread blocked inside sys.stdin's buffer would hold
        # its lock, which the interpreter takes again at exit
        while os.read(sys.stdin.fileno(), 1 << 16):
            pass
        os._exit(1)

    threading.Thread(target=wait_for_end, daemon=True).start()


def compile_in_background() -> None:
    """The background compiler's job: the parallel tier of each signature sent on stdin (one
    line: base64 of a pickled ``[(module, kernel name, signatures), ...]``)."""
    job = pickle.loads(base64.b64decode(sys.stdin.buffer.readline()))
    exit_with_parent()
    set_tier(PARALLEL)
    for module, name, signatures in job:
        kernel = getattr(importlib.import_module(module), name)
        for signature in signatures:
            kernel.parallel.compile(signature)

"""The first training step on an empty Numba cache: what a user waits for whose kernels were
not compiled at install (an editable install, a wheel built on another CPU).

"Cold" means an empty Numba cache: the measurement runs in a fresh process whose
``NUMBA_CACHE_DIR`` is a new, empty temporary folder (deleted afterwards), so nothing compiled
before can be loaded, not even what the install compiled; the user's own cache is left alone.
"Warm" runs the same process again on the cache the cold run filled: it must load everything
and compile nothing, as a first step after ``pip install .`` does. The step is the default
``numpy-transformer train``'s (the chapter's model, float32, batch 64 x 100; or, with
``model="lstm"``, that of ``train --model lstm``), timed from building the model to the end of
``Trainer.step``.

* :func:`first_steps` -- the cold and the warm first step, and the second step after a warm
  start, each in a fresh process.
* :func:`compile_times` -- where the cold first step's compile time goes: the seconds of every
  function compiled, per signature, without the functions it compiled inside it (Numba's
  event API, ``numba.core.event``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .train_step import PACKAGE_PARENT

FIRST_STEP = r"""
import json, time
start = time.perf_counter()
from numpy_transformer.runs.options import resolve_options
from numpy_transformer.runs.state import Run
config_fields, options = resolve_options("lm", {"steps": 2, "model": MODEL})
run = Run(config_fields, options)
built = time.perf_counter()
run.trainer.step(run.batch(0))  # on a cold cache: compiles every kernel it calls
first = time.perf_counter()
run.trainer.step(run.batch(1))
second = time.perf_counter()
print(json.dumps({"build": built - start, "first_step": first - built,
                  "second_step": second - first}))
"""

# What of a warm first step is Numba's own: the first call, in a fresh process, of one small
# cached kernel (before it can load anything, Numba sets up its typing and lowering registries,
# which import SciPy's linalg)
FLOOR = r"""
import json, time
import numpy as np
from numpy_transformer.kernels.activations import relu_forward
x = np.ones(8, np.float32)
start = time.perf_counter()
relu_forward(x)
print(json.dumps({"floor": time.perf_counter() - start}))
"""

# Compile events nest (a kernel compiles the helpers it calls while it is typed), so each
# event's own time is its wall time minus that of the events inside it.
COMPILE_TIMES = r"""
import json, sys, time
from collections import defaultdict
from numba.core import event
own, stack = defaultdict(float), []

class Timer(event.Listener):
    def on_start(self, ev):
        stack.append([time.perf_counter(), 0.0])

    def on_end(self, ev):
        start, inner = stack.pop()
        seconds = time.perf_counter() - start
        d = ev.data["dispatcher"]
        module = d.py_func.__module__.rsplit(".", 1)[-1]
        own[f"{module}.{d.py_func.__name__}{ev.data['args']}"] += seconds - inner
        if stack:
            stack[-1][1] += seconds

event.register("numba:compile", Timer())
from numpy_transformer.runs.options import resolve_options
from numpy_transformer.runs.state import Run
config_fields, options = resolve_options("lm", {"steps": 1})
run = Run(config_fields, options)
run.trainer.step(run.batch(0))
print(json.dumps(own))
"""


def _python(code: str, cache: Path) -> str:
    """Run ``code`` in a fresh interpreter whose Numba cache is ``cache``; the last line it
    printed (its result; the training loop's own lines come before it)."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache),
           "PYTHONPATH": os.pathsep.join(p for p in (PACKAGE_PARENT,
                                                     os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=cache)
    if proc.returncode:
        raise RuntimeError(f"the first-step process failed:\n{proc.stderr}")
    return proc.stdout.splitlines()[-1]


def first_steps(warm: bool = True, model: str = "transformer") -> dict[str, float]:
    """Seconds of the first training step on an empty cache (``"cold"``), and, with ``warm``,
    on the cache that run filled (``"warm"``, and ``"second"``: the step after it; ``"floor"``:
    the first call of one small cached kernel, Numba's share of the warm step), each in a
    fresh process; ``"build"`` is building the run (model, data, optimiser) cold. ``model``
    is ``train --model``'s: the default run of the Transformer, or of the LSTM."""
    cache = Path(tempfile.mkdtemp(prefix="numba-cold-"))
    code = f"MODEL = {model!r}\n{FIRST_STEP}"
    try:
        cold = json.loads(_python(code, cache))
        result = {"build": cold["build"], "cold": cold["first_step"]}
        if warm:
            again = json.loads(_python(code, cache))
            result.update(warm=again["first_step"], second=again["second_step"],
                          floor=json.loads(_python(FLOOR, cache))["floor"])
        return result
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def compile_times() -> dict[str, float]:
    """``"module.function(signature)" -> seconds`` compiling it, for the cold first step,
    without the time of the functions compiled inside it."""
    cache = Path(tempfile.mkdtemp(prefix="numba-cold-"))
    try:
        return json.loads(_python(COMPILE_TIMES, cache))
    finally:
        shutil.rmtree(cache, ignore_errors=True)

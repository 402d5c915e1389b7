"""The kernels' on-disk cache (``cache=True``): a second process loads them and compiles nothing.

A training step of a Transformer and of an LSTM on the numba backend, on each of the kernels'
two tiers (``kernels/_tiers.py``), runs in a fresh interpreter twice, on the same Numba cache
(the package's own, which the rest of the test session fills). The first process may compile
what the cache lacks; the second must find everything there: Numba's event API
(``numba.core.event``) reports every compilation, and none may happen. Anything that breaks the
cache (a function that captures a pointer or a large global array, a kernel compiled for a type
that differs between runs) shows up here by name, not as half a minute more on every user's
first step.

The other way round, an edit must not go unnoticed: a kernel compiles into itself the
functions of ``kernels/blas.py`` and ``kernels/special.py`` (and the options of
``kernels/_jit.py``), and editing one of those files must recompile it
(``numpy_transformer/kernels/_jit.py``), as editing the kernel's own file does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy_transformer

# The start of a script: ``compiled`` collects "module.function" of everything compiled
COUNTING_COMPILES = r"""
import json
from numba.core import event

compiled = []

class Count(event.Listener):
    def on_start(self, ev):
        pass

    def on_end(self, ev):
        d = ev.data["dispatcher"]
        compiled.append(f"{d.py_func.__module__}.{d.py_func.__qualname__}")

event.register("numba:compile", Count())
"""

STEP_COUNTING_COMPILES = COUNTING_COMPILES + r"""
import numba
import numpy as np
from numpy_transformer.nn import LSTMLM, DecoderLM, LSTMConfig, TransformerConfig
from numpy_transformer.optim import Adam
from numpy_transformer.schedules import constant_lr
from numpy_transformer.kernels import _tiers
from numpy_transformer.train import Batch, Trainer

numba.set_num_threads(2)  # the parallel kernels on two threads
rng = np.random.default_rng(0)
ids = rng.integers(0, 11, size=(2, 8, 32))  # 8 x 32 = 256 rows: the chunked kernels' paths
for tier in (_tiers.SERIAL, _tiers.PARALLEL):  # each tier from its own cache entries
    _tiers.set_tier(tier)
    for model in (DecoderLM(TransformerConfig(vocab=11, width=16, heads=2, layers=1,
                                              ffn_width=32, max_len=32, activation="relu",
                                              dtype="float32", backend="numba")),
                  LSTMLM(LSTMConfig(vocab=11, hidden=8, embed=6, max_len=32, dtype="float32",
                                    backend="numba"))):
        trainer = Trainer(model, Adam(lr=1e-3, backend="numba"), constant_lr(1e-3), clip=1.0)
        trainer.step(Batch((ids[0],), ids[1]))
print(json.dumps(compiled))
"""


def compilations() -> list[str]:
    """The functions a fresh process compiled for one training step."""
    env_path = str(Path(numpy_transformer.__file__).parents[1])
    proc = subprocess.run([sys.executable, "-c", STEP_COUNTING_COMPILES], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": env_path},
                          timeout=900)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_a_second_process_loads_every_kernel_from_the_cache():
    compilations()  # fills the cache if it lacks anything
    assert compilations() == []


# Calls two kernels: the cross-entropy's (which compiles special.py's exp into itself) and the
# ReLU's (which uses nothing from another file); prints what it compiled
TWO_KERNELS = COUNTING_COMPILES + r"""
import numpy as np
import numpy_transformer
from numpy_transformer.kernels.activations import relu_forward
from numpy_transformer.kernels.softmax import cross_entropy_forward

rng = np.random.default_rng(0)
cross_entropy_forward(rng.standard_normal((4, 7)).astype(np.float32), rng.integers(0, 7, 4))
relu_forward(np.ones(5, np.float32))
print(json.dumps([numpy_transformer.__file__, compiled]))
"""


def test_editing_a_file_compiled_into_kernels_recompiles_them(tmp_path):
    source = Path(numpy_transformer.__file__).parent
    copy = tmp_path / "src" / "numpy_transformer"
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(copy.parent),
           "NUMBA_CACHE_DIR": str(tmp_path / "cache")}

    def compiled() -> set[str]:
        proc = subprocess.run([sys.executable, "-c", TWO_KERNELS], capture_output=True,
                              text=True, env=env, cwd=tmp_path, timeout=600)
        assert proc.returncode == 0, proc.stderr
        path, names = json.loads(proc.stdout.splitlines()[-1])
        assert Path(path).parent == copy  # the copy ran, not the installed package
        return set(names)

    def edit(name: str) -> None:  # a comment changes the file's content, and no more
        with open(copy / "kernels" / name, "a") as f:
            f.write("\n# edited by the test\n")

    cross_entropy = "numpy_transformer.kernels.softmax._cross_entropy_forward_kernel__serial"
    relu = "numpy_transformer.kernels.activations._relu_forward_kernel__serial"
    assert {cross_entropy, relu} <= compiled()  # an empty cache
    assert compiled() == set()
    edit("special.py")  # compiled into the cross-entropy kernel: it recompiles
    assert cross_entropy in compiled()
    edit("activations.py")  # a kernel's own file: that kernel alone
    assert compiled() == {relu}


def test_a_kernel_that_cannot_be_cached_is_warned_about():
    # Numba refuses to cache a function holding dynamic globals with a warning that names
    # the function's file, which it asks the locator for (kernels/_jit.py's wraps Numba's)
    import pytest
    from numba.core.errors import NumbaWarning

    from numpy_transformer.kernels import _jit
    from numpy_transformer.kernels.activations import _relu_forward_kernel

    impl = _relu_forward_kernel.serial._cache._impl
    assert isinstance(impl.locator, _jit.KernelCacheLocator)
    unfit = SimpleNamespace(lifted=(), library=SimpleNamespace(has_dynamic_globals=True),
                            fndesc=SimpleNamespace(qualname="relu_forward"))
    with pytest.warns(NumbaWarning, match="Cannot cache compiled function \"relu_forward\""):
        assert not impl.check_cachable(unfit)


def test_a_helper_of_the_kernels_refuses_a_call_from_python():
    # built without the wrapper for calls from Python (kernels/_jit.py): a call would run
    # code that is not there; the kernels call it, and so does a compiled function of a test
    import numba
    import numpy as np
    import pytest

    from numpy_transformer.kernels import _attention_kernels, _jit

    helper = _attention_kernels._key_piece
    assert isinstance(helper, _jit.CompiledOnly)
    with pytest.raises(TypeError, match="_key_piece is a helper of the compiled kernels"):
        helper(128, 64)
    assert numba.njit(lambda d, n: helper(d, n))(64, 128) == helper.py_func(64, 128)
    assert np.issubdtype(type(helper.py_func(64, 128)), np.integer)

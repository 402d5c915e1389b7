"""The kernels' on-disk cache: compiled once (at install, ``numpy_transformer/compile_kernels.py``),
then loaded by every process, wherever the package lies; and the parts of Numba the cache
leans on (``kernels/_jit.py``'s ``NUMBA_PRIVATE``), each still there.

The install's compile runs in a fresh interpreter on the package's own cache (which the rest
of the test session fills); then the package, its cache included, is copied to another folder
with new file times, as ``pip install`` lays a wheel out, and a fresh interpreter there runs
the first steps of the command line's default run (its evaluation and sample too), the
library's default model and the LSTM. Numba's event API (``numba.core.event``) reports every
compilation, and none may happen. Anything that breaks the cache (a function that captures a
pointer or a large global array, a kernel compiled for a type that differs between runs, a
key that holds a path or a file time) shows up here by name, not as a first step that
compiles on every user's machine.

The other way round, an edit must not go unnoticed: a kernel compiles into itself the
functions of ``kernels/blas.py`` and ``kernels/special.py`` (and the options of
``kernels/_jit.py``), and editing one of those files must recompile it, as editing the
kernel's own file does.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import numpy_transformer
from numpy_transformer.kernels import _jit

PACKAGE = Path(numpy_transformer.__file__).parent
# An environment that leaves Numba its own choice of cache: the one beside the kernels
ENV = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "PYTHONPATH")}

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

FIRST_STEPS = COUNTING_COMPILES + r"""
import numpy as np
import numpy_transformer
from numpy_transformer.config import LSTMConfig, TransformerConfig
from numpy_transformer.nn import LSTMLM, DecoderLM
from numpy_transformer.optim import Adam
from numpy_transformer.runs.options import resolve_options
from numpy_transformer.runs.sample import default_prompt
from numpy_transformer.runs.state import Run
from numpy_transformer.generate import generate
from numpy_transformer.schedules import constant_lr
from numpy_transformer.train import Batch, Trainer

run = Run(*resolve_options("lm", {"steps": 2}))  # the command line's default run
run.trainer.step(run.batch(0))
run.evaluate()
generate(run.model, np.asarray(run.tokenizer.encode(default_prompt(run.tokenizer))), 2)
ids = np.random.default_rng(0).integers(0, 11, size=(2, 8, 64))
for model in (DecoderLM(TransformerConfig(vocab=11, width=16, heads=2, layers=1, ffn_width=32,
                                          max_len=64, backend="numba")),  # the library's default
              LSTMLM(LSTMConfig(vocab=11, hidden=8, max_len=64, dtype="float32",
                                backend="numba"))):
    trainer = Trainer(model, Adam(lr=1e-3, backend="numba"), constant_lr(1e-3), clip=1.0)
    trainer.step(Batch((ids[0],), ids[1]))
print(json.dumps([numpy_transformer.__file__, compiled]))
"""


def python(code_or_module: list[str], package_parent: Path, cwd: Path) -> str:
    """The last line a fresh interpreter prints, with ``package_parent`` first on its path."""
    proc = subprocess.run([sys.executable, *code_or_module], capture_output=True, text=True,
                          env={**ENV, "PYTHONPATH": str(package_parent)}, cwd=cwd, timeout=900)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()[-1]


def test_after_the_install_compile_a_copy_anywhere_compiles_nothing(tmp_path):
    python(["-m", "numpy_transformer.compile_kernels"], PACKAGE.parent, tmp_path)
    site = tmp_path / "site"  # another path, and every file written anew: new file times
    shutil.copytree(PACKAGE, site / "numpy_transformer", copy_function=shutil.copy,
                    ignore=shutil.ignore_patterns("*.pyc"))
    path, compiled = json.loads(python(["-c", FIRST_STEPS], site, tmp_path))
    assert Path(path).parent == site / "numpy_transformer"  # the copy ran
    assert compiled == []


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
    copy = tmp_path / "src" / "numpy_transformer"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**ENV, "PYTHONPATH": str(copy.parent), "NUMBA_CACHE_DIR": str(tmp_path / "cache")}

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

    cross_entropy = "numpy_transformer.kernels.softmax._cross_entropy_forward_kernel"
    relu = "numpy_transformer.kernels.activations._relu_forward_kernel"
    assert {cross_entropy, relu} <= compiled()  # an empty cache
    assert compiled() == set()
    edit("special.py")  # compiled into the cross-entropy kernel: it recompiles
    assert cross_entropy in compiled()
    edit("activations.py")  # a kernel's own file: that kernel alone
    assert compiled() == {relu}


def resolve(dotted: str):
    """The object a dotted name names (module, then attributes); AttributeError or
    ImportError if Numba no longer has it."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            found = getattr(found, name)
        return found
    raise ImportError(dotted)


@pytest.mark.parametrize("names", list(_jit.NUMBA_PRIVATE))
def test_numba_still_has_what_the_cache_relies_on(names):
    found = []
    for dotted in names.split(" | "):
        try:
            found.append(resolve(dotted))
        except (ImportError, AttributeError):
            continue
    assert found, f"Numba no longer has {names}: {_jit.NUMBA_PRIVATE[names]}"


def test_the_kernels_are_cached_under_the_kernel_locator_and_its_stamp():
    from numba.core import caching

    from numpy_transformer.kernels.activations import _relu_forward_kernel

    locators = _jit._CacheImpl._locator_classes
    assert locators[0] is _jit.KernelCacheLocator
    assert issubclass(_jit.KernelCacheLocator, caching._CacheLocator)
    locator = _relu_forward_kernel._cache._impl.locator
    assert isinstance(locator, _jit.KernelCacheLocator)
    assert locator.get_source_stamp() == _jit.source_stamp(PACKAGE / "kernels" /
                                                           "activations.py")
    # Numba keeps the stamp in the index it writes and compares it when it reads
    assert _relu_forward_kernel._cache._cache_file._source_stamp == locator.get_source_stamp()


def test_a_kernel_that_cannot_be_cached_is_warned_about():
    # Numba refuses to cache a function holding dynamic globals with a warning that names
    # the function's file, which it asks the locator for (kernels/_jit.py's wraps Numba's)
    from numba.core.errors import NumbaWarning

    from numpy_transformer.kernels.activations import _relu_forward_kernel

    impl = _relu_forward_kernel._cache._impl
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

    from numpy_transformer.kernels import _attention_kernels

    helper = _attention_kernels._key_piece
    assert isinstance(helper, _jit.CompiledOnly)
    with pytest.raises(TypeError, match="_key_piece is a helper of the compiled kernels"):
        helper(128, 64)
    assert numba.njit(lambda d, n: helper(d, n))(64, 128) == helper.py_func(64, 128)
    assert np.issubdtype(type(helper.py_func(64, 128)), np.integer)

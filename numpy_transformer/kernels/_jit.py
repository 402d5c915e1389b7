"""The Numba options every compiled function of ``numpy_transformer/kernels`` starts from, and
the rule that keeps their on-disk cache fresh.

* ``cache=True``: compiled once per machine, then loaded from Numba's cache
  (``tests/test_compile_cache.py`` holds a second process to compiling nothing).
* ``nogil=True``: a kernel releases the GIL, so Python threads can run beside it.
* ``no_cfunc_wrapper=True``: Numba otherwise builds, next to each function, a wrapper that C
  code could call by address. Nothing here calls a kernel that way, and each such wrapper was
  compiled, then linked and optimised again into every kernel calling the function: leaving
  them out took 1.2 s off the first training step on an empty cache (``benchmarks/README.md``),
  and the compiled kernels are the same.

A function that only compiled code calls is a :func:`helper` (``@helper(_JIT)``): built
without the other wrapper too, the one that lets Python call a function. Numba makes, optimises
and compiles to machine code one for each function and signature: leaving them out of the 30
helpers took about 0.9 s off the default run's first step on an empty cache, compiled in one
process (10.7-11.3 s to 9.8-10.1 s, ``benchmarks/README.md``); the kernels that call them are
the same. A helper called from Python raises ``TypeError`` instead of running code that is not
there (the tests call the helpers they check through a compiled function of their own).

When the cache is stale
-----------------------
Numba decides whether a cached function is still valid from its own source file alone (a hash
of the file's content). But a kernel compiles into itself the functions it calls from other
files: ``gemm`` (``blas.py``) and the ``exp`` of ``special.py``, with the options of this file.
Edit one of those and Numba would go on loading the kernels built from the old text (a known
limitation of its cache, numba/numba#1833). So every function of this folder is cached under a
stamp of its own file *and* of ``SHARED_SOURCES``: :class:`KernelCacheLocator`, which this
module puts first in Numba's list of cache locators when it is imported (before any kernel is
decorated: every kernel module imports it first). It keeps Numba's choice of cache folder
(``NUMBA_CACHE_DIR``, the ``__pycache__`` beside the file, or the user's cache) and only widens
the stamp; functions outside this folder are left to Numba's own locators. Editing a shared
file therefore recompiles every kernel on the next run, as editing a kernel's own file
recompiles that file's functions. (With ``NUMBA_CACHE_LOCATOR_CLASSES`` set, Numba uses the
locators it names instead, and this rule does not apply.)
"""

from __future__ import annotations

import functools
import hashlib
import types
from collections.abc import Callable
from pathlib import Path

from numba import njit
from numba.core import caching
from numba.core.registry import CPUDispatcher

from ..config import KERNEL_MODULES

_FOLDER = Path(__file__).resolve().parent
# The files whose compiled functions or options may go into kernels of other files: every file
# of this folder that is not a kernel module (config.KERNEL_MODULES), so a new helper file is
# stamped without being listed (one that compiles nothing only costs a recompile when edited)
SHARED_SOURCES = tuple(sorted(path.name for path in _FOLDER.glob("*.py")
                              if path.stem not in KERNEL_MODULES))


def jit_options(**options) -> dict:
    """The common options above, with a module's own (``fastmath``, ``error_model``, ...)."""
    return dict(cache=True, nogil=True, no_cfunc_wrapper=True, **options)


class CompiledOnly(CPUDispatcher):
    """Numba's dispatcher of a :func:`helper`: compiled for calls from compiled code only."""

    def __call__(self, *args, **kwargs):
        raise TypeError(f"{self.py_func.__qualname__} is a helper of the compiled kernels, "
                        f"built without a wrapper for calls from Python: call it from a "
                        f"compiled function")


def helper(options: dict) -> Callable[[types.FunctionType], CompiledOnly]:
    """Decorator: the function compiled with ``options`` (a module's :func:`jit_options`) for
    calls from compiled code only (see the module's docstring)."""
    def compile_only(py_func: types.FunctionType) -> CompiledOnly:
        dispatcher = njit(no_cpython_wrapper=True, **options)(py_func)
        dispatcher.__class__ = CompiledOnly  # the same object, refusing calls from Python
        return dispatcher

    return compile_only


def shared_stamp() -> bytes:
    """SHA-256 of the contents of ``SHARED_SOURCES``, read now."""
    digest = hashlib.sha256()
    for name in SHARED_SOURCES:
        path = _FOLDER / name
        stat = path.stat()
        digest.update(_file_digest(str(path), stat.st_mtime_ns, stat.st_size))
    return digest.digest()


@functools.cache
def _file_digest(path: str, mtime_ns: int, size: int) -> bytes:
    # keyed on the file's time and size as well, so that a file edited while this process
    # runs is read again
    return hashlib.sha256(Path(path).read_bytes()).digest()


# Numba 0.68 names these without the leading underscore
_CacheImpl = getattr(caching, "CacheImpl", None) or caching._CacheImpl


class KernelCacheLocator(caching._CacheLocator):
    """Numba's cache locator for a function of this folder: the locator Numba would pick
    (``inner``), with :func:`shared_stamp` joined to its source stamp."""

    def __init__(self, inner: caching._CacheLocator) -> None:
        self._inner = inner

    @classmethod
    def from_function(cls, py_func, py_file):
        """The locator of ``py_func`` if its file ``py_file`` lies in this folder, else None
        (Numba then asks its own locators; so too when the shared files cannot be read, as
        from a zip archive)."""
        if (Path(py_file).resolve().parent != _FOLDER or not SHARED_SOURCES
                or not all((_FOLDER / name).is_file() for name in SHARED_SOURCES)):
            return None
        for other in _CacheImpl._locator_classes:
            inner = None if other is cls else other.from_function(py_func, py_file)
            if inner is not None:
                return cls(inner)
        return None

    def ensure_cache_path(self):
        self._inner.ensure_cache_path()

    def get_cache_path(self):
        return self._inner.get_cache_path()

    def get_disambiguator(self):
        return self._inner.get_disambiguator()

    def get_source_stamp(self):
        return self._inner.get_source_stamp(), shared_stamp()

    @property
    def _py_file(self) -> str:
        # the file Numba's warning names when it cannot cache a function (dynamic globals);
        # without it that warning raised AttributeError and stopped the compile
        return self._inner._py_file


if KernelCacheLocator not in _CacheImpl._locator_classes:
    _CacheImpl._locator_classes.insert(0, KernelCacheLocator)

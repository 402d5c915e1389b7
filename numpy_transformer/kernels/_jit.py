"""The Numba options every compiled function of ``numpy_transformer/kernels`` starts from, the
rule that keeps their on-disk cache fresh, and the one place this package leans on parts of
Numba that Numba does not document (:data:`NUMBA_PRIVATE`).

* ``cache=True``: compiled once per machine, when the package is installed
  (``numpy_transformer/compile_kernels.py``) or on a kernel's first call, then loaded from
  Numba's cache (``tests/test_compile_cache.py`` holds a second process to compiling nothing).
* ``nogil=True``: a kernel releases the GIL, so Python threads can run beside it.
* ``no_cfunc_wrapper=True``: Numba otherwise builds, next to each function, a wrapper that C
  code could call by address. Nothing here calls a kernel that way, and each such wrapper was
  compiled, then linked and optimised again into every kernel calling the function; the
  compiled kernels are the same without them.

A kernel that splits its work over threads (``prange``) is compiled with ``parallel=True``
as well: ``@njit(parallel=True, **_JIT)``. Every such kernel splits its work by rows, blocks or
heads, never by the thread count, and adds the items' partial sums in order afterwards, so
its results are the same bit for bit on any number of threads (``tests/test_threads.py``).

A function that only compiled code calls is a :func:`helper` (``@helper(_JIT)``): built
without the other wrapper too, the one that lets Python call a function, which Numba would
otherwise make, optimise and compile for each function and signature; the kernels that call
the helpers are the same. A helper called from Python raises ``TypeError`` instead of running
code that is not there (the tests call the helpers they check through a compiled function of
their own).

When the cache is stale
-----------------------
Numba decides whether a cached function is still valid from its own source file alone. But a
kernel compiles into itself the functions it calls from other files: ``gemm`` (``blas.py``)
and the ``exp`` of ``special.py``, with the options of this file. Edit one of those and Numba
would go on loading the kernels built from the old text (a known limitation of its cache,
numba/numba#1833). So every function of this folder is cached under a stamp of its own file
*and* of ``SHARED_SOURCES``, hashes of their contents: :class:`KernelCacheLocator`, which this
module puts first in Numba's list of cache locators when it is imported (before any kernel is
decorated: every kernel module imports it first). It keeps Numba's choice of cache folder
(``NUMBA_CACHE_DIR``, the ``__pycache__`` beside the file, or the user's cache) and replaces
only the stamp, which holds no file time and no path: a cache compiled at install time in the
build folder holds in the installed copy. Functions outside this folder are left to Numba's
own locators. Editing a shared file therefore recompiles every kernel on the next run, as
editing a kernel's own file recompiles that file's functions. (With
``NUMBA_CACHE_LOCATOR_CLASSES`` set, Numba uses the locators it names instead, and this rule
does not apply.)
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

# What of Numba this module relies on that Numba does not document, by dotted name (the first
# of a pair that resolves), and what for. Nothing else in the package touches any of it, and
# tests/test_compile_cache.py fails when Numba changes one
NUMBA_PRIVATE = {
    "numba.core.caching._CacheLocator": "the base class of KernelCacheLocator, and the five "
    "methods it defines: ensure_cache_path, get_cache_path, get_source_stamp, "
    "get_disambiguator, from_function",
    "numba.core.caching.CacheImpl._locator_classes | numba.core.caching._CacheImpl."
    "_locator_classes": "the list of locator classes Numba tries in order (named "
    "_CacheImpl before Numba 0.68)",
    "numba.core.caching.CacheImpl.locator | numba.core.caching._CacheImpl.locator":
    "a kernel's locator; its _py_file names the file in Numba's warning that it cannot cache",
    "numba.core.registry.CPUDispatcher": "the class of a dispatcher, which CompiledOnly "
    "subclasses and helper() assigns to one",
    "numba.core.options.DefaultOptions.no_cfunc_wrapper": "an option of njit (jit_options)",
    "numba.core.options.DefaultOptions.no_cpython_wrapper": "an option of njit (helper)",
}

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


def source_stamp(path: Path) -> bytes:
    """SHA-256 of the contents of ``path`` and of ``SHARED_SOURCES``, read now."""
    digest = hashlib.sha256()
    for file in (Path(path), *(_FOLDER / name for name in SHARED_SOURCES)):
        stat = file.stat()
        digest.update(_file_digest(str(file), stat.st_mtime_ns, stat.st_size))
    return digest.digest()


@functools.cache
def _file_digest(path: str, mtime_ns: int, size: int) -> bytes:
    # keyed on the file's time and size as well, so that a file edited while this process
    # runs is read again; the digest itself is of the contents alone
    return hashlib.sha256(Path(path).read_bytes()).digest()


# Numba 0.68 names these without the leading underscore
_CacheImpl = getattr(caching, "CacheImpl", None) or caching._CacheImpl


class KernelCacheLocator(caching._CacheLocator):
    """Numba's cache locator for a function of this folder: the locator Numba would pick
    (``inner``), with :func:`source_stamp` for its stamp."""

    def __init__(self, inner: caching._CacheLocator, py_file: str) -> None:
        self._inner, self._file = inner, py_file

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
                return cls(inner, py_file)
        return None

    def ensure_cache_path(self):
        self._inner.ensure_cache_path()

    def get_cache_path(self):
        return self._inner.get_cache_path()

    def get_disambiguator(self):
        return self._inner.get_disambiguator()

    def get_source_stamp(self):
        return source_stamp(Path(self._file))

    @property
    def _py_file(self) -> str:
        # the file Numba's warning names when it cannot cache a function (dynamic globals);
        # without it that warning raised AttributeError and stopped the compile
        return self._file


if KernelCacheLocator not in _CacheImpl._locator_classes:
    _CacheImpl._locator_classes.insert(0, KernelCacheLocator)

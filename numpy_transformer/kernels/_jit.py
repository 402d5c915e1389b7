"""The Numba options every compiled function of ``numpy_transformer/kernels`` starts from.

* ``cache=True``: compiled once per machine, then loaded from Numba's cache
  (``tests/test_compile_cache.py`` holds a second process to compiling nothing).
* ``nogil=True``: a kernel releases the GIL, so Python threads can run beside it.
* ``no_cfunc_wrapper=True``: Numba otherwise builds, next to each function, a wrapper that C
  code could call by address. Nothing here calls a kernel that way, and each such wrapper was
  compiled, then linked and optimised again into every kernel calling the function: leaving
  them out took 1.2 s off the first training step on an empty cache (``benchmarks/README.md``),
  and the compiled kernels are the same. (The other wrapper, which lets Python call a function,
  stays on every function, helpers included: a helper built without it crashes the interpreter
  when called from Python.)
"""

from __future__ import annotations


def jit_options(**options) -> dict:
    """The common options above, with a module's own (``fastmath``, ``error_model``, ...)."""
    return dict(cache=True, nogil=True, no_cfunc_wrapper=True, **options)

"""The checks every kernel runs before it enters compiled code.

Compiled code does not check its indices: a ``dout`` one column short is read past its end, an
output one row short is written past its end, and a kernel given a dtype it was not compiled
for may compile another version that reads the bytes as something else. So each public
function of ``numpy_transformer/kernels`` checks its arguments first, with these helpers and
the references' own checks (``numpy_transformer._checks`` and the ``check_*`` functions of
``functional/``): shapes, dtypes, flags and the type of a cache, each an O(1) comparison, and
a ``ValueError`` naming the argument. ``tests/test_kernel_inputs.py`` calls every kernel
with wrong shapes, wrong dtypes and empty arrays.

What the caches *hold* (token ids, target ids) is trusted as the forward made it: checking
every index again would cost a pass over them on every step.
"""

from __future__ import annotations

import numpy as np

from .._checks import check_float

# The dtypes the kernels are compiled for (float16 has no BLAS and little arithmetic in Numba)
KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def check_kernel_float(name: str, x: object,
                       ndim: int | tuple[int, ...] | None = None) -> np.ndarray:
    """:func:`~numpy_transformer._checks.check_float`, and float32 or float64 only."""
    check_float(name, x, ndim)
    if x.dtype not in KERNEL_DTYPES:
        raise ValueError(f"{name} must be float32 or float64 on the numba backend, got "
                         f"{x.dtype} (the numpy backend takes other float dtypes)")
    return x


def check_cache(cache: object, kind: type, forward: str) -> None:
    """Raise ``ValueError`` unless ``cache`` is a ``kind``, as ``forward`` returns."""
    if not isinstance(cache, kind):
        raise ValueError(f"cache must be the {kind.__name__} that {forward} returns, got "
                         f"{type(cache).__name__}")


def check_consistent(cache: object, ok: bool) -> None:
    """Raise ``ValueError`` unless ``ok``: the arrays of ``cache`` fit together (shapes,
    dtypes, layout), as the forward made them."""
    if not ok:
        raise ValueError(f"this {type(cache).__name__} was not made by the kernel's forward: "
                         f"its arrays do not fit together")

"""Keep freed buffers in the process instead of handing them back to the OS, or hand them back
at once (glibc only).

A training step allocates and frees the same few hundred arrays every time, several of them
megabytes (the FFN's hidden activations of the chapter's model: (6400, 168) float32), a few of
them far larger (at GPT-2's shape the tied table's two gradients, (50304, 768) float32 each,
and the output head's block of logits). By default glibc serves each allocation above
128 KiB straight from the OS (``mmap``) and unmaps it when it is freed, and returns freed heap
memory once 128 KiB lies unused at its top (``trim``), so the next step gets fresh pages again,
and the kernel zeroes and maps every one of them on first touch. On the benchmark machines
those page faults cost about a tenth of the chapter's step, and a third of the GPT-2 shape's
on a KVM guest, whose host takes freed pages back (``benchmarks/README.md`` has the
measurements).

:func:`reuse_freed_memory` turns ``mmap`` off for ``malloc`` (``M_MMAP_MAX`` = 0: every array
comes from the heap) and raises the trim threshold, so that freed memory stays in the heap
for the next step. Peak memory is the same arrays at the peak (the GPT-2 benchmark's peak
RSS with and without the setting is in ``benchmarks/README.md``); the process simply does
not shrink after it. It is a process-wide setting, so the library never calls it
on its own: the command line does, and so do the benchmarks.

:func:`release_freed_memory` is the other way round, once: every free page of the heap goes
back to the OS (``malloc_trim``). Building a large model draws each weight in float64 and
keeps its float32 cast, and the freed float64 arrays stay in the heap between the weights; a
loader calls it after building the model, before it reads the weights into it.
"""

from __future__ import annotations

import ctypes

_M_TRIM_THRESHOLD = -1  # mallopt parameter numbers, from glibc's malloc.h
_M_MMAP_MAX = -4


def reuse_freed_memory(trim_bytes: int = 1 << 30) -> bool:
    """Serve every allocation from the heap and keep up to ``trim_bytes`` freed there.

    Parameters
    ----------
    trim_bytes : int, default 2**30
        Freed memory at the top of the heap is returned to the OS only beyond this much.

    Returns
    -------
    bool
        Whether glibc accepted both settings (False on other C libraries: nothing changes).

    Raises
    ------
    ValueError
        If ``trim_bytes`` is not a positive integer that fits a C int.
    """
    if not isinstance(trim_bytes, int) or isinstance(trim_bytes, bool) or not (
            0 < trim_bytes < 2**31):
        raise ValueError(f"trim_bytes must be a positive integer below 2**31, got {trim_bytes!r}")
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, trim_bytes))


def release_freed_memory() -> bool:
    """Give every free page of the heap back to the OS (glibc's ``malloc_trim(0)``).

    Returns
    -------
    bool
        Whether memory was released (False on other C libraries: nothing changes).
    """
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))

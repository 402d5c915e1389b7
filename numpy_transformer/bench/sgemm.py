"""The machine's float32 matrix-product rate, measured: the ceiling a training step can reach.

A training step of a Transformer is mostly matrix products, so the rate at which this machine's
BLAS multiplies two large float32 matrices bounds the effective GFLOP/s of a step (what
:func:`numpy_transformer.bench.train_step.step_flops` counts, divided by the step's time).
"""

from __future__ import annotations

import statistics
import time


def sgemm_gflops(threads: int, size: int = 1024, repeats: int = 7) -> float:
    """GFLOP/s of ``a @ b`` for two (size, size) float32 matrices on ``threads`` BLAS threads.

    The median of ``repeats`` products after one warm-up, through NumPy's BLAS; every OpenBLAS
    of the process is set to ``threads`` threads for the measurement and back to one after
    (what the command line runs with, ``numpy_transformer.threads``).

    Parameters
    ----------
    threads : int
        BLAS threads, at least 1.
    size : int
        Side of the square matrices; 1024 is large enough for OpenBLAS's best kernels.
    repeats : int
        Products timed.

    Returns
    -------
    float
        ``2 size^3 / seconds / 1e9``.
    """
    import numpy as np

    from ..threads import set_blas_threads

    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((size, size), dtype=np.float32) for _ in range(2))
    out = np.empty_like(a)
    set_blas_threads(threads)
    try:
        np.matmul(a, b, out=out)
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            np.matmul(a, b, out=out)
            seconds.append(time.perf_counter() - start)
    finally:
        set_blas_threads(1)
    return 2 * size**3 / statistics.median(seconds) / 1e9

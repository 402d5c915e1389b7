"""The machine's float32 matrix-product rate, measured: the ceiling a training step can reach.

A training step of a Transformer is mostly matrix products, so the rate at which this machine's
BLAS multiplies float32 matrices bounds the effective GFLOP/s of a step (what
:func:`numpy_transformer.bench.configs.step_flops` counts, divided by the step's time).

* :func:`sgemm_gflops`: two large square matrices, the BLAS's best case.
* :func:`products_gflops`: the step's own shapes (:func:`.configs.products`), each timed and
  weighted by its FLOPs: the rate of a step that did nothing but its products. Small or thin
  products (an LSTM's recurrent ones, a narrow model's) run well below the square rate.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from .configs import products


def _median_seconds(product: Callable[[], object], threads: int, repeats: int) -> float:
    """Median time of ``product()`` after one warm-up, every OpenBLAS of the process on
    ``threads`` threads during the measurement and on one after (what the command line runs
    with, ``numpy_transformer.threads``)."""
    from ..threads import set_blas_threads

    set_blas_threads(threads)
    try:
        product()
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            product()
            seconds.append(time.perf_counter() - start)
    finally:
        set_blas_threads(1)
    return statistics.median(seconds)


def _timed_matmul(m: int, k: int, n: int, batch: int, threads: int, repeats: int) -> float:
    """Median seconds of ``(batch, m, k) @ (batch, k, n)`` in float32 through NumPy."""
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((batch, m, k), dtype=np.float32)
    b = rng.standard_normal((batch, k, n), dtype=np.float32)
    out = np.empty((batch, m, n), dtype=np.float32)
    return _median_seconds(lambda: np.matmul(a, b, out=out), threads, repeats)


def sgemm_gflops(threads: int, size: int = 1024, repeats: int = 7) -> float:
    """GFLOP/s of ``a @ b`` for two (size, size) float32 matrices on ``threads`` BLAS threads.

    The median of ``repeats`` products after one warm-up, through NumPy's BLAS.

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
    return 2 * size**3 / _timed_matmul(size, size, size, 1, threads, repeats) / 1e9


def products_gflops(config: dict, threads: int, repeats: int = 5) -> float:
    """GFLOP/s of one step's matrix products of ``config`` on ``threads`` BLAS threads.

    Each distinct shape of :func:`.configs.products` is timed through NumPy's BLAS (median of
    ``repeats`` after one warm-up); the rate is the step's product FLOPs over the time they
    take at those speeds, ``sum(flops) / sum(flops / rate)``: the rate of a step that did
    nothing else. A causal product is timed whole and charged its visible fraction.

    Parameters
    ----------
    config : dict
        A value of :data:`.configs.CONFIGS`.
    threads : int
        BLAS threads, at least 1.
    repeats : int
        Products timed per shape.

    Returns
    -------
    float
        The FLOP-weighted rate in GFLOP/s.
    """
    shapes = products(config)
    seconds = {}
    for p in shapes:
        key = (p.m, p.k, p.n, p.batch)
        if key not in seconds:
            seconds[key] = _timed_matmul(*key, threads, repeats)
    total = sum(p.flops for p in shapes)
    spent = sum(seconds[p.m, p.k, p.n, p.batch] * p.count * p.visible for p in shapes)
    return total / spent / 1e9

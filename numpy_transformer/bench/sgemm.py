"""The machine's float32 matrix-product rate, measured: the ceiling a training step can reach.

A training step of a Transformer is mostly matrix products, so the rate at which this machine's
BLAS multiplies float32 matrices bounds the effective GFLOP/s of a step (what
:func:`numpy_transformer.bench.configs.step_flops` counts, divided by the step's time).

* :func:`sgemm_gflops`: two large square matrices, the BLAS's best case.
* :func:`linear_operands`: the operands of a step's linear maps' products, each on arrays of
  its own, for timing them as the step meets them, NumPy's BLAS beside PyTorch's.
* :func:`products_gflops`: the step's own shapes (:func:`.configs.products`), each timed (on
  the given threads or on one, whichever is faster) and weighted by its FLOPs: the rate of a
  step that did nothing but its products. Small or thin
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


def product_seconds(config: dict, threads: int, repeats: int = 5) -> list[tuple]:
    """``(product, seconds)`` for each of :func:`.configs.products` of ``config``: the time
    all of the step's products of that shape take at the speed NumPy's BLAS multiplies it on
    ``threads`` threads, or on one where that is faster (median of ``repeats`` after one
    warm-up; each distinct shape timed once; a causal product timed whole and charged its
    visible fraction).

    Notes
    -----
    The faster of the two: the ceiling of a step on n cores is at least what one core does.
    OpenBLAS's own threads wait for each other at every product; on a machine loaded by
    other jobs they collapsed on small shapes (the chapter's, on 2 loaded cores: 1-3 GFLOP/s
    on 2 threads against 60 on one), while the kernels, which call the BLAS on one thread
    from each of their own threads, do not.
    """
    seconds = {}
    timed = []
    for p in products(config):
        key = (p.m, p.k, p.n, p.batch)
        if key not in seconds:
            seconds[key] = min(_timed_matmul(*key, n, repeats) for n in {1, threads})
        timed.append((p, seconds[key] * p.count * p.visible))
    return timed


def products_gflops(config: dict, threads: int, repeats: int = 5) -> float:
    """GFLOP/s of one step's matrix products of ``config`` on ``threads`` BLAS threads.

    The step's product FLOPs over the time they take at the speeds of
    :func:`product_seconds`, ``sum(flops) / sum(flops / rate)``: the rate of a step that did
    nothing but its products.

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
    timed = product_seconds(config, threads, repeats)
    return sum(p.flops for p, _ in timed) / sum(s for _, s in timed) / 1e9


def linear_operands(config: dict, framework: str = "numpy") -> list[tuple]:
    """``(a, b)`` pairs, one per product ``a @ b`` of the linear maps of one training step of
    ``config`` (every product of :func:`.configs.products` but attention's), float32 random.

    Each product has arrays of its own, as a step meets each layer's weights and activations
    afresh: timing them all in turn gives the time the step's linear maps need at the rate
    of ``framework`` (``"numpy"``, or ``"torch"``: the same numbers as tensors for
    ``torch.matmul``). Attention's products, causal and batched over heads, are left out: a
    step cannot take less time than these alone.
    """
    import numpy as np

    rng = np.random.default_rng(0)
    pairs = [(rng.standard_normal((p.m, p.k), dtype=np.float32),
              rng.standard_normal((p.k, p.n), dtype=np.float32))
             for p in products(config) if p.batch == 1 for _ in range(p.count)]
    if framework == "torch":
        import torch

        return [(torch.from_numpy(a), torch.from_numpy(b)) for a, b in pairs]
    return pairs

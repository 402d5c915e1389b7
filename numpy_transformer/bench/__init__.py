"""Benchmarks that ship with the package: what ``numpy-transformer bench`` runs, anywhere.

* :mod:`.train_step` -- one training step, ours against PyTorch eager, each variant in its own
  worker process, asked in turn for a few steps at a time (``benchmarks/bench_train_step.py``
  is its long form).
* :mod:`.cold_start` -- the first training step on an empty Numba cache, in a fresh process
  (``benchmarks/bench_cold_start.py`` adds import times and the compile time per kernel).
* :mod:`.real_machine` -- threads beside competing processes, and the first run after install
  (``numpy-transformer bench --busy N``; ``benchmarks/bench_real_machine.py`` is all of it).
* :mod:`.configs` -- the configurations, and the matrix products of their steps (the FLOP
  count of the effective GFLOP/s).
* :mod:`.sgemm` -- the machine's float32 matrix-product rate, square and at the step's own
  shapes: the ceiling for the step's effective GFLOP/s.
* :mod:`.machine` -- the CPU, its SIMD level and the BLAS kernels, and the warning when the
  BLAS runs kernels older than the CPU.
* :mod:`.summary` -- the short side-by-side table of ``numpy-transformer bench``.

Nothing here is imported by the library itself, and importing this package loads nothing.
"""

"""The short side-by-side table of ``numpy-transformer bench``.

For one configuration of :mod:`.train_step` (the chapter's model by default) it prints:

* the median training step, ours (numba backend) against PyTorch eager with its fused
  attention, measured in turn in two worker processes, and their ratio;
* above it, the CPU, its SIMD level and the BLAS kernels (:mod:`.machine`), with a one-line
  warning when the BLAS runs kernels older than the CPU supports;
* tokens per second and the effective GFLOP/s of each, and ours as a fraction of the rate of
  the step's own matrix products on this machine's BLAS (:mod:`.sgemm`), the ceiling;
* the first step in a fresh process: ours on an empty Numba cache (everything compiled) and on
  the cache that filled (:mod:`.cold_start`), PyTorch's;
* each worker's peak resident memory.

Without PyTorch the PyTorch column says so and the rest is printed all the same. With
``busy`` (``bench --busy N``) it prints instead the threads table of :mod:`.real_machine`: ours
and PyTorch's step on the default threads and on one, beside N competing CPU-bound processes.
Either way, a line warns when the machine was busy before the benchmark started.
"""

from __future__ import annotations

from ..threads import available_cores
from . import cold_start, real_machine, train_step
from .configs import CONFIGS, model_kind, step_flops
from .machine import machine_lines
from .sgemm import products_gflops, sgemm_gflops

QUICK = dict(warmup=1, steps=4, rounds=2)
FULL = dict(warmup=3, steps=20, rounds=4)


def run(config: str = "chapter", threads: int | None = None, quick: bool = False,
        busy: int | None = None) -> None:
    """Measure and print the table (see the module docstring).

    Parameters
    ----------
    config : str
        A key of :data:`.configs.CONFIGS`.
    threads : int, optional
        Threads for both frameworks (default: every core this process may use).
    quick : bool
        A few steps instead of twenty: a check that everything runs, numbers for a glance.
    busy : int, optional
        Competing CPU-bound processes: the threads table instead (``threads`` is then the
        default count, every core).

    Raises
    ------
    ValueError
        For an unknown configuration or a thread count below 1.
    """
    if config not in CONFIGS:
        raise ValueError(f"unknown configuration {config!r}; choose from "
                         f"{', '.join(CONFIGS)}")
    threads = available_cores() if threads is None else threads
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    counts = QUICK if quick else FULL
    torch = train_step.torch_installed()
    cfg = CONFIGS[config]
    lstm = model_kind(cfg) == "lstm"
    shape = (f"LSTM, hidden {cfg['model']['hidden']}" if lstm else
             f"{cfg['model']['layers']} layers, width {cfg['model']['width']}")
    print(f"numpy-transformer bench: config {config} ({shape}), batch {cfg['batch']} x "
          f"context {cfg['context']}, float32, "
          f"{threads} thread(s); median of {counts['steps']} steps after {counts['warmup']} "
          f"warm-up", flush=True)
    warning = real_machine.busy_line(real_machine.cores_in_use())
    print("\n".join(machine_lines() + ([warning] if warning else [])), flush=True)
    if busy is not None:
        real_machine.print_thread_rows(real_machine.thread_table(config, busy, **counts))
        return
    starts = cold_start.first_steps(model=model_kind(cfg))
    variants = [("ours", "numba", threads, threads)]
    if torch:
        variants.append(("torch", "torch" if lstm else "torch-sdpa", threads, threads))
    rates: list[float] = []
    workers = train_step.measure(config, variants, **counts,
                                 between=lambda: rates.append(products_gflops(cfg, threads)))
    ceiling = train_step.median(rates), sgemm_gflops(threads)
    ours = workers[0]
    theirs = workers[1] if torch else None
    print_summary(cfg, ours, theirs, starts, ceiling, threads)


def print_summary(cfg: dict, ours, theirs, starts: dict, ceiling: tuple[float, float],
                  threads: int) -> None:
    """The table itself; ``theirs`` is None without PyTorch. ``ceiling``: the GFLOP/s of the
    step's products at their own shapes (the median of those measured between the rounds)
    and of the square 1024^3 product."""
    flops, tokens = step_flops(cfg), cfg["batch"] * cfg["context"]
    step = train_step.median(ours.times)
    ref = train_step.median(theirs.times) if theirs else None
    missing = "not installed"

    def row(what: str, mine: str, other: str | None, ratio: str = "") -> None:
        print(f"| {what} | {mine} | {other if theirs else missing} | {ratio if theirs else ''} |")

    kind = "nn.LSTM" if model_kind(cfg) == "lstm" else "F.sdpa"
    print(f"\n| | ours (numba) | PyTorch eager ({kind}) | ours / PyTorch |\n|---|---:|---:|---:|")
    row("training step (ms)", f"{1e3 * step:.1f}", ref and f"{1e3 * ref:.1f}",
        ref and f"{step / ref:.2f}")
    row("tokens per second", f"{tokens / step:,.0f}", ref and f"{tokens / ref:,.0f}")
    row("effective GFLOP/s", f"{flops / step / 1e9:.1f}", ref and f"{flops / ref / 1e9:.1f}")
    row(f"fraction of the products' rate ({ceiling[0]:.0f} GFLOP/s)",
        f"{flops / step / 1e9 / ceiling[0]:.2f}", ref and f"{flops / ref / 1e9 / ceiling[0]:.2f}")
    row("first step, empty compile cache (s)", f"{starts['cold']:.2f}",
        theirs and f"{theirs.first_step:.2f}")
    row("first step, compiled kernels cached (s)", f"{starts['warm']:.2f}", "")
    row("peak RSS (MiB)", f"{ours.rss_mib:.0f}", theirs and f"{theirs.rss_mib:.0f}",
        theirs and f"{ours.rss_mib / theirs.rss_mib:.2f}")
    print(f"\nGFLOP/s count the step's matrix products (bench.configs.step_flops); the "
          f"products' rate is NumPy's BLAS on {threads} thread(s) at the step's own shapes "
          f"(bench.sgemm.products_gflops; float32 1024^3: {ceiling[1]:.0f} GFLOP/s). "
          f"First losses: ours "
          f"{ours.first_loss:.5f}" + (f", PyTorch {theirs.first_loss:.5f}" if theirs else "")
          + (". PyTorch: pip install torch" if not theirs else ""))

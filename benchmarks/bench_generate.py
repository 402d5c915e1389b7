"""Cached generation against recomputing the window every step.

Two configurations:

* ``chapter``: the course chapter's character model (max_len 100), 500 new tokens. Past 100
  tokens the cached default (``policy="refill"``) refills its cache from the last 50 tokens
  every 50 steps; the baseline is the chapter's sampler (``use_cache=False``,
  ``policy="recompute"``: a full forward over the last 100 tokens every step).
* ``long``: the same model with max_len 512, 500 new tokens from a 10-token prompt. The
  sequence never exceeds max_len, so both runs read the whole sequence and must produce the
  *same* tokens (checked); the baseline's cost per step grows with the sequence.

Run ``python benchmarks/bench_generate.py`` from the repository root. BLAS is pinned to one
thread (unless OPENBLAS_NUM_THREADS / OMP_NUM_THREADS are already set): these matrices are
tiny, and on a shared machine a multi-threaded BLAS mostly measures thread contention.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before NumPy loads its BLAS

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from numpy_transformer.generate import generate  # noqa: E402
from numpy_transformer.nn import DecoderLM, TransformerConfig  # noqa: E402


def chapter_config(max_len: int = 100) -> TransformerConfig:
    """The chapter's character model in float32 (132,488 parameters at max_len 100)."""
    return TransformerConfig(vocab=104, width=84, heads=4, layers=2, ffn_width=168,
                             max_len=max_len, activation="relu", embed_scale=True,
                             dtype="float32")


def time_pair(model, prompt, steps, repeats, baseline: dict, cached: dict):
    """Median wall times of the two ways to generate, and the ids of each last run.

    The runs alternate (baseline, cached, baseline, ...) after one warm-up of each, so a
    change in the machine's load hits both alike.
    """
    runs = {"baseline": baseline, "cached": cached}
    for options in runs.values():
        generate(model, prompt, min(steps, 20), np.random.default_rng(0), **options)
    times, ids = {name: [] for name in runs}, {}
    for _ in range(repeats):
        for name, options in runs.items():
            start = time.perf_counter()
            ids[name] = generate(model, prompt, steps, np.random.default_rng(0), **options)
            times[name].append(time.perf_counter() - start)
    return (float(np.median(times["baseline"])), float(np.median(times["cached"])),
            ids["baseline"], ids["cached"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompt", type=int, default=10, help="prompt length in tokens")
    args = parser.parse_args()

    cases = [("chapter", 100), ("long", 512)]
    print(f"{args.steps} new tokens from a {args.prompt}-token prompt, median of "
          f"{args.repeats} runs, BLAS threads {os.environ['OPENBLAS_NUM_THREADS']}")
    print("| config | max_len | recompute each step (s) | cached, refill (s) "
          "| ms/token recompute | ms/token cached | speedup |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, max_len in cases:
        model = DecoderLM(chapter_config(max_len))
        prompt = np.random.default_rng(1).integers(0, 104, args.prompt)
        slow, fast, slow_ids, fast_ids = time_pair(
            model, prompt, args.steps, args.repeats,
            baseline=dict(use_cache=False, policy="recompute"),  # the chapter's sampler
            cached=dict(use_cache=True, policy="refill"))  # the default
        if args.prompt + args.steps <= max_len:  # no window cut: the tokens must agree
            assert np.array_equal(slow_ids, fast_ids), f"{name}: cached ids differ"
        print(f"| {name} | {max_len} | {slow:.3f} | {fast:.3f} | "
              f"{1e3 * slow / args.steps:.2f} | {1e3 * fast / args.steps:.2f} | "
              f"{slow / fast:.1f}x |")


if __name__ == "__main__":
    main()

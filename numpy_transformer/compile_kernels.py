"""The kernels compiled once, when the package is installed.

``pip install .`` builds the package on the user's machine. Its build (``setup.py``) runs
``python -m numpy_transformer.compile_kernels`` on the built copy: the calls that a few small
models make in a training step, an evaluation and a sample (:data:`CASES`), so that Numba
compiles every kernel they call into its cache beside the kernels, ``kernels/__pycache__``,
which the installed package then holds. Numba files each compiled kernel under its signature,
this CPU's name and features, its bytecode, and the source stamp that ``kernels/_jit.py``'s
locator gives, a hash of the kernel files' contents: never the install path or a file time.
So the installed copy loads every kernel on its first call. A kernel no case covered, another
CPU (a wheel built on another machine), another Numba, or an editable install (whose build
compiles nothing) compiles on its first call instead, as Numba always does.

The cases are the default runs of the command line (the chapter's Transformer in float32, and
``train --model lstm``), the library's default ``TransformerConfig`` (float64, GELU), and the
shapes of GPT-2 (GELU's tanh form, learned positions, the head tied to a vocabulary wide
enough for the column-blocked gradient) and of LLaMA (RoPE, RMSNorm, SwiGLU, no biases,
grouped-query attention). Each case's batch has enough rows for the row-chunked kernels
(``kernels/linear.py``). ``tests/test_compile_cache.py`` holds a second process, after the
cases, to compiling nothing for the command line's default run.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from .config import LSTMConfig, TransformerConfig
from .generate import generate
from .nn.lstm import LSTMLM
from .nn.models import DecoderLM
from .optim import Adam, clip_grad_norm

_TINY = dict(width=16, heads=2, layers=1, ffn_width=32, max_len=32, backend="numba")
# name -> the model; each trains on 8 windows of 32 tokens (256 rows)
CASES = {
    "the command line's default run": lambda: DecoderLM(TransformerConfig(
        vocab=11, activation="relu", embed_scale=True, dtype="float32", **_TINY)),
    "the library's default TransformerConfig": lambda: DecoderLM(TransformerConfig(
        vocab=11, **_TINY)),
    "GPT-2's shape": lambda: DecoderLM(TransformerConfig(
        vocab=4099, activation="gelu_tanh", positions="learned", tie_embeddings=True,
        dtype="float32", **_TINY)),
    "LLaMA's shape": lambda: DecoderLM(TransformerConfig(
        vocab=11, positions="rope", norm="rmsnorm", activation="swiglu", bias=False,
        dtype="float32", **{**_TINY, "heads": 4, "kv_heads": 2})),
    "train --model lstm": lambda: LSTMLM(LSTMConfig(
        vocab=11, hidden=8, embed=6, max_len=32, dtype="float32", backend="numba")),
}


def run_case(model) -> None:
    """What a run calls with ``model``: a training step (forward and backward in one call,
    the clip, Adam's update), a held-out forward in evaluation mode, two sampled tokens."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.config.vocab, size=(8, 33))
    x, y = ids[:, :-1], ids[:, 1:]
    model.loss_and_backward(x, targets=y)
    named = list(model.named_parameters())
    grads = {n: g for n, _, g in named}
    clip_grad_norm(grads, 1.0)
    Adam(lr=1e-3, backend="numba").step({n: p for n, p, _ in named}, grads)
    model.eval()
    model.forward(x)
    generate(model, x[0, :4], 2, rng)


def compile_all(out=sys.stdout) -> float:
    """Run every case of :data:`CASES`, saying how long each took; returns the seconds."""
    start = time.perf_counter()
    for name, make in CASES.items():
        began = time.perf_counter()
        run_case(make())
        print(f"compiled the kernels of {name} ({time.perf_counter() - began:.1f} s)",
              file=out, flush=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    """``python -m numpy_transformer.compile_kernels``: :func:`compile_all`."""
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args(argv)
    print(f"compiled the kernels in {compile_all():.1f} s", flush=True)


if __name__ == "__main__":
    main()

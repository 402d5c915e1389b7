"""The kernels' two tiers (``numpy_transformer/kernels/_tiers.py``): the same bits, two cache
entries, and a background compiler that never outlives its run or breaks it."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numba
import numpy as np
import pytest

import numpy_transformer
from numpy_transformer.kernels import _tiers
from numpy_transformer.nn import LSTMLM, DecoderLM, LSTMConfig, TransformerConfig
from numpy_transformer.optim import Adam, AdamW
from numpy_transformer.schedules import constant_lr
from numpy_transformer.train import Batch, Trainer

PACKAGE_PARENT = str(Path(numpy_transformer.__file__).parents[1])
STEPS = 6
needs_two_threads = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2,
                                       reason="the parallel tier needs two threads")


def weights_hash(arrays) -> str:
    """SHA-256 of the arrays' bytes, in order."""
    digest = hashlib.sha256()
    for a in arrays:
        digest.update(np.ascontiguousarray(a).tobytes())
    return digest.hexdigest()


MODELS = {  # tiny, with 8 x 32 = 256 rows: the chunked kernels' paths
    "relu, layernorm": lambda: DecoderLM(TransformerConfig(
        vocab=11, width=16, heads=2, layers=1, ffn_width=32, max_len=32, activation="relu",
        dtype="float32", backend="numba")),
    "gelu, rmsnorm, rope": lambda: DecoderLM(TransformerConfig(
        vocab=11, width=16, heads=2, layers=1, ffn_width=32, max_len=32, activation="gelu",
        norm="rmsnorm", positions="rope", dtype="float32", backend="numba")),
    "lstm": lambda: LSTMLM(LSTMConfig(vocab=11, hidden=8, embed=6, max_len=32,
                                      dtype="float32", backend="numba")),
}


def trained_hash(model_name: str, switch_at: int | None) -> str:
    """The weights after STEPS steps on the serial tier up to step ``switch_at``, then on the
    parallel one (None: serial throughout), on two threads."""
    model = MODELS[model_name]()
    optimizer = (AdamW if model_name == "lstm" else Adam)(lr=1e-2, backend="numba")
    trainer = Trainer(model, optimizer, constant_lr(1e-2), clip=1.0)
    rng = np.random.default_rng(0)
    before = numba.get_num_threads()
    numba.set_num_threads(2)
    try:
        for step in range(STEPS):
            _tiers.set_tier(_tiers.PARALLEL if switch_at is not None and step >= switch_at
                            else _tiers.SERIAL)
            ids = rng.integers(0, 11, size=(8, 33))
            trainer.step(Batch((ids[:, :-1],), ids[:, 1:]))
    finally:
        numba.set_num_threads(before)
        _tiers.set_tier(_tiers.AUTO)
    return weights_hash(p for _, p in sorted(model.state_dict().items()))


@needs_two_threads
@pytest.mark.parametrize("model_name", MODELS)
def test_a_switch_at_any_step_gives_the_same_weights(model_name):
    hashes = {switch_at: trained_hash(model_name, switch_at) for switch_at in (0, 3, None)}
    assert len(set(hashes.values())) == 1, hashes


# A reduction over prange, which Numba splits by thread: each thread sums its share, then the
# shares are added. The negative control of the test above: its hash must tell the tiers apart.
@_tiers.tiered({"nogil": True})
def _sum_by_thread(x):  # pragma: no cover - compiled
    total = 0.0
    for i in numba.prange(x.size):
        total += x[i]
    return total


@needs_two_threads
def test_a_sum_split_by_thread_is_told_apart():
    x = np.ones(10_000)
    x[0], x[-1] = 1e17, -1e17  # in order the ones vanish into 1e17; split, half of them stay
    before = numba.get_num_threads()
    numba.set_num_threads(2)
    try:
        sums = []
        for tier in (_tiers.SERIAL, _tiers.PARALLEL):
            _tiers.set_tier(tier)
            sums.append(weights_hash([np.array(_sum_by_thread(x))]))
    finally:
        numba.set_num_threads(before)
        _tiers.set_tier(_tiers.AUTO)
    assert sums[0] != sums[1]

"""A first step on an empty Numba cache, compiled in two processes (``compile_ahead.py``).

A worker compiles the family's largest kernels while the calling process compiles the rest,
each by making the real step's calls with a model of its own on the numba backend limited to
its share (``backend.only_kernels``). Only if the two shares' signatures add up to those the
real run calls does the run load everything from the cache instead of compiling again: each
share runs in a fresh interpreter on the package's own Numba cache and reports every kernel it
called, with its signatures, and so does the real run (its step, held-out evaluation and
sample). A cold cache is tested for real once: the first ``Trainer.step`` through the library
compiles ahead, and then compiles nothing itself.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numba
import numpy as np
import pytest
from _kernel_helpers import COUNTING

import numpy_transformer
from numpy_transformer import backend, compile_ahead
from numpy_transformer.config import KERNEL_MODULES, KERNELS_VARIABLE, TransformerConfig
from numpy_transformer.kernels import _tiers
from numpy_transformer.nn import LSTMLM, DecoderLM
from numpy_transformer.optim import Adam
from numpy_transformer.schedules import constant_lr
from numpy_transformer.train import Batch, Trainer

PACKAGE_PARENT = str(Path(numpy_transformer.__file__).parents[1])

SIGNATURES = r"""
import importlib, json, sys
import numba
import numpy as np
from numpy_transformer.compile_ahead import _first_calls
from numpy_transformer.config import KERNEL_MODULES
from numpy_transformer.generate import generate
from numpy_transformer.kernels._tiers import SERIAL, TieredKernel, set_tier
from numpy_transformer.runs.options import resolve_options
from numpy_transformer.runs.sample import default_prompt
from numpy_transformer.runs.state import Run

task, given, kernels = json.loads(sys.argv[1])
run = Run(*resolve_options(task, given))
prompt = run.tokenizer and np.asarray(run.tokenizer.encode(default_prompt(run.tokenizer)))
set_tier(SERIAL)
if kernels is None:  # the real run: its first step, a held-out evaluation, a sample
    run.trainer.step(run.batch(0))
    run.evaluate()
    if prompt is not None:
        generate(run.model, prompt, 5, np.random.default_rng(1), temperature=0.8)
else:  # one share of compile_ahead
    _first_calls(type(run.model), run.config, run.sample_batch(), tuple(kernels), prompt, True)
called = {}
for name in KERNEL_MODULES:
    for attr, f in vars(importlib.import_module(f"numpy_transformer.kernels.{name}")).items():
        if isinstance(f, TieredKernel):  # the serial tier: what a compile ahead compiles
            f = f.serial
        if isinstance(f, numba.core.registry.CPUDispatcher) and f.signatures:
            called[f"{name}.{attr}"] = sorted(map(str, f.signatures))
print(json.dumps(called))
"""

RUNS = {  # the command line's default runs, and other shapes a run can take
    "default": ("lm", {"steps": 2}),
    "gelu, rms, rope, dropout": ("lm", {"steps": 2, "width": 16, "heads": 2, "layers": 1,
                                        "ffn_width": 32, "max_len": 32, "batch": 16,
                                        "activation": "gelu", "norm": "rmsnorm",
                                        "positions": "rope", "dropout": 0.1}),
    "lstm": ("lm", {"steps": 2, "model": "lstm"}),
    "encoder-decoder": ("reverse", {"steps": 2, "width": 16, "heads": 2, "layers": 1,
                                    "ffn_width": 32, "batch": 48}),
    "encoder classifier": ("sort", {"steps": 2, "width": 16, "heads": 2, "layers": 1,
                                    "ffn_width": 32, "batch": 48}),
}


def called_signatures(task: str, given: dict, kernels: tuple[str, ...] | None) -> dict:
    """{kernel: signatures} of one share's calls, or (``kernels`` None) of the real run's."""
    env = {**os.environ, "PYTHONPATH": PACKAGE_PARENT}
    env.pop(KERNELS_VARIABLE, None)
    proc = subprocess.run([sys.executable, "-c", SIGNATURES, json.dumps([task, given, kernels])],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def share_of(given: dict) -> tuple[str, ...]:
    """The worker's share of a run (every Transformer family has the attention's)."""
    return compile_ahead.FAMILIES[LSTMLM if given.get("model") == "lstm" else DecoderLM][0]


@pytest.mark.parametrize("name", RUNS)
def test_the_two_shares_compile_every_signature_the_run_calls(name):
    task, given = RUNS[name]
    share = share_of(given)
    by_shares: dict = {}
    for kernels in (share, compile_ahead.rest_of(share)):
        for kernel, signatures in called_signatures(task, given, kernels).items():
            by_shares.setdefault(kernel, set()).update(signatures)
    # After the two shares, the run finds each kernel it calls compiled or in the cache; a
    # helper of the kernels shows up here only if the run compiled a kernel again
    whole = called_signatures(task, given, None)
    assert whole and by_shares  # the run and the shares call kernels at all
    missing = {k: sorted(set(s) - by_shares.get(k, set())) for k, s in whole.items()}
    assert {k: s for k, s in missing.items() if s} == {}


def test_decoding_calls_the_attention_kernel_compiled_for_training():
    # One new token is a (B, H, 1, D) query, whose output views Numba once typed as another
    # layout than training's: 2.7 s of compiling at the report's sample on a cold cache.
    called = called_signatures("lm", {"steps": 2}, ("attention",))
    assert len(called["attention._sdpa_forward_kernel"]) == 1


def test_the_share_and_the_rest_name_every_kernel_once():
    for share, _ in compile_ahead.FAMILIES.values():
        named = [*share, *compile_ahead.rest_of(share)]
        assert len(named) == len(set(named)), share
        for module in KERNEL_MODULES:
            parts = {m.partition(".")[2] for m in named if m.partition(".")[0] == module}
            ops = importlib.import_module(f"numpy_transformer.kernels.{module}").__all__
            assert parts in ({""}, set(ops)), (share, module)  # whole, or all its operations
    assert compile_ahead.rest_of(("lstm.lstm_backward",))[:1] == ("activations",)
    assert "lstm.lstm_forward" in compile_ahead.rest_of(("lstm.lstm_backward",))
    assert "attention" not in compile_ahead.rest_of(("attention",))


def test_only_kernels_limits_the_backend_built_inside():
    with backend.only_kernels(("attention", "lstm.lstm_backward")):
        ops = backend.get_backend("numba")
    assert ops.sdpa_forward.__module__ == "numpy_transformer.kernels.attention"
    assert ops.lstm_backward.__module__ == "numpy_transformer.kernels.lstm"
    assert ops.lstm_forward.__module__ == "numpy_transformer.functional.lstm"
    assert ops.layer_norm_forward.__module__ == "numpy_transformer.functional.norms"
    whole = backend.get_backend("numba")  # outside the block: the whole backend again
    assert whole.layer_norm_forward.__module__ == "numpy_transformer.kernels.norms"
    with pytest.raises(ValueError, match="'attention.sdpa_forward' without"):
        with backend.only_kernels(("attention.sdpa_forward",)):
            pass
    assert backend.get_backend("numba") is whole


def test_an_empty_cache_counts_as_cold(tmp_path):
    code = ("from numpy_transformer.compile_ahead import is_cached; "
            "from numpy_transformer.nn import DecoderLM, LSTMLM; "
            "print(is_cached(DecoderLM, 'float32'), is_cached(LSTMLM, 'float64'))")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "PYTHONPATH": PACKAGE_PARENT}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"]


def test_a_filled_cache_counts_as_warm():
    called_signatures(*RUNS["default"], None)  # fills the package's cache if need be
    assert compile_ahead.is_cached(DecoderLM, "float32")


# --------------------------------------------------------------------------------------------
# compile_ahead in this process: the cache made to look cold, the worker for real (on the
# package's cache, where it loads more than it compiles)
# --------------------------------------------------------------------------------------------

@pytest.fixture
def cold(monkeypatch):
    """compile_ahead as on an empty cache with two cores, compiling processes allowed."""
    monkeypatch.setattr(compile_ahead, "is_cached", lambda model_class, dtype: False)
    monkeypatch.setattr(compile_ahead, "available_cores", lambda: 2)
    monkeypatch.setattr(compile_ahead, "_looked", set())
    _tiers.set_background(True)
    yield
    _tiers.set_background(False)  # the session's setting (tests/conftest.py)


def small_model(dropout: float = 0.0) -> DecoderLM:
    return DecoderLM(TransformerConfig(vocab=11, width=16, heads=2, layers=1, ffn_width=32,
                                       max_len=16, dropout=dropout, dtype="float32",
                                       backend="numba"))


def small_batch() -> Batch:
    ids = np.random.default_rng(0).integers(0, 11, size=(4, 17))
    return Batch((ids[:, :-1],), ids[:, 1:])


def trained(model: DecoderLM) -> str:
    """SHA-256 of the weights after two steps of a fresh trainer."""
    trainer = Trainer(model, Adam(lr=1e-2, backend="numba"), constant_lr(1e-2))
    for _ in range(2):
        trainer.step(small_batch())
    digest = hashlib.sha256()
    for _, p in sorted(model.state_dict().items()):
        digest.update(np.ascontiguousarray(p).tobytes())
    return digest.hexdigest()


def test_a_trainer_compiles_ahead_before_its_first_step_and_its_numbers_do_not_change(
        cold, monkeypatch):
    # with dropout: a compile ahead that drew from the model's generators would show here
    calls = []
    real = compile_ahead.compile_ahead
    monkeypatch.setattr(numpy_transformer.train, "compile_ahead",
                        lambda *a, **k: calls.append(real(*a, **k)) or calls[-1])
    ahead = trained(small_model(dropout=0.2))
    assert calls == ["compiled"]  # once, before the first step: the worker ran
    monkeypatch.setattr(compile_ahead, "_looked", set())
    _tiers.set_background(False)  # no compile ahead: the same numbers
    calls.clear()
    assert trained(small_model(dropout=0.2)) == ahead
    assert calls == [None]


def test_a_failed_worker_is_said_and_the_step_compiles_what_it_left(cold, monkeypatch):
    monkeypatch.setitem(compile_ahead.FAMILIES, DecoderLM,
                        (("no_such_module",), ("attention", "_sdpa_forward_kernel")))
    with pytest.warns(RuntimeWarning, match="the worker compiling no_such_module ended with "
                      "exit status 1 .*'no_such_module'.*the step compiles what it left"):
        trained(small_model())


def test_nothing_starts_on_the_numpy_backend_one_core_too_little_memory_or_twice(
        cold, monkeypatch):
    batch = small_batch()
    numpy_model = DecoderLM(TransformerConfig(vocab=11, width=16, heads=2, layers=1,
                                              ffn_width=32, max_len=16, backend="numpy"))
    assert compile_ahead.compile_ahead(numpy_model, batch) is None
    monkeypatch.setattr(compile_ahead, "available_memory", lambda: compile_ahead.WORKER_BYTES)
    assert compile_ahead.compile_ahead(small_model(), batch) is None
    assert compile_ahead.compile_ahead(small_model(), batch) is None  # looked once: not again
    monkeypatch.setattr(compile_ahead, "_looked", set())
    monkeypatch.setattr(compile_ahead, "available_memory", lambda: None)
    monkeypatch.setattr(compile_ahead, "available_cores", lambda: 1)
    assert compile_ahead.compile_ahead(small_model(), batch) is None
    monkeypatch.setattr(compile_ahead, "available_cores", lambda: 2)
    _tiers.set_background(False)
    assert compile_ahead.compile_ahead(small_model(), batch) is None
    _tiers.set_background(True)
    _tiers.set_tier(_tiers.SERIAL)  # a compile worker itself
    try:
        assert compile_ahead.compile_ahead(small_model(), batch) is None
    finally:
        _tiers.set_tier(_tiers.AUTO)
    assert compile_ahead.compile_ahead(small_model(), batch) == "compiled"  # the control


def test_a_stop_request_ends_the_worker_at_once(cold, monkeypatch):
    # SIGINT or SIGTERM during the compile: the training loop's handler makes stopping()
    # true, and the run must not wait for a worker that would compile for seconds
    monkeypatch.setattr(compile_ahead, "WORKER", "import time; time.sleep(60)")
    polls = []
    start = time.perf_counter()
    result = compile_ahead.compile_ahead(small_model(), small_batch(),
                                         stopping=lambda: polls.append(1) or len(polls) > 3)
    assert time.perf_counter() - start < 10 and len(polls) == 4
    assert result.startswith("the worker compiling attention ended with exit status -9")


# --------------------------------------------------------------------------------------------
# An empty cache for real
# --------------------------------------------------------------------------------------------

FIRST_STEP = COUNTING + r"""
from numpy_transformer import compile_ahead
from numpy_transformer.runs.options import resolve_options
from numpy_transformer.runs.state import Run

ahead = []
real = compile_ahead.compile_ahead
compile_ahead.compile_ahead = lambda *a, **k: ahead.append(real(*a, **k)) or ahead[-1]
import numpy_transformer.train
numpy_transformer.train.compile_ahead = compile_ahead.compile_ahead
run = Run(*resolve_options("lm", {"steps": 2, "width": 16, "heads": 2, "layers": 1,
                                  "ffn_width": 32, "max_len": 32, "batch": 8}))
real_step = compile_ahead._first_calls
def first_calls(*args):  # the compiles of this process's share are its own, not the step's
    real_step(*args)
    compiled.clear()
compile_ahead._first_calls = first_calls
run.trainer.step(run.batch(0))
print(json.dumps([ahead, compiled]))
"""


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="compiles ahead on two cores")
def test_on_an_empty_cache_the_first_step_compiles_nothing_itself(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "PYTHONPATH": PACKAGE_PARENT}
    env.pop(KERNELS_VARIABLE, None)
    proc = subprocess.run([sys.executable, "-c", FIRST_STEP], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    ahead, compiled = json.loads(proc.stdout.splitlines()[-1])
    assert ahead == ["compiled"]
    assert compiled == []  # the step loaded the worker's kernels and had the others

"""The compile workers of ``runs/precompile.py``: together they compile what a run calls.

A worker takes a run's first step on the numba backend limited to its group of kernels
(``NUMPY_TRANSFORMER_KERNELS``: kernel modules, or single operations of one). Only if the
groups' signatures add up to those of the whole backend does the run load everything from the
cache instead of compiling again. Each job runs in a fresh interpreter on the package's own
Numba cache and reports every function it called or compiled, with its signatures: the
kernels it calls from Python, and the helpers of any kernel it had to compile.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import numpy_transformer
from numpy_transformer.backend import KERNELS_VARIABLE, kernel_selection
from numpy_transformer.config import KERNEL_MODULES
from numpy_transformer.runs.precompile import GROUPS, is_cached, worker_env

SIGNATURES = r"""
import importlib, json, sys
import numba
from numpy_transformer.config import KERNEL_MODULES
from numpy_transformer.kernels._tiers import TieredKernel
from numpy_transformer.runs.options import resolve_options
from numpy_transformer.runs.precompile import work, worker_job
from numpy_transformer.runs.state import Run

task, given = json.loads(sys.argv[1])
work(worker_job(Run(*resolve_options(task, given))))
called = {}
for name in KERNEL_MODULES:
    for attr, f in vars(importlib.import_module(f"numpy_transformer.kernels.{name}")).items():
        if isinstance(f, TieredKernel):  # the workers compile the serial tier
            f = f.serial
        if isinstance(f, numba.core.registry.CPUDispatcher) and f.signatures:
            called[f"{name}.{attr}"] = sorted(map(str, f.signatures))
print(json.dumps(called))
"""

RUNS = {  # the command line's default runs, and other shapes a run can take
    "default": ("lm", {"steps": 2}),
    "gelu, rms, rope": ("lm", {"steps": 2, "width": 16, "heads": 2, "layers": 1,
                               "ffn_width": 32, "max_len": 32, "batch": 16,
                               "activation": "gelu", "norm": "rmsnorm", "positions": "rope"}),
    "lstm": ("lm", {"steps": 2, "model": "lstm"}),
    "encoder-decoder": ("reverse", {"steps": 2, "width": 16, "heads": 2, "layers": 1,
                                    "ffn_width": 32, "batch": 48}),
}


def called_signatures(task: str, given: dict, kernels: tuple[str, ...] | None) -> dict:
    """{kernel: signatures} of a worker's job, on all kernels or on those named."""
    env = worker_env(kernels) if kernels is not None else dict(os.environ)
    env["PYTHONPATH"] = str(Path(numpy_transformer.__file__).parents[1])
    if kernels is None:
        env.pop(KERNELS_VARIABLE, None)
    proc = subprocess.run([sys.executable, "-c", SIGNATURES, json.dumps([task, given])],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def uncovered(task: str, given: dict, groups: tuple) -> dict:
    """{kernel: signatures} the run calls that no group's worker compiled."""
    by_groups: dict = {}
    for group in groups:
        for kernel, signatures in called_signatures(task, given, group).items():
            by_groups.setdefault(kernel, set()).update(signatures)
    # After the workers, the run finds each kernel it calls in the cache; a helper of the
    # kernels shows up here only if the run compiled a kernel again, which fails the test.
    whole = called_signatures(task, given, None)
    assert whole  # the run calls kernels at all
    missing = {k: sorted(set(s) - by_groups.get(k, set())) for k, s in whole.items()}
    return {k: s for k, s in missing.items() if s}


@pytest.mark.parametrize("name", RUNS)
def test_the_groups_compile_every_signature_the_run_calls(name):
    task, given = RUNS[name]
    assert uncovered(task, given, GROUPS[given.get("model", "transformer")]) == {}


def test_the_groups_cover_the_kernel_modules():
    """Each model's groups name every kernel module of config.KERNEL_MODULES once: whole, or
    split into operations that together are its ``__all__``."""
    for model, groups in GROUPS.items():
        named = [m for group in groups for m in group]
        assert len(named) == len(set(named)), model
        for module in KERNEL_MODULES:
            parts = {m.partition(".")[2] for m in named if m.partition(".")[0] == module}
            if parts != {""}:  # split by operation
                ops = importlib.import_module(f"numpy_transformer.kernels.{module}").__all__
                assert parts == set(ops), (model, module)
        assert {m.partition(".")[0] for m in named} == set(KERNEL_MODULES), model
    assert GROUPS["lstm"][0] == ("lstm.lstm_backward",)  # the recurrence split by operation


def test_an_empty_cache_counts_as_cold(tmp_path):
    code = ("from numpy_transformer.runs.precompile import is_cached; "
            "print(is_cached('transformer', 'float32'), is_cached('lstm', 'float64'))")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path),
           "PYTHONPATH": str(Path(numpy_transformer.__file__).parents[1])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"]


def test_a_filled_cache_counts_as_warm():
    called_signatures(*RUNS["default"], None)  # fills the package's cache if need be
    assert is_cached("transformer", "float32")


def test_the_variable_names_kernel_modules_and_operations(monkeypatch):
    monkeypatch.setenv(KERNELS_VARIABLE, "attention, norms, lstm.lstm_backward")
    assert kernel_selection() == ("attention", "norms", "lstm.lstm_backward")
    monkeypatch.setenv(KERNELS_VARIABLE, "")
    assert kernel_selection() == ()
    for wrong in ("softmaxx", "lstm.lstm_backward.x", "lstmm.lstm_backward"):
        monkeypatch.setenv(KERNELS_VARIABLE, f"attention,{wrong}")
        with pytest.raises(ValueError, match=f"'{wrong}'"):
            kernel_selection()
    monkeypatch.delenv(KERNELS_VARIABLE)
    assert kernel_selection() == KERNEL_MODULES


OPERATIONS = r"""
import json, sys
from numpy_transformer import backend
ops = backend.get_backend("numba")
print(json.dumps({name: getattr(ops, name).__module__ for name in sys.argv[1:]}))
"""


def test_one_operation_of_a_module_takes_that_kernel_alone():
    env = {**worker_env(("lstm.lstm_backward", "embedding")),
           "PYTHONPATH": str(Path(numpy_transformer.__file__).parents[1])}
    names = ["lstm_backward", "lstm_forward", "embeddings_forward", "layer_norm_forward"]
    proc = subprocess.run([sys.executable, "-c", OPERATIONS, *names], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "lstm_backward": "numpy_transformer.kernels.lstm",
        "lstm_forward": "numpy_transformer.functional.lstm",
        "embeddings_forward": "numpy_transformer.kernels.embedding",
        "layer_norm_forward": "numpy_transformer.functional.norms"}
    env[KERNELS_VARIABLE] = "lstm.lstm_backwards"  # not an operation of the module
    proc = subprocess.run([sys.executable, "-c", OPERATIONS], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode != 0
    assert "'lstm.lstm_backwards'" in proc.stderr and "lstm_backward" in proc.stderr


def test_a_cold_cache_starts_one_worker_per_group(monkeypatch, capsys):
    # The workers for real (on the package's cache, where they load more than they compile):
    # the job reaches them whole, and each takes its step without an error.
    from numpy_transformer.runs import precompile as pc
    from numpy_transformer.runs.options import resolve_options
    from numpy_transformer.runs.state import Run

    monkeypatch.setattr(pc, "is_cached", lambda model, dtype: False)
    monkeypatch.setattr(pc, "available_cores", lambda: 2)
    run = Run(*resolve_options("lm", {"steps": 2, "model": "lstm", "batch": 8}))
    assert pc.precompile(run)
    out = capsys.readouterr().out
    assert "compiling the kernels in 2 processes" in out and "failed" not in out


def test_a_failed_worker_leaves_the_compiling_to_the_run(monkeypatch, capsys):
    from numpy_transformer.runs import precompile as pc
    from numpy_transformer.runs.options import resolve_options
    from numpy_transformer.runs.state import Run

    monkeypatch.setattr(pc, "is_cached", lambda model, dtype: False)
    monkeypatch.setattr(pc, "available_cores", lambda: 2)
    monkeypatch.setitem(pc.GROUPS, "lstm", (("lstm",), ("no_such_module",)))
    run = Run(*resolve_options("lm", {"steps": 2, "model": "lstm", "batch": 8}))
    assert pc.precompile(run)
    out = capsys.readouterr().out
    assert "the worker compiling no_such_module failed" in out and "'no_such_module'" in out


def test_nothing_starts_on_the_numpy_backend_one_core_or_too_little_memory(monkeypatch):
    from numpy_transformer.runs import precompile as pc
    from numpy_transformer.runs.options import resolve_options
    from numpy_transformer.runs.state import Run

    monkeypatch.setattr(pc, "is_cached", lambda model, dtype: False)
    run = Run(*resolve_options("lm", {"steps": 2, "model": "lstm", "backend": "numpy"}))
    assert not pc.precompile(run)
    run = Run(*resolve_options("lm", {"steps": 2, "model": "lstm", "batch": 8}))
    monkeypatch.setattr(pc, "available_memory", lambda: 2 * pc.WORKER_BYTES)  # < 2 workers
    assert not pc.precompile(run)
    monkeypatch.setattr(pc, "available_memory", lambda: None)
    monkeypatch.setattr(pc, "available_cores", lambda: 1)
    assert not pc.precompile(run)


def test_decoding_calls_the_attention_kernel_compiled_for_training():
    # One new token is a (B, H, 1, D) query, whose output views Numba once typed as another
    # layout than training's: 2.7 s of compiling at the report's sample on a cold cache.
    called = called_signatures("lm", {"steps": 2}, ("attention",))
    assert len(called["attention._sdpa_forward_kernel"]) == 1


def test_a_stop_request_ends_the_workers_at_once(monkeypatch):
    # SIGINT or SIGTERM during the compile: the training loop's handler makes stopping()
    # true, and the run must not wait for workers that would compile for a minute.
    import time

    from numpy_transformer.runs import precompile as pc
    from numpy_transformer.runs.options import resolve_options
    from numpy_transformer.runs.state import Run

    monkeypatch.setattr(pc, "is_cached", lambda model, dtype: False)
    monkeypatch.setattr(pc, "available_cores", lambda: 2)
    monkeypatch.setattr(pc, "WORKER", "import time; time.sleep(60)")
    run = Run(*resolve_options("lm", {"steps": 2, "model": "lstm", "batch": 8}))
    polls = []
    start = time.perf_counter()
    assert pc.precompile(run, stopping=lambda: polls.append(1) or len(polls) > 3)
    assert time.perf_counter() - start < 10 and len(polls) == 4

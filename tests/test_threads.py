"""Threads: the cores a process may use, Numba's threads set up for a machine shared with other
work (``numpy_transformer/threads.py``; their speed beside a competing process is a benchmark,
``benchmarks/bench_real_machine.py``, not a test), and the same weights bit for bit on any
number of threads."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest

import numpy_transformer
from numpy_transformer import threads
from numpy_transformer.nn import LSTMLM, DecoderLM, LSTMConfig, TransformerConfig
from numpy_transformer.optim import Adam, AdamW
from numpy_transformer.schedules import constant_lr
from numpy_transformer.train import Batch, Trainer

ROOT = str(Path(numpy_transformer.__file__).parents[1])


def cgroup_tree(tmp_path: Path, proc_line: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A fake ``/sys/fs/cgroup`` holding ``files`` (path -> content), and a fake
    ``/proc/self/cgroup`` of one line."""
    root = tmp_path / "cgroup"
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(content + "\n")
    proc = tmp_path / "proc_cgroup"
    proc.write_text(proc_line + "\n")
    return root, proc


@pytest.mark.parametrize("proc_line, files, cores", [
    ("0::/user/job", {"user/job/cpu.max": "150000 100000"}, 2),  # v2: 1.5 cores -> 2
    ("0::/user/job", {"user/job/cpu.max": "max 100000"}, None),  # v2: no limit
    ("0::/user/job", {"user/job/cpu.max": "max 100000", "user/cpu.max": "100000 100000"}, 1),
    ("0::/a", {"a/cpu.max": "400000 100000", "cpu.max": "200000 100000"}, 2),  # the smallest
    ("3:cpu,cpuacct:/docker/x", {"cpu,cpuacct/docker/x/cpu.cfs_quota_us": "50000",
                                 "cpu,cpuacct/docker/x/cpu.cfs_period_us": "100000"}, 1),  # v1
    ("3:cpu,cpuacct:/", {"cpu,cpuacct/cpu.cfs_quota_us": "-1",
                         "cpu,cpuacct/cpu.cfs_period_us": "100000"}, None),  # v1: no limit
    ("4:memory:/x", {"memory/x/cpu.max": "100000 100000"}, None),  # not the cpu controller
    ("0::/gone", {}, None),  # nothing to read
])
def test_the_cgroup_quota_in_cores(tmp_path, proc_line, files, cores):
    root, proc = cgroup_tree(tmp_path, proc_line, files)
    assert threads.cgroup_cores(root, proc) == cores


def test_no_proc_file_means_no_quota(tmp_path):
    assert threads.cgroup_cores(tmp_path, tmp_path / "missing") is None


def test_the_available_cores_are_at_most_the_quota(monkeypatch):
    affinity = len(os.sched_getaffinity(0))
    monkeypatch.setattr(threads, "cgroup_cores", lambda: None)
    assert threads.available_cores() == affinity
    monkeypatch.setattr(threads, "cgroup_cores", lambda: 1)
    assert threads.available_cores() == 1
    monkeypatch.setattr(threads, "cgroup_cores", lambda: affinity + 5)
    assert threads.available_cores() == affinity


def test_use_cores_makes_threads_wait_asleep_unless_the_environment_says(monkeypatch):
    before = numba.get_num_threads()
    monkeypatch.setattr(threads, "available_cores", lambda: 1)
    try:
        environ = {}
        assert threads.use_cores(environ) == 1 and numba.get_num_threads() == 1
        assert environ == {"OMP_WAIT_POLICY": "PASSIVE"}
        for name in threads.WAIT_VARIABLES:  # the user's own choice is kept
            environ = {name: "x"}
            threads.use_cores(environ)
            assert environ == {name: "x"}
        numba.set_num_threads(before)
        threads.use_cores({"NUMBA_NUM_THREADS": str(before)})  # the user's count is kept
        assert numba.get_num_threads() == before
    finally:
        numba.set_num_threads(before)


def test_use_cores_never_raises_a_thread_count_the_user_lowered(monkeypatch):
    before = numba.get_num_threads()
    monkeypatch.setattr(threads, "available_cores", lambda: numba.config.NUMBA_NUM_THREADS)
    try:
        numba.set_num_threads(1)  # a user who asked for one thread keeps one
        assert threads.use_cores({}) == 1
    finally:
        numba.set_num_threads(before)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs two Numba threads")
def test_a_call_of_few_rows_runs_on_the_calling_thread_alone():
    before = numba.get_num_threads()
    numba.set_num_threads(2)
    try:
        with threads.alone_below(threads.FEW_ROWS - 1):
            assert numba.get_num_threads() == 1
        assert numba.get_num_threads() == 2  # restored after the block
        with threads.alone_below(threads.FEW_ROWS):
            assert numba.get_num_threads() == 2
        with pytest.raises(RuntimeError), threads.alone_below(1):
            raise RuntimeError("a kernel that fails")
        assert numba.get_num_threads() == 2  # restored after an error too
    finally:
        numba.set_num_threads(before)


def test_the_numba_backend_sets_the_wait_policy_before_numba_starts_its_threads():
    # a fresh process: the setting must be in the environment when the OpenMP runtime loads
    code = ("import os, numba\n"
            "from numpy_transformer.backend import get_backend\n"
            "from numpy_transformer.threads import available_cores\n"
            "get_backend('numba')\n"
            "print(os.environ.get('OMP_WAIT_POLICY'), numba.get_num_threads() == min("
            "numba.config.NUMBA_NUM_THREADS, available_cores()))\n")
    env = {k: v for k, v in os.environ.items()
           if k not in (*threads.WAIT_VARIABLES, "NUMBA_NUM_THREADS")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**env, "PYTHONPATH": ROOT}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["PASSIVE", "True"]


# --------------------------------------------------------------------------------------------
# The same bits on any number of threads: every kernel splits its work by the shape, never by
# the thread count (kernels/_jit.py)
needs_two_threads = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2,
                                       reason="needs two Numba threads")
STEPS = 6
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


def weights_hash(arrays) -> str:
    """SHA-256 of the arrays' bytes, in order."""
    digest = hashlib.sha256()
    for a in arrays:
        digest.update(np.ascontiguousarray(a).tobytes())
    return digest.hexdigest()


def trained_hash(model_name: str, threads: list[int]) -> str:
    """The weights after STEPS steps, step i on ``threads[i]`` Numba threads."""
    model = MODELS[model_name]()
    optimizer = (AdamW if model_name == "lstm" else Adam)(lr=1e-2, backend="numba")
    trainer = Trainer(model, optimizer, constant_lr(1e-2), clip=1.0)
    rng = np.random.default_rng(0)
    before = numba.get_num_threads()
    try:
        for n in threads:
            numba.set_num_threads(n)
            ids = rng.integers(0, 11, size=(8, 33))
            trainer.step(Batch((ids[:, :-1],), ids[:, 1:]))
    finally:
        numba.set_num_threads(before)
    return weights_hash(p for _, p in sorted(model.state_dict().items()))


@needs_two_threads
@pytest.mark.parametrize("model_name", MODELS)
def test_the_weights_are_the_same_on_any_thread_count(model_name):
    hashes = {str(t): trained_hash(model_name, t)
              for t in ([1] * STEPS, [2] * STEPS, [1, 1, 1, 2, 2, 2])}
    assert len(set(hashes.values())) == 1, hashes


@needs_two_threads
@pytest.mark.parametrize("dropout", [False, True])
def test_the_attention_backward_gives_the_same_bits_on_any_thread_count(dropout):
    # one (batch, head) pair and three query blocks: the backward splits the head into chunks,
    # as many on one thread as on two; with dropout of the weights too
    from numpy_transformer.functional.activations import dropout_mask
    from numpy_transformer.functional.masks import causal_mask
    from numpy_transformer.kernels.attention import sdpa_backward, sdpa_forward

    rng = np.random.default_rng(1)
    q, k, v, dout = (rng.standard_normal((1, 2, 300, 8)).astype(np.float32) for _ in range(4))
    drop = dropout_mask((1, 2, 300, 300), 0.1, rng, np.float32) if dropout else None
    before = numba.get_num_threads()
    grads = []
    try:
        for threads in (1, 2):
            numba.set_num_threads(threads)
            _, cache = sdpa_forward(q, k, v, causal_mask(300), dropout=drop)
            grads.append(weights_hash(sdpa_backward(dout, cache)))
    finally:
        numba.set_num_threads(before)
    assert grads[0] == grads[1]


# A reduction over prange, which Numba splits by thread: each thread sums its share, then the
# shares are added. The negative control of the tests above: their hashes tell it apart.
@numba.njit(parallel=True, nogil=True)
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
    sums = []
    try:
        for threads in (1, 2):
            numba.set_num_threads(threads)
            sums.append(weights_hash([np.array(_sum_by_thread(x))]))
    finally:
        numba.set_num_threads(before)
    assert sums[0] != sums[1]

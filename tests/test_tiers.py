"""The kernels' two tiers (``numpy_transformer/kernels/_tiers.py``): the same bits, two cache
entries, and a background compiler that never outlives its run or breaks it."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numba
import numpy as np
import pytest
from _kernel_helpers import COUNTING

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


@needs_two_threads
def test_the_attention_backward_gives_the_same_bits_on_any_thread_count_and_tier():
    # one (batch, head) pair and three query blocks: the backward splits the head into chunks,
    # as many on one thread as on two
    from numpy_transformer.functional.masks import causal_mask
    from numpy_transformer.kernels.attention import sdpa_backward, sdpa_forward

    rng = np.random.default_rng(1)
    q, k, v, dout = (rng.standard_normal((1, 2, 300, 8)).astype(np.float32) for _ in range(4))
    before = numba.get_num_threads()
    grads = []
    try:
        for tier, threads in ((_tiers.SERIAL, 1), (_tiers.PARALLEL, 1), (_tiers.PARALLEL, 2)):
            _tiers.set_tier(tier)
            numba.set_num_threads(threads)
            _, cache = sdpa_forward(q, k, v, causal_mask(300))
            grads.append(weights_hash(sdpa_backward(dout, cache)))
    finally:
        numba.set_num_threads(before)
        _tiers.set_tier(_tiers.AUTO)
    assert len(set(grads)) == 1


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


# A module of its own, on a cache of its own: each tier reports which threads ran its items
THREAD_IDS = '''
import numba
import numpy as np
from numpy_transformer.kernels._jit import jit_options
from numpy_transformer.kernels._tiers import tiered


@tiered(jit_options())
def thread_ids(out):
    for i in numba.prange(out.size):
        out[i] = numba.get_thread_id()


# the negative control: two dispatchers of one function under one name share its cache entries
naive = {"parallel": numba.njit(parallel=True, cache=True)(thread_ids.__wrapped__),
         "serial": numba.njit(cache=True)(thread_ids.__wrapped__)}
'''

TWO_TIERS = COUNTING + r"""
from numpy_transformer.kernels import _tiers
from tiny_kernel import naive, thread_ids

numba.set_num_threads(2)
ran, naive_ran = {}, {}
for tier in ("serial", "parallel"):
    _tiers.set_tier(tier)
    out = np.zeros(1000, np.int64)
    thread_ids(out)
    ran[tier] = sorted(set(out.tolist()))
for tier in ("parallel", "serial"):
    out = np.zeros(1000, np.int64)
    naive[tier](out)
    naive_ran[tier] = sorted(set(out.tolist()))
print(json.dumps([compiled, ran, naive_ran]))
"""


@needs_two_threads
def test_the_tiers_keep_separate_cache_entries(tmp_path):
    (tmp_path / "tiny_kernel.py").write_text(THREAD_IDS)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{PACKAGE_PARENT}",
           "NUMBA_CACHE_DIR": str(tmp_path / "cache")}

    def run() -> list:
        proc = subprocess.run([sys.executable, "-c", TWO_TIERS], capture_output=True,
                              text=True, env=env, cwd=tmp_path, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.splitlines()[-1])

    right = {"serial": [0], "parallel": [0, 1]}
    compiled, ran, naive_ran = run()
    assert [name for name in compiled if name.startswith("thread_ids")] == [
        "thread_ids__serial", "thread_ids"]
    assert ran == right
    # the second process loads both tiers, each its own
    compiled, ran, naive_ran = run()
    assert [name for name in compiled if name.startswith("thread_ids")] == []
    assert ran == right
    # while the naive pair's serial dispatcher, in either process, found the parallel code
    # under its key and ran it
    assert naive_ran == {"serial": [0, 1], "parallel": [0, 1]}


# The background compiler for real, on the tiny kernel: started at a step boundary, and its
# end, however it comes, leaves the process running on the serial tier
BACKGROUND = r"""
import json, os, signal, sys, time
import numpy as np
from numpy_transformer.kernels import _tiers
from tiny_kernel import thread_ids

if sys.argv[1] == "sleeping":  # a compiler that outlives its parent unless it notices
    _tiers.COMPILER = ("import sys; from numpy_transformer.kernels._tiers import "
                       "exit_with_parent; sys.stdin.buffer.readline(); exit_with_parent(); "
                       "import time; time.sleep(120)")
out = np.zeros(100, np.int64)
thread_ids(out)  # auto: the cache lacks the parallel tier, so the serial one runs
_tiers.poll()  # a step boundary: the compiler starts
compiler = _tiers.background_compiler()
print(compiler.pid, _tiers.describe(), flush=True)
if sys.argv[1] == "sleeping":
    time.sleep(120)
compiler.send_signal(signal.SIGTERM)
compiler.wait()
_tiers.poll()
thread_ids(out)
print(json.dumps([_tiers.describe(), sorted(set(out.tolist()))]))
"""


SHORT_RUN = r"""
import json, time
import numpy as np
from numpy_transformer.kernels import _tiers
from tiny_kernel import thread_ids
_tiers.COMPILER = ("import sys; from numpy_transformer.kernels._tiers import "
                   "exit_with_parent; sys.stdin.buffer.readline(); exit_with_parent(); "
                   "import time; time.sleep(120)")
started = []
thread_ids(np.zeros(100, np.int64))  # the first step: the serial tier, its signature waits
for steps_left in (10**9, 100, 1000):  # the step before the first boundary compiled: untimed
    _tiers.poll(steps_left)
    started.append(_tiers.background_compiler() is not None)
    time.sleep(0.05)  # a step of 0.05 s: 100 more take 5 s, 1000 take 50
print(json.dumps(started))
"""


@needs_two_threads
def test_a_run_about_to_end_starts_no_compiler(tmp_path):
    (tmp_path / "tiny_kernel.py").write_text(THREAD_IDS)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{PACKAGE_PARENT}",
           "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", SHORT_RUN], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert _tiers.BACKGROUND_MIN_SECONDS == 10.0  # the 5 s and 50 s above straddle it
    # not after a step that compiled, nor with 5 s left; with 50 s left it starts
    assert json.loads(proc.stdout.splitlines()[-1]) == [False, False, True]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie has ended, and awaits its parent
        return stat.read().split(")")[-1].split()[0] != "Z"


@needs_two_threads
def test_a_terminated_compiler_leaves_the_run_on_the_serial_tier(tmp_path):
    (tmp_path / "tiny_kernel.py").write_text(THREAD_IDS)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{PACKAGE_PARENT}",
           "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", BACKGROUND, "terminated"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    first, last = proc.stdout.splitlines()
    pid, started = first.split(" ", 1)
    assert started == "kernels: serial, parallel compiling in the background"
    assert json.loads(last) == ["kernels: serial (the parallel compile failed, exit status "
                                f"{-signal.SIGTERM})", [0]]
    assert not _alive(int(pid))


@needs_two_threads
def test_a_compiler_ends_when_its_parent_is_killed(tmp_path):
    (tmp_path / "tiny_kernel.py").write_text(THREAD_IDS)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{PACKAGE_PARENT}",
           "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    parent = subprocess.Popen([sys.executable, "-c", BACKGROUND, "sleeping"],
                              stdout=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        pid = int(parent.stdout.readline().split()[0])
        assert _alive(pid)
    finally:
        parent.kill()  # kill -9: no atexit, no handler
        parent.wait()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


SWITCH = COUNTING + r"""
from numpy_transformer.kernels import _tiers
from tiny_kernel import thread_ids
numba.set_num_threads(2)


def ran() -> list:
    out = np.zeros(1000, np.int64)
    thread_ids(out)
    return sorted(set(out.tolist()))


seen = [ran()]  # auto: the serial tier where the cache lacks the parallel one
_tiers.poll()  # a step boundary: the compiler starts, if the cache lacks the parallel tier
compiler = _tiers.background_compiler()
if compiler is not None:
    compiler.wait()
    seen.append(ran())  # no step boundary yet: still serial
_tiers.poll()  # the tier is in the cache: the kernel switches
seen.append(ran())
print(json.dumps([seen, _tiers.describe(), [c for c in compiled if c.startswith("thread_ids")]]))
"""


@needs_two_threads
def test_the_kernel_switches_at_the_step_boundary_after_its_tier_is_cached(tmp_path):
    (tmp_path / "tiny_kernel.py").write_text(THREAD_IDS)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{PACKAGE_PARENT}",
           "NUMBA_CACHE_DIR": str(tmp_path / "cache")}

    def run() -> list:
        proc = subprocess.run([sys.executable, "-c", SWITCH], capture_output=True, text=True,
                              env=env, cwd=tmp_path, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.splitlines()[-1])

    # the parallel tier compiled in the background process, not in this one
    assert run() == [[[0], [0], [0, 1]], "kernels: parallel", ["thread_ids__serial"]]
    # a second run loads the parallel tier at its first call, and compiles nothing
    assert run() == [[[0, 1], [0, 1]], "kernels: parallel", []]


def test_the_progress_line_says_which_tier_runs(capsys):
    from numpy_transformer.kernels.activations import relu_forward
    from numpy_transformer.train import ProgressBar, StepRecord

    relu_forward(np.ones(4, np.float32))  # a tiered kernel called: the line names the tier
    bar = ProgressBar(total=1)
    bar.update(StepRecord(1, 2.0, 1e-3, 0.5, 1000.0))
    err = capsys.readouterr().err
    assert err.rstrip().endswith(_tiers.describe()) and "kernels: " in err


KILLED = r"""
import os, signal, sys, time
import numpy as np
from numpy_transformer.kernels import _tiers
from tiny_kernel import thread_ids

thread_ids(np.zeros(100, np.int64))
_tiers.poll()
compiler = _tiers.background_compiler()
time.sleep(float(sys.argv[1]))
os.kill(compiler.pid, signal.SIGKILL)  # at some point of its import or its compile
compiler.wait()
"""


@needs_two_threads
@pytest.mark.parametrize("after", [1.0, 2.5])
def test_a_compiler_killed_at_any_point_leaves_a_cache_that_works(tmp_path, after):
    (tmp_path / "tiny_kernel.py").write_text(THREAD_IDS)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{PACKAGE_PARENT}",
           "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    for script, args in ((KILLED, [str(after)]), (SWITCH, [])):
        proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                              text=True, env=env, cwd=tmp_path, timeout=300)
        assert proc.returncode == 0, proc.stderr
    seen, described, _ = json.loads(proc.stdout.splitlines()[-1])
    assert seen[-1] == [0, 1] and described == "kernels: parallel"

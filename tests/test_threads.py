"""``numpy_transformer/threads.py``: the cores a process may use, and Numba's threads set up
for a machine shared with other work (their speed under a competing process is a benchmark,
``benchmarks/bench_real_machine.py``, not a test)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numba
import pytest

import numpy_transformer
from numpy_transformer import threads

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

"""Running the command line in a subprocess, as a user would, under limits and signals: shared
by the tests of failures, exports and signals."""

from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def cli(*args, timeout: float = 120, preexec_fn=None, **popen) -> tuple[int, str, str]:
    """``python -m numpy_transformer ARGS`` in a subprocess: (exit code, stdout, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "numpy_transformer", *map(str, args)], env=env,
                       capture_output=True, text=True, timeout=timeout, preexec_fn=preexec_fn,
                       **popen)
    return r.returncode, r.stdout, r.stderr


def one_line(err: str) -> str:
    """The single stderr line of a refusal (asserting there is exactly one, no traceback)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def refused(code: int, err: str, expected_code: int, *patterns: str) -> None:
    line = one_line(err)
    assert code == expected_code, (code, err)
    for pattern in patterns:
        assert pattern in line, (pattern, line)


def honour_permissions():
    """As root, drop the capabilities that bypass file permissions in the child (CAP_DAC_
    OVERRIDE, CAP_DAC_READ_SEARCH), so chmod means what it says; skip if that is impossible."""
    if os.geteuid() != 0:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    probe = subprocess.run([sys.executable, "-c", "pass"],
                           preexec_fn=lambda: _drop_caps(libc), capture_output=True)
    if probe.returncode != 0:
        pytest.skip("running as root and cannot drop CAP_DAC_OVERRIDE")
    return lambda: _drop_caps(libc)


def _drop_caps(libc) -> None:
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def fsize_limit(limit: int):
    """A ``preexec_fn`` capping the size of any file the child writes (``ulimit -f``)."""
    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec

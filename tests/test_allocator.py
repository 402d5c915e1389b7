"""``allocator.reuse_freed_memory``: a process-wide glibc setting with a checked argument."""

from __future__ import annotations

import ctypes.util
import platform

import numpy as np
import pytest

from numpy_transformer.allocator import reuse_freed_memory


@pytest.mark.parametrize("bad", [0, -5, 2**31, 1.5, True, "1"])
def test_bad_trim_size_is_rejected_by_name(bad):
    with pytest.raises(ValueError, match="trim_bytes"):
        reuse_freed_memory(bad)


def test_glibc_accepts_the_settings_and_arrays_still_work():
    applied = reuse_freed_memory()
    if platform.system() == "Linux" and "libc" in (ctypes.util.find_library("c") or ""):
        assert applied is True
    else:
        assert applied is False
    a = np.arange(2_000_000, dtype=np.float32)  # 8 MB: now from the heap
    b = a * 2
    del a
    c = np.ones(2_000_000, dtype=np.float32)  # may reuse a's freed memory
    assert b[-1] == 3_999_998 and c.sum() == 2_000_000


_REFAULTS = """
import resource, sys
import numpy as np
from numpy_transformer.allocator import reuse_freed_memory
if sys.argv[1] == "reuse":
    reuse_freed_memory()
faults = []
for _ in range(3):  # a step's large buffer, 96 MiB: allocated, written, freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.empty(24 * 2**20, dtype=np.float32)
    a.fill(1.0)
    del a
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(faults[-1])
"""


@pytest.mark.skipif(platform.system() != "Linux" or "libc" not in (ctypes.util.find_library("c")
                                                                   or ""), reason="glibc only")
def test_a_large_buffer_allocated_again_is_not_faulted_in_again():
    """With the setting, the third 96 MiB buffer reuses the memory of the first: no page
    faults. Without it (the control), each one is a fresh mapping, faulted in again."""
    import subprocess
    import sys

    faults = {mode: int(subprocess.run([sys.executable, "-c", _REFAULTS, mode], check=True,
                                       capture_output=True, text=True).stdout)
              for mode in ("reuse", "default")}
    assert faults["default"] >= 40, faults  # 96 MiB: 48 huge pages or 24,576 small ones
    assert faults["reuse"] <= faults["default"] // 10, faults

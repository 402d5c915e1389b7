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

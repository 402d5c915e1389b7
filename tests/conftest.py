"""The session's kernel tiers (``numpy_transformer/kernels/_tiers.py``).

Every test shares the package's own Numba cache (``__pycache__`` beside the kernels), unless it
tests a cold one in a folder of its own. In this process the kernels run on whichever tier the
cache holds (both give the same bits) and compile the serial one where it holds neither; no
background compiler starts here (``tests/test_tiers.py`` starts its own). The command lines
the tests run start theirs as a user's would, and fill the shared cache with the parallel tier.
"""

from __future__ import annotations

import pytest

from numpy_transformer.kernels import _tiers

_tiers.set_background(False)


@pytest.fixture
def parallel_tier():
    """Every kernel on its parallel tier (compiled here if the cache lacks it), for a test of
    the parallel code itself; the session's tier again afterwards."""
    _tiers.set_tier(_tiers.PARALLEL)
    yield
    _tiers.set_tier(_tiers.AUTO)

"""What the benchmarks say about the machine (``numpy_transformer.bench.machine``): the CPU's SIMD
level, the BLAS kernels, and the one-line warning when those are older than the CPU. The pure
functions take injected records; one test loads OpenBLAS with ``OPENBLAS_CORETYPE`` forcing an
older kernel, in a subprocess, as a user's environment would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import numpy_transformer
from numpy_transformer.bench import machine

AVX512 = {"SSE2": True, "SSE3": True, "SSE42": True, "AVX": True, "AVX2": True, "FMA3": True,
          "AVX512_SKX": True}
AVX2 = {**AVX512, "AVX512_SKX": False}


def openblas(architecture: str) -> dict:
    """A record as threadpoolctl gives it for a wheel's OpenBLAS."""
    return {"user_api": "blas", "internal_api": "openblas", "version": "0.3.31",
            "architecture": architecture, "num_threads": 2,
            "filepath": "/venv/site-packages/numpy.libs/libscipy_openblas64_.so"}


def test_simd_level_is_the_newest_complete_one():
    assert machine.simd_level(AVX512) == "AVX-512"
    assert machine.simd_level(AVX2) == "AVX2"
    assert machine.simd_level({**AVX2, "FMA3": False}) == "AVX"  # AVX2 needs FMA3 too
    assert machine.simd_level({"SSE2": True}) == "SSE2"
    assert machine.simd_level({"NEON": True, "ASIMD": True}) is None  # not x86


def test_haswell_kernels_on_an_avx512_cpu_are_named_with_the_variable():
    libs = [openblas("Haswell")]
    forced = machine.kernel_warning(libs, AVX512, {"OPENBLAS_CORETYPE": "Haswell"})
    assert forced is not None and "\n" not in forced
    assert "Haswell (AVX2)" in forced and "AVX-512" in forced
    assert "OPENBLAS_CORETYPE=Haswell" in forced
    detected = machine.kernel_warning(libs, AVX512, {})
    assert detected is not None and "OPENBLAS_CORETYPE" not in detected  # not the cause


@pytest.mark.parametrize("libs, features", [
    ([openblas("SkylakeX")], AVX512),  # native kernels
    ([openblas("Cooperlake")], AVX512),  # also AVX-512
    ([openblas("Haswell")], AVX2),  # Haswell is what an AVX2 CPU gets
    ([openblas("NeoverseN1")], AVX512),  # kernels this table does not know: no judgement
    ([{**openblas("Haswell"), "internal_api": "mkl"}], AVX512),  # not OpenBLAS
    ([openblas("Haswell")], {"NEON": True}),  # not an x86 CPU
])
def test_no_warning_when_the_kernels_match_the_cpu(libs, features):
    assert machine.kernel_warning(libs, features, {"OPENBLAS_CORETYPE": "x"}) is None


def test_blas_line_names_each_library_its_kernels_and_threads():
    line = machine.blas_line([openblas("SkylakeX")], "numpy")
    assert "numpy's openblas 0.3.31, SkylakeX kernels, 2 thread(s)" in line
    assert "the numba kernels call numpy's" in line
    assert machine.blas_line([], "numpy") == "BLAS: none found by threadpoolctl"


def _older_coretype() -> str:
    """An OpenBLAS core name older than this CPU's SIMD level, or skip."""
    if not any(lib["internal_api"] == "openblas" for lib in machine.blas_libraries()):
        pytest.skip("NumPy's BLAS is not OpenBLAS")
    older = {"AVX-512": "Haswell", "AVX2": "Sandybridge", "AVX": "Nehalem"}
    level = machine.simd_level(machine.cpu_features())
    if level not in older:
        pytest.skip(f"no older OpenBLAS kernel to force on a CPU with {level}")
    return older[level]


def _machine_lines(coretype: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    env["PYTHONPATH"] = str(Path(numpy_transformer.__file__).parents[1])
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    out = subprocess.run([sys.executable, "-m", "numpy_transformer.bench.machine"], env=env,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return out.splitlines()


def test_a_forced_older_kernel_is_warned_about_and_named():
    coretype = _older_coretype()
    lines = _machine_lines(coretype)
    assert f"{coretype} kernels" in lines[1]  # the BLAS line shows what runs
    warnings = [line for line in lines if line.startswith("warning:")]
    assert len(warnings) == 1 and f"OPENBLAS_CORETYPE={coretype}" in warnings[0]
    unset = _machine_lines(None)  # the control: OpenBLAS's own choice, nothing to blame
    assert not any("OPENBLAS_CORETYPE" in line for line in unset)

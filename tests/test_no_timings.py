"""No timings or measured sizes in the package's code, comments and docstrings.

A number measured on one machine goes stale where it is written into the code: a comment says
"0.4 ms per step" long after the step changed. Measurements live in ``benchmarks/README.md``,
with the machine and the command that made them; the code says what it does and why, and
points there. ``numpy_transformer/bench/`` is the exception: it is the code that measures, and
its messages print units.
"""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "numpy_transformer"
MEASURED = re.compile(r"\d+(\.\d+)? ?(ms|s|GB|MB|MiB|GiB)\b")
EXEMPT = "bench"  # the subpackage that measures


def timings(package: Path) -> list[str]:
    """``file:line: text`` of every line of the package's ``.py`` files (``bench/`` aside)
    that states a time or a size in those units."""
    hits = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package.parent)
        if relative.parts[1] == EXEMPT:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if MEASURED.search(line):
                hits.append(f"{relative.as_posix()}:{number}: {line.strip()}")
    return hits


def test_the_package_states_no_timings_or_sizes():
    hits = timings(PACKAGE)
    assert not hits, ("measurements belong in benchmarks/README.md, not in the code:\n"
                      + "\n".join(hits))


def test_the_grep_finds_a_timing_and_passes_over_bench(tmp_path):
    # negative control: a package with a timing in a comment, a size in a docstring and a
    # plain number, and the same timing inside bench/
    package = tmp_path / "numpy_transformer"
    (package / "bench").mkdir(parents=True)
    (package / "kernels").mkdir()
    (package / "kernels" / "fast.py").write_text(
        '"""One pass: 51 MB less."""\nx = 2  # 0.4 ms per step\ny = 3  # 3 steps, 2 layers\n',
        encoding="utf-8")
    (package / "bench" / "timer.py").write_text("t = 1  # 0.4 ms\n", encoding="utf-8")
    assert timings(package) == ['numpy_transformer/kernels/fast.py:1: """One pass: 51 MB less."""',
                                "numpy_transformer/kernels/fast.py:2: x = 2  # 0.4 ms per step"]
    assert [bool(MEASURED.search(s)) for s in ("1.5 s", "12MiB", "3 GiB", "10 steps", "2 ms.",
                                               "x1 = s", "1 sec")] == [
        True, True, True, False, True, False, False]

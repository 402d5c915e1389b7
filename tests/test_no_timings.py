"""No timings or measured sizes in the package's code, comments and docstrings, nor in the
README; the README and ``benchmarks/README.md`` stay short.

A number measured on one machine goes stale where it is written into the code: a comment says
"0.4 ms per step" long after the step changed. Measurements live in ``benchmarks/README.md``,
with the machine and the command that made them, today's tables first; the code says what it
does and why, and points there. ``numpy_transformer/bench/`` is the exception: it is the code
that measures, and its messages print units. The README is the front door: at most 150 lines,
its costs said in words; ``benchmarks/README.md`` at most 250, older runs left to git.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "numpy_transformer"
LONGEST = {"README.md": 150, "benchmarks/README.md": 250}  # lines
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


def too_long(files: dict[str, int], root: Path) -> list[str]:
    """``file: N lines, at most M`` of each file longer than its limit."""
    counts = {name: len((root / name).read_text(encoding="utf-8").splitlines()) for name in files}
    return [f"{name}: {counts[name]} lines, at most {limit}" for name, limit in files.items()
            if counts[name] > limit]


def test_the_readme_and_the_benchmarks_stay_short_and_the_readme_states_no_timing(tmp_path):
    assert too_long(LONGEST, ROOT) == []
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert [line for line in readme.splitlines() if MEASURED.search(line)] == []
    # negative control: a README one line past its limit
    (tmp_path / "README.md").write_text("x\n" * 151, encoding="utf-8")
    assert too_long({"README.md": 150}, tmp_path) == ["README.md: 151 lines, at most 150"]

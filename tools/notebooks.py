"""Keep the notebooks of ``docs/notebooks`` tidy: outputs stripped, exercises rendered.

The notebooks come in two renderings with ONE source of truth:

* ``docs/notebooks/solutions/NN_name.ipynb`` -- the source, edited by hand and executed by CI.
  Every line a learner is to write is there in full, marked at its end::

      dv = p.swapaxes(-1, -2) @ dout  # exercise: (B, H, T_k, D)

* ``docs/notebooks/NN_name.ipynb`` -- the exercises, generated from the source by this script:
  each marked line keeps its target and its comment and loses its right-hand side::

      dv = ...  # exercise: (B, H, T_k, D)

  and the note near the top (the line starting ``*Solutions:``) points the other way.

Usage, from anywhere::

    python tools/notebooks.py            # strip the sources' outputs, render the exercises
    python tools/notebooks.py --check    # exit 1 if a notebook holds outputs or is out of date

``tests/test_notebooks.py`` runs the check, so a solution edited without rendering again, or a
notebook committed with its outputs, fails the tests.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "docs" / "notebooks"
SOLUTIONS = NOTEBOOKS / "solutions"

# name = solution  # exercise<hint>     (one statement, one line, a plain name as target)
EXERCISE = re.compile(r"^(?P<head>\s*[A-Za-z_]\w*\s*=\s*)(?P<solution>\S.*?)"
                      r"(?P<tail>\s+# exercise\b.*)$")
NOTE_PREFIXES = ("*Solutions:", "*Exercises:")


def note(stem: str, rendering: str) -> str:
    """The line near the top of a notebook that names the other rendering."""
    if rendering == "solutions":
        return (f"*Solutions: every exercise below is filled in. The exercises are in "
                f"[`{stem}.ipynb`](../{stem}.ipynb).*")
    return (f"*Exercises: replace each `...` on a line marked `# exercise` by your own line, "
            f"then run the check below it. The solutions are in "
            f"[`solutions/{stem}.ipynb`](solutions/{stem}.ipynb).*")


def _lines(cell: dict) -> list[str]:
    source = cell["source"]
    return (source if isinstance(source, str) else "".join(source)).split("\n")


def _join(lines: list[str]) -> list[str]:
    """Lines back into the notebook format: a list of strings, each but the last ending in \\n."""
    return [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])


def clean(notebook: dict, stem: str, rendering: str) -> dict:
    """The notebook without outputs, execution counts or editor metadata; its note set."""
    cells = []
    for cell in notebook["cells"]:
        lines = _lines(cell)
        if cell["cell_type"] == "markdown":
            lines = [note(stem, rendering) if line.startswith(NOTE_PREFIXES) else line
                     for line in lines]
        out = {"cell_type": cell["cell_type"], "id": cell["id"],
               "metadata": {k: v for k, v in cell.get("metadata", {}).items() if k == "tags"},
               "source": _join(lines)}
        if cell["cell_type"] == "code":
            out["execution_count"] = None
            out["outputs"] = []
        cells.append(out)
    metadata = {"kernelspec": {"display_name": "Python 3", "language": "python",
                               "name": "python3"},
                "language_info": {"name": "python"}}
    return {"cells": cells, "metadata": metadata, "nbformat": 4, "nbformat_minor": 5}


def exercise_lines(notebook: dict) -> list[str]:
    """Every line of the code cells marked ``# exercise``."""
    return [line for cell in notebook["cells"] if cell["cell_type"] == "code"
            for line in _lines(cell) if "# exercise" in line]


def render_exercises(solutions: dict, stem: str) -> dict:
    """The exercise rendering of a (clean) solutions notebook.

    Raises
    ------
    ValueError
        If a line is marked ``# exercise`` but is not ``name = solution  # exercise...``, or
        the notebook has no exercise or no note line.
    """
    notebook = clean(solutions, stem, "exercises")
    for cell in notebook["cells"]:
        if cell["cell_type"] != "code":
            continue
        lines = []
        for line in _lines(cell):
            if "# exercise" in line:
                match = EXERCISE.match(line)
                if match is None:
                    raise ValueError(f"{stem}: an exercise line must read 'name = solution  "
                                     f"# exercise...', got {line!r}")
                line = match["head"] + "..." + match["tail"]
            lines.append(line)
        cell["source"] = _join(lines)
    if not exercise_lines(solutions):
        raise ValueError(f"{stem}: no line is marked '# exercise'")
    if not any(line.startswith(NOTE_PREFIXES) for cell in notebook["cells"]
               if cell["cell_type"] == "markdown" for line in _lines(cell)):
        raise ValueError(f"{stem}: no note line starting with '*Solutions:'")
    return notebook


def dumps(notebook: dict) -> str:
    """JSON as Jupyter writes it (one-space indent, sorted keys), so saving changes nothing."""
    return json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def expected_files() -> dict[Path, str]:
    """Every notebook file as it should be: the clean sources and their exercise renderings."""
    files = {}
    for path in sorted(SOLUTIONS.glob("*.ipynb")):
        source = json.loads(path.read_text(encoding="utf-8"))
        files[path] = dumps(clean(source, path.stem, "solutions"))
        files[NOTEBOOKS / path.name] = dumps(render_exercises(source, path.stem))
    return files


def problems() -> list[str]:
    """What ``--check`` complains about: stale, dirty, missing or orphaned notebooks."""
    expected = expected_files()
    found = set(NOTEBOOKS.glob("*.ipynb")) | set(SOLUTIONS.glob("*.ipynb"))
    issues = [f"{p.relative_to(ROOT)} has no source in {SOLUTIONS.relative_to(ROOT)}"
              for p in sorted(found - set(expected))]
    for path, text in expected.items():
        if not path.exists():
            issues.append(f"{path.relative_to(ROOT)} is missing")
        elif path.read_text(encoding="utf-8") != text:
            issues.append(f"{path.relative_to(ROOT)} holds outputs or differs from its "
                          f"rendering")
    return issues


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if any notebook would change")
    args = parser.parse_args(argv)
    if args.check:
        issues = problems()
        for issue in issues:
            print(issue, file=sys.stderr)
        if issues:
            print("run: python tools/notebooks.py", file=sys.stderr)
        return 1 if issues else 0
    for path, text in expected_files().items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

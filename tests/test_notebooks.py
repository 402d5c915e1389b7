"""The notebooks of docs/notebooks: stripped of outputs, exercises in sync with the solutions.

Running the notebooks themselves is pytest's job through nbmake (``--nbmake`` in setup.cfg,
``docs/notebooks/solutions`` in its testpaths): a notebook that raises, or whose check prints
WRONG (``gradcheck.compare`` raises after printing), fails the suite.
"""

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", ".venv-ci", ".ipynb_checkpoints", "build", "dist", "runs", "_build"}


def load_tool():
    spec = importlib.util.spec_from_file_location("notebooks_tool", ROOT / "tools" / "notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tool = load_tool()


def committed_notebooks() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.ipynb")
                  if not SKIP_DIRS & set(p.relative_to(ROOT).parts))


def test_the_six_notebooks_come_in_both_renderings():
    stems = [p.stem for p in sorted(tool.SOLUTIONS.glob("*.ipynb"))]
    assert len(stems) == 6 and all(re.fullmatch(r"0[1-6]_\w+", s) for s in stems), stems
    assert [p.stem for p in sorted(tool.NOTEBOOKS.glob("*.ipynb"))] == stems


def test_no_committed_notebook_holds_outputs():
    notebooks = committed_notebooks()
    assert len(notebooks) >= 12
    dirty = []
    for path in notebooks:
        for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            if cell["cell_type"] == "code" and (cell["outputs"] or cell["execution_count"]):
                dirty.append(f"{path.relative_to(ROOT)} cell {i}")
    assert not dirty, f"notebooks committed with outputs (run python tools/notebooks.py): {dirty}"


def test_exercises_are_rendered_from_the_current_solutions():
    assert tool.problems() == []


def test_every_exercise_is_blank_in_the_exercises_and_filled_in_the_solutions():
    for source in sorted(tool.SOLUTIONS.glob("*.ipynb")):
        solved = tool.exercise_lines(json.loads(source.read_text(encoding="utf-8")))
        blank = tool.exercise_lines(json.loads((tool.NOTEBOOKS / source.name).read_text(
            encoding="utf-8")))
        assert len(solved) == len(blank) >= 2, source.name
        assert all(re.search(r"= \.\.\.  # exercise", line) for line in blank), source.name
        assert not any("= ...  # exercise" in line for line in solved), source.name


def notebook(*cells: tuple[str, str]) -> dict:
    return {"cells": [{"cell_type": kind, "id": f"c{i}", "metadata": {"tags": ["x"], "a": 1},
                       "source": text, **({"outputs": [{"output_type": "stream"}],
                                          "execution_count": 3} if kind == "code" else {})}
                      for i, (kind, text) in enumerate(cells)],
            "metadata": {"language_info": {"version": "3.11"}}, "nbformat": 4,
            "nbformat_minor": 5}


def test_rendering_blanks_the_marked_lines_and_strips_outputs():
    source = notebook(("markdown", "# Title\n*Solutions: old text*"),
                      ("code", "x = 2\n    dx = 3 * x**2  # exercise: (B, T)\ny = dx + 1"))
    exercises = tool.render_exercises(source, "07_test")
    code = exercises["cells"][1]
    assert "".join(code["source"]) == "x = 2\n    dx = ...  # exercise: (B, T)\ny = dx + 1"
    assert code["outputs"] == [] and code["execution_count"] is None
    assert code["metadata"] == {"tags": ["x"]}
    note = "".join(exercises["cells"][0]["source"]).split("\n")[1]
    assert note == tool.note("07_test", "exercises") and "solutions/07_test.ipynb" in note
    solutions = tool.clean(source, "07_test", "solutions")
    assert "dx = 3 * x**2  # exercise" in "".join(solutions["cells"][1]["source"])
    assert "../07_test.ipynb" in "".join(solutions["cells"][0]["source"])


@pytest.mark.parametrize("code, message", [
    ("dx, dw = f(x)  # exercise", "must read"),
    ("dx = f(x)", "no line is marked"),
])
def test_rendering_refuses_what_it_cannot_blank(code, message):
    with pytest.raises(ValueError, match=message):
        tool.render_exercises(notebook(("markdown", "*Solutions: x*"), ("code", code)), "t")


def test_readme_links_the_notebooks_in_reading_order():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = re.findall(r"\]\((docs/notebooks/0\d_\w+\.ipynb)\)", readme)
    assert linked == [f"docs/notebooks/{p.name}"
                      for p in sorted(tool.NOTEBOOKS.glob("*.ipynb"))]
    assert 'pip install ".[docs]" && jupyter lab docs/notebooks' in readme

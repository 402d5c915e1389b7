"""README.md's Python runs as written: every ``python`` block, top to bottom, in one namespace.

A reader runs the snippets in order, each using what the ones before it built (the model of
"Build and train a model" is the one "Generate" samples from), so the test does the same, in a
scratch folder. A snippet that needs a name it never defines fails here with ``NameError``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


def python_blocks(text: str) -> list[str]:
    """The bodies of the fenced ``python`` blocks of a Markdown text, in order."""
    return PYTHON_BLOCK.findall(text)


def test_the_block_finder_sees_every_python_fence():
    # negative control: a missed fence would make the test below pass vacuously
    text = "x\n```python\na = 1\n```\n```bash\nls\n```\n```python\nb = a\n```\n"
    assert python_blocks(text) == ["a = 1\n", "b = a\n"]
    assert len(python_blocks(README.read_text(encoding="utf-8"))) == \
        README.read_text(encoding="utf-8").count("```python")


def test_every_python_block_of_the_readme_runs_in_order(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__readme__"}
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert blocks, "README.md has no python block"
    for i, block in enumerate(blocks, 1):
        first = block.strip().splitlines()[0]
        try:
            exec(compile(block, f"README.md python block {i}", "exec"), namespace)
        except Exception as e:  # noqa: BLE001 - the block's own error, named with the block
            pytest.fail(f"README.md python block {i} ({first!r}) raised {e!r}")
    printed = capsys.readouterr().out
    assert "max rel err" in printed  # the gradient check's table
    assert "loss" in printed  # the training steps

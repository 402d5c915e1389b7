"""README.md runs as written: every ``python`` and ``bash`` block.

* The ``python`` blocks, top to bottom, in one namespace: a reader runs the snippets in order,
  each using what the ones before it built (the model of "Build and train a model" is the one
  "Generate" samples from). A snippet that needs a name it never defines fails here.
* Each ``bash`` block in a scratch folder of its own (with the repository's ``examples/``, and
  ``my.txt``, the text of yours that the tour trains on), the way the README says it is
  tested: the package and every extra installed already (a ``pip install ... &&`` in front of
  a command is that set-up, which ``.ci/run`` does on a fresh machine), and
  ``NUMPY_TRANSFORMER_STEPS=2`` so that every ``train`` takes two steps.
* The comment line just above a fence can say ``<!-- readme-test: needs torch hf -->`` (the
  block runs where those extras are installed: in CI, always) or ``<!-- readme-test: not run:
  REASON -->``; the README's own text beside such a block says the same reason.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from numpy_transformer.corpus import load_corpus

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)
BASH_BLOCK = re.compile(r"(?:^<!-- readme-test: (.*?) -->\n)?^```bash\n(.*?)^```$", re.S | re.M)
SET_UP = re.compile(r"^pip install [^&\n]*(&& |$)", re.M)  # done before the tests run
EXTRAS = {"torch": ("torch",), "hf": ("safetensors", "transformers")}


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


def bash_blocks(text: str) -> list[tuple[int, str, str]]:
    """``(line, marker, body)`` of each fenced ``bash`` block: the line of its fence, the
    ``readme-test`` comment just above it ("" if none)."""
    return [(text.count("\n", 0, m.start(2)), m.group(1) or "", m.group(2))
            for m in BASH_BLOCK.finditer(text)]


def run_bash_block(body: str, folder: Path) -> subprocess.CompletedProcess:
    """Run a README ``bash`` block in ``folder`` as the module docstring says."""
    shutil.copytree(ROOT / "examples", folder / "examples")
    (folder / "my.txt").write_text(load_corpus()[:20_000], encoding="utf-8")
    env = {**os.environ, "NUMPY_TRANSFORMER_STEPS": "2",
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", SET_UP.sub("", body)],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=900)


BLOCKS = bash_blocks(README.read_text(encoding="utf-8"))


def test_the_block_finder_sees_every_bash_fence_and_its_marker():
    text = "<!-- readme-test: needs torch -->\n```bash\nls\n```\n\n```bash\npwd\n```\n"
    assert [(marker, body) for _, marker, body in bash_blocks(text)] == [
        ("needs torch", "ls\n"), ("", "pwd\n")]
    assert len(BLOCKS) == README.read_text(encoding="utf-8").count("```bash")
    assert SET_UP.sub("", 'pip install ".[test]" && python -m pytest') == "python -m pytest"


def test_a_broken_command_fails_its_block(tmp_path):
    # negative control: the first command of the tour with an option it refuses
    line, _, body = next(b for b in BLOCKS if "--top-k 20" in b[2])
    broken = run_bash_block(body.replace("--top-k 20", "--top-k -1"), tmp_path)
    assert broken.returncode == 2 and "--top-k" in broken.stderr, line


@pytest.mark.parametrize("line, marker, body", BLOCKS, ids=[f"line{b[0] + 1}" for b in BLOCKS])
def test_every_bash_block_of_the_readme_runs(line, marker, body, tmp_path):
    if marker.startswith("not run:"):
        reason = marker.removeprefix("not run:").strip()
        assert reason, f"README.md line {line + 1}: 'not run' needs its reason"
        pytest.skip(f"README.md line {line + 1}: {reason}")
    assert marker == "" or marker.startswith("needs "), f"line {line + 1}: marker {marker!r}"
    for extra in marker.split()[1:]:
        for module in EXTRAS[extra]:
            if importlib.util.find_spec(module) is None:
                pytest.skip(f"needs the {extra} extra ({module}); CI installs it")
    done = run_bash_block(body, tmp_path)
    assert done.returncode == 0, (f"README.md line {line + 1}: exit {done.returncode}\n"
                                  f"{done.stderr[-3000:]}")


def exit_code_rows(text: str) -> dict[str, set[str]]:
    """The README's exit-code table: each code (a "130, 143" row gives both) to its commands."""
    rows = re.findall(r"^\| ([\d, ]+) \| ([^|]+) \|", text, flags=re.M)
    return {code.strip(): set(re.findall(r"`(\w+)`", commands)) or {commands.strip()}
            for codes, commands in rows for code in codes.split(",")}


def test_the_exit_code_table_lists_every_code_and_every_command():
    """The table under "Train, sample, resume" against the codes the command line has
    (``EXIT_CODES``) and the commands its parser has; "all" stands for every command."""
    import argparse

    from numpy_transformer import cli
    from numpy_transformer.runs.outputs import EXIT_CODES

    rows = exit_code_rows(README.read_text(encoding="utf-8"))
    assert set(rows) == {str(code) for code in EXIT_CODES}
    commands = set(next(a for a in cli.build_parser()._actions
                        if isinstance(a, argparse._SubParsersAction)).choices)
    named = set().union(*rows.values()) - {"all"}
    assert named <= commands, named - commands
    assert all(rows[code] == {"all"} for code in ("0", "2", "130", "143")), rows
    # negative control: a table without the 74 row, or naming a command that does not exist
    assert "74" not in exit_code_rows("| 0 | all | fine |\n| 1 | `train` | diverged |\n")
    assert exit_code_rows("| 1 | `fly` | no |\n")["1"] == {"fly"}

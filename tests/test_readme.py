"""README.md and docs/*.md run as written: every ``python`` and ``bash`` block.

* The ``python`` blocks of each document, top to bottom, in one namespace: a reader runs the
  snippets in order, each using what the ones before it built (the model of "Build and train
  a model" is the one "Generate" samples from). A snippet that needs a name it never defines
  fails here.
* Each ``bash`` block in a scratch folder of its own (with the repository's ``examples/``, and
  ``my.txt``, the text of yours that the tour trains on), the way the README says it is
  tested: the package and every extra installed already (a ``pip install ... &&`` in front of
  a command is that set-up, which ``.ci/run`` does on a fresh machine), and
  ``NUMPY_TRANSFORMER_STEPS=2`` so that every ``train`` takes two steps.
* The comment line just above a fence can say ``<!-- readme-test: needs torch hf -->`` (the
  block runs where those extras are installed: in CI, always) or ``<!-- readme-test: not run:
  REASON -->`` (a sketch of a contract, a block another one already runs); the reason is
  required.
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
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]
MARKER = r"(?:^<!-- readme-test: ([^\n]*?) -->\n)?"  # the comment just above a fence, if any
PYTHON_BLOCK = re.compile(MARKER + r"^```python\n(.*?)^```$", re.S | re.M)
BASH_BLOCK = re.compile(MARKER + r"^```bash\n(.*?)^```$", re.S | re.M)
SET_UP = re.compile(r"^pip install [^&\n]*(&& |$)", re.M)  # done before the tests run
EXTRAS = {"torch": ("torch",), "hf": ("safetensors", "transformers")}


def python_blocks(text: str) -> list[tuple[str, str]]:
    """``(marker, body)`` of each fenced ``python`` block of a Markdown text, in order."""
    return [(m.group(1) or "", m.group(2)) for m in PYTHON_BLOCK.finditer(text)]


def skip_reason(marker: str, where: str) -> str | None:
    """Why a block with ``marker`` does not run here (None: it runs)."""
    if marker.startswith("not run:"):
        reason = marker.removeprefix("not run:").strip()
        assert reason, f"{where}: 'not run' needs its reason"
        return f"{where}: {reason}"
    assert marker == "" or marker.startswith("needs "), f"{where}: marker {marker!r}"
    for extra in marker.split()[1:]:
        for module in EXTRAS[extra]:
            if importlib.util.find_spec(module) is None:
                return f"{where} needs the {extra} extra ({module}); CI installs it"
    return None


def test_the_block_finder_sees_every_python_fence():
    # negative control: a missed fence would make the test below pass vacuously
    text = ("x\n```python\na = 1\n```\n```bash\nls\n```\n<!-- readme-test: needs hf -->\n"
            "```python\nb = a\n```\n")
    assert python_blocks(text) == [("", "a = 1\n"), ("needs hf", "b = a\n")]
    for doc in DOCUMENTS:  # (indented fences, inside a list, are tests/test_recipe.py's)
        text = doc.read_text(encoding="utf-8")
        assert len(python_blocks(text)) == len(re.findall("^```python", text, re.M)), doc


@pytest.mark.parametrize("doc", DOCUMENTS, ids=[d.name for d in DOCUMENTS])
def test_every_python_block_runs_in_order(doc, tmp_path, monkeypatch, capsys):
    """A ``needs`` block whose extra is missing skips the rest of its document (the blocks
    after it may use what it makes); a ``not run`` one is passed over."""
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__readme__"}
    blocks = python_blocks(doc.read_text(encoding="utf-8"))
    ran = 0
    for i, (marker, block) in enumerate(blocks, 1):
        where = f"{doc.name} python block {i}"
        reason = skip_reason(marker, where)
        if reason is not None and marker.startswith("needs"):
            pytest.skip(reason)
        if reason is not None:
            continue
        try:
            exec(compile(block, where, "exec"), namespace)
        except Exception as e:  # noqa: BLE001 - the block's own error, named with the block
            pytest.fail(f"{where} ({block.strip().splitlines()[0]!r}) raised {e!r}")
        ran += 1
    if doc == README:
        printed = capsys.readouterr().out
        assert "max rel err" in printed  # the gradient check's table
        assert "loss" in printed  # the training steps
    assert ran or all(marker.startswith("not run") for marker, _ in blocks), doc


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


BLOCKS = [(doc, *block) for doc in DOCUMENTS
          for block in bash_blocks(doc.read_text(encoding="utf-8"))]


def test_the_block_finder_sees_every_bash_fence_and_its_marker():
    text = "<!-- readme-test: needs torch -->\n```bash\nls\n```\n\n```bash\npwd\n```\n"
    assert [(marker, body) for _, marker, body in bash_blocks(text)] == [
        ("needs torch", "ls\n"), ("", "pwd\n")]
    assert len(BLOCKS) == sum(doc.read_text(encoding="utf-8").count("```bash")
                              for doc in DOCUMENTS)
    assert SET_UP.sub("", 'pip install ".[test]" && python -m pytest') == "python -m pytest"


def test_a_broken_command_fails_its_block(tmp_path):
    # negative control: the tour's block headed by its sample command with an option that
    # command refuses (at the head, so that the block stops before it trains anything)
    _, line, _, body = next(b for b in BLOCKS if "--top-k 20" in b[3])
    sample = next(c for c in body.splitlines() if "--top-k 20" in c)
    broken = run_bash_block(f"{sample.replace('--top-k 20', '--top-k -1')}\n{body}", tmp_path)
    assert broken.returncode == 2 and "--top-k" in broken.stderr, line
    assert not (tmp_path / "runs").exists(), line  # it stopped there


@pytest.mark.parametrize("doc, line, marker, body", BLOCKS,
                         ids=[f"{b[0].stem}-line{b[1] + 1}" for b in BLOCKS])
def test_every_bash_block_runs(doc, line, marker, body, tmp_path):
    where = f"{doc.name} line {line + 1}"
    reason = skip_reason(marker, where)
    if reason is not None:
        pytest.skip(reason)
    done = run_bash_block(body, tmp_path)
    assert done.returncode == 0, f"{where}: exit {done.returncode}\n{done.stderr[-3000:]}"


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


# ------------------------------------------------------------------ the prose a reader copies
def prose_lines(text: str) -> list[str]:
    """The inline code of a document's prose (fenced blocks aside) that is a Python statement
    calling one of the package's functions (not a method: ``TransformerConfig.validate()``
    names one, a reader does not run it as written)."""
    import ast

    import numpy_transformer

    prose = re.sub(r"^```.*?^```$", "", text, flags=re.S | re.M)
    lines = []
    for span in re.findall(r"`([^`\n]+)`", prose):
        try:
            tree = ast.parse(span)
        except SyntaxError:
            continue
        calls = [ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)]
        names = {name: getattr(numpy_transformer, name, None) for name in
                 numpy_transformer.__all__ + ["generate"]}
        names["generate"] = __import__("numpy_transformer.generate").generate.generate
        for call in calls:
            head, _, rest = call.removeprefix("numpy_transformer.").partition(".")
            target = names.get(head)
            for part in rest.split(".") if rest and target is not None else []:
                target = getattr(target, part, None)
            if callable(target) and "." not in getattr(target, "__qualname__", "."):
                lines.append(span)
                break
    return lines


def run_prose(lines: list[str], namespace: dict) -> list[str]:
    """Run each line whose names the lines before it (or the package) define; returns the
    ones that raised, with their errors."""
    import ast
    import builtins

    failed = []
    for line in lines:
        free = {n.id for n in ast.walk(ast.parse(line)) if isinstance(n, ast.Name)
                and isinstance(n.ctx, ast.Load)}
        if not free <= set(namespace) | set(dir(builtins)):
            continue  # it reads a name the prose never made (model, dir): a sketch
        try:
            exec(line, namespace)
        except Exception as e:  # noqa: BLE001 - the line's own error, named with it
            failed.append(f"{line!r}: {e!r}")
    return failed


def test_the_python_a_reader_copies_from_the_prose_runs(tmp_path, monkeypatch):
    """``run = numpy_transformer.load_run("runs/char-lm")``, then ``generate(run.model, ...)``:
    the lines of the README's prose, run in order in a folder where the README's first
    command has trained (two steps); a broken line is caught (the negative control)."""
    import numpy as np

    import numpy_transformer
    from numpy_transformer import cli
    from numpy_transformer.generate import generate

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NUMPY_TRANSFORMER_STEPS", "2")
    assert cli.main(["train", "--quiet"]) == 0
    lines = prose_lines(README.read_text(encoding="utf-8"))
    assert any("load_run" in line for line in lines) and any("generate(" in line
                                                              for line in lines)
    namespace = {"numpy_transformer": numpy_transformer, "np": np, "generate": generate}
    assert run_prose(lines, dict(namespace)) == []
    broken = [line.replace("steps=300", "steps=-1") for line in lines]
    assert any("steps must be" in f for f in run_prose(broken, dict(namespace)))

"""README.md and docs/*.md run as written: every ``python`` and ``bash`` block, in order.

* A reader opens the README, then the guides in the order its map lists them, and types
  every block of each page top to bottom **in one folder**: a block may use a file, a run
  folder or a name that a block above it made, and must not collide with one (two
  ``train --out runs/llama`` of different shapes, an export into a folder an earlier block
  filled). The walk does the same: one folder for every document (with the repository's
  ``examples/``, and ``my.txt``, the text of yours that the tour trains on), each
  document's blocks in order in it, the ``python`` blocks of a document in one namespace.
  A page run alone (``-k cli``) walks in a fresh folder, so each page also stands on its own.
* The package and every extra are installed already: a ``pip install ... &&`` in front of
  a command is that set-up, which ``.ci/run`` does on a fresh machine; and
  ``NUMPY_TRANSFORMER_STEPS=2`` makes every ``train`` take two steps.
* The comment line just above a fence can say ``<!-- readme-test: needs torch hf -->`` (the
  block runs where those extras are installed: in CI, always; where one is missing, the rest
  of the document is skipped, since the blocks after it may build on it) or
  ``<!-- readme-test: not run: REASON -->`` (a sketch of a contract, an interactive server);
  the reason is required.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from numpy_transformer.corpus import load_corpus

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDES = sorted((ROOT / "docs").glob("*.md"))
MARKER = r"(?:^<!-- readme-test: ([^\n]*?) -->\n)?"  # the comment just above a fence, if any
FENCE = re.compile(MARKER + r"^```(python|bash)\n(.*?)^```$", re.S | re.M)
SET_UP = re.compile(r"^pip install [^&\n]*(&& |$)", re.M)  # done before the tests run
EXTRAS = {"torch": ("torch",), "hf": ("safetensors", "transformers")}


def reading_order(readme: str, guides: list[Path]) -> list[Path]:
    """The README, then each guide in the order the README first links it (the rest after,
    by name)."""
    linked = [ROOT / path for path in dict.fromkeys(re.findall(r"\]\((docs/[\w-]+\.md)", readme))]
    return [README, *[g for g in linked if g in guides], *[g for g in guides if g not in linked]]


DOCUMENTS = reading_order(README.read_text(encoding="utf-8"), GUIDES)


class Block(NamedTuple):
    line: int  # of the fence, from 1
    kind: str  # "python" or "bash"
    marker: str  # the readme-test comment just above the fence, "" if none
    body: str


def blocks(text: str) -> list[Block]:
    """Every fenced ``python`` and ``bash`` block of a Markdown text, in document order."""
    return [Block(text.count("\n", 0, m.start(2)) + 1, m.group(2), m.group(1) or "", m.group(3))
            for m in FENCE.finditer(text)]


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


def test_the_block_finder_sees_every_fence_in_order():
    # negative control: a missed fence would make the walk below pass vacuously
    text = ("x\n```python\na = 1\n```\n```bash\nls\n```\n<!-- readme-test: needs hf -->\n"
            "```python\nb = a\n```\n```\nnot a block\n```\n")
    assert blocks(text) == [Block(2, "python", "", "a = 1\n"), Block(5, "bash", "", "ls\n"),
                            Block(9, "python", "needs hf", "b = a\n")]
    for doc in DOCUMENTS:  # (indented fences, inside a list, are tests/test_recipe.py's)
        text = doc.read_text(encoding="utf-8")
        assert len(blocks(text)) == len(re.findall("^```(python|bash)$", text, re.M)), doc
    assert SET_UP.sub("", 'pip install ".[test]" && python -m pytest') == "python -m pytest"


def test_the_readme_maps_every_guide():
    """The walk's order is the README's map; a guide it does not link is one no reader finds."""
    assert DOCUMENTS[0] == README and sorted(DOCUMENTS[1:]) == GUIDES
    readme = README.read_text(encoding="utf-8")
    assert [d.name for d in reading_order(readme, GUIDES)[1:len(GUIDES) + 1]] == [
        re.search(r"docs/([\w-]+\.md)", m).group(1)
        for m in dict.fromkeys(re.findall(r"\]\(docs/[\w-]+\.md", readme))]
    # negative control: a README that forgets a guide leaves it at the end, unlinked
    unlinked = reading_order("[a](docs/cli.md)", GUIDES)
    assert unlinked[1].name == "cli.md" and len(unlinked) == len(GUIDES) + 1


def set_up_commands(readme: str) -> list[str]:
    """The commands of the README's "Set-up: two commands", each ``A && B`` as A and B."""
    section = readme[readme.index("## Set-up"):].split("\n## ", 1)[0]
    return [part.strip() for b in blocks(section) for line in b.body.splitlines()
            for part in line.split(" && ")]


def ci_runs(commands: list[str], ci: str) -> list[str]:
    """The commands that no line of the CI script runs (comments aside)."""
    lines = [line.strip() for line in ci.splitlines() if not line.lstrip().startswith("#")]
    return [c for c in commands if not any(line == c or line.startswith(c + " ")
                                           or f"&& {c}" in line or f"{c} &&" in line
                                           for line in lines)]


def test_ci_runs_the_readmes_two_commands():
    commands = set_up_commands(README.read_text(encoding="utf-8"))
    assert commands == ["pip install .", "numpy-transformer train", 'pip install ".[test]"',
                        "python -m pytest"]
    assert ci_runs(commands, (ROOT / ".ci" / "run").read_text(encoding="utf-8")) == []
    # negative control: a README that installs in editable mode, which CI does not do
    assert ci_runs(["pip install -e ."], "pip install .\n# pip install -e .\n") == [
        "pip install -e ."]


class BlockFailed(AssertionError):
    """A block of a walk failed: its document, line, and what it said."""


def run_bash(body: str, folder: Path) -> subprocess.CompletedProcess:
    """Run a ``bash`` block in ``folder`` as the module docstring says."""
    env = {**os.environ, "NUMPY_TRANSFORMER_STEPS": "2",
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", SET_UP.sub("", body)],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=900)


def walk(text: str, name: str, folder: Path) -> int:
    """Run the blocks of one document in order in ``folder`` (the current directory is set to
    it for the ``python`` ones); returns how many ran. Raises :class:`BlockFailed` at the
    first that fails; skips the rest of the document at a block whose extra is missing."""
    namespace: dict = {"__name__": "__readme__"}
    ran = 0
    for block in blocks(text):
        where = f"{name} line {block.line} ({block.kind})"
        reason = skip_reason(block.marker, where)
        if reason is not None and block.marker.startswith("needs"):
            pytest.skip(f"{reason}; the blocks after it may build on it")
        if reason is not None:
            continue
        if block.kind == "bash":
            done = run_bash(block.body, folder)
            if done.returncode != 0:
                raise BlockFailed(f"{where}: exit {done.returncode}\n{done.stderr[-3000:]}")
        else:
            cwd = os.getcwd()
            os.chdir(folder)
            try:
                exec(compile(block.body, where, "exec"), namespace)
            except Exception as e:  # noqa: BLE001 - the block's own error, named with the block
                first = block.body.strip().splitlines()[0]
                raise BlockFailed(f"{where} ({first!r}): {e!r}") from e
            finally:
                os.chdir(cwd)
        ran += 1
    return ran


@pytest.fixture(scope="module")
def reader_folder(tmp_path_factory) -> Path:
    """The one folder a reader works in: the repository's ``examples/``, and ``my.txt``."""
    folder = tmp_path_factory.mktemp("reader")
    shutil.copytree(ROOT / "examples", folder / "examples")
    (folder / "my.txt").write_text(load_corpus()[:20_000], encoding="utf-8")
    return folder


# what a document's blocks print, when they ran: that they did what the page says
PRINTED = {"README.md": "finite differences close", "python.md": "loss"}


@pytest.mark.parametrize("doc", DOCUMENTS, ids=[d.stem for d in DOCUMENTS])
def test_every_block_runs_in_order_in_one_folder(doc, reader_folder, capsys):
    text = doc.read_text(encoding="utf-8")
    ran = walk(text, doc.name, reader_folder)
    assert ran or all(b.marker.startswith("not run") for b in blocks(text)), doc
    assert PRINTED.get(doc.name, "") in capsys.readouterr().out


def test_the_walk_left_one_folder_per_run(reader_folder):
    """After every page in one folder: the default ``train`` of the README, of the tour and of
    the road out is one run, ``runs/char-lm``, not a pile of dated ``runs/char-lm-DATE``."""
    if not (reader_folder / "runs" / "char-lm").is_dir():
        pytest.skip("the walk above did not run in this session")
    dated = sorted(p.name for p in (reader_folder / "runs").iterdir()
                   if re.search(r"-\d{8}-\d{6}$", p.name))
    assert dated == [], f"the walk piled up dated run folders: {dated}"


def test_the_walk_runs_in_order_in_one_folder(tmp_path):
    """Negative controls: the blocks share one folder and run in document order (a block that
    needs what the one above made fails when the order is swapped), and two blocks that
    collide there fail the walk, as the road back's two LLaMAs once did."""
    made = "```python\nopen('made.txt', 'w').write('x')\n```\n"
    used = ("```bash\ntest -f made.txt && mkdir used\n```\n"
            "```python\nimport os\nassert os.path.isdir('used')\n```\n")
    for name in ("in order", "swapped", "collide"):
        (tmp_path / name).mkdir()
    assert walk(made + used, "in order", tmp_path / "in order") == 3
    with pytest.raises(BlockFailed, match=r"swapped line 1 \(bash\): exit 1"):
        walk(used + made, "swapped", tmp_path / "swapped")
    train = ("```bash\nnumpy-transformer train --width 8 --ffn-width 8 --layers 1 --context 8 "
             "--quiet --out runs/x --heads {}\n```\n")
    different = r"(?s)collide line 4 \(bash\): exit 2.*runs/x holds a different run"
    with pytest.raises(BlockFailed, match=different):
        walk(train.format(2) + train.format(4), "collide", tmp_path / "collide")


def test_a_broken_command_fails_its_block(tmp_path):
    # negative control: the tour's block headed by its sample command with an option that
    # command refuses (at the head, so that the block stops before it trains anything)
    doc, block = next((d, b) for d in DOCUMENTS for b in blocks(d.read_text(encoding="utf-8"))
                      if "--top-k 20" in b.body)
    sample = next(c for c in block.body.splitlines() if "--top-k 20" in c)
    broken = run_bash(f"{sample.replace('--top-k 20', '--top-k -1')}\n{block.body}", tmp_path)
    assert broken.returncode == 2 and "--top-k" in broken.stderr, (doc, block.line)
    assert not (tmp_path / "runs").exists(), (doc, block.line)  # it stopped there


CLI = ROOT / "docs" / "cli.md"


def exit_code_rows(text: str) -> dict[str, set[str]]:
    """The exit-code table of ``docs/cli.md``: each code (a "130, 143" row gives both) to its
    commands."""
    rows = re.findall(r"^\| ([\d, ]+) \| ([^|]+) \|", text, flags=re.M)
    return {code.strip(): set(re.findall(r"`(\w+)`", commands)) or {commands.strip()}
            for codes, commands in rows for code in codes.split(",")}


def test_the_exit_code_table_lists_every_code_and_every_command():
    """The table under "Failures and exit codes" against the codes the command line has
    (``EXIT_CODES``) and the commands its parser has; "all" stands for every command."""
    import argparse

    from numpy_transformer import cli
    from numpy_transformer.runs.outputs import EXIT_CODES

    rows = exit_code_rows(CLI.read_text(encoding="utf-8"))
    assert set(rows) == {str(code) for code in EXIT_CODES}
    commands = set(next(a for a in cli.build_parser()._actions
                        if isinstance(a, argparse._SubParsersAction)).choices)
    named = set().union(*rows.values()) - {"all"}
    assert named <= commands, named - commands
    assert all(rows[code] == {"all"} for code in ("0", "2", "130", "143")), rows
    # negative control: a table without the 74 row, or naming a command that does not exist
    assert "74" not in exit_code_rows("| 0 | all | fine |\n| 1 | `train` | diverged |\n")
    assert exit_code_rows("| 1 | `fly` | no |\n")["1"] == {"fly"}


# ------------------------------------------------------------------ the layout's map
LAYOUT = ROOT / "docs" / "layout.md"
PACKAGE = ROOT / "numpy_transformer"


def layout_files(text: str) -> set[str]:
    """The files the tree under "## The package" names: each line's first word, a folder
    (``name/``) holding the lines indented below it, two spaces a level."""
    tree = re.search(r"^## The package\n.*?^```\n(.*?)^```$", text, re.S | re.M).group(1)
    folders, files = [], set()
    for line in tree.splitlines():
        depth = (len(line) - len(line.lstrip(" "))) // 2
        name = line.split()[0]
        del folders[depth:]
        if name.endswith("/"):
            folders.append(name)
        else:
            files.add("".join(folders) + name)
    return files


def package_files() -> set[str]:
    """Every file of the package on disk (what git tracks: no caches)."""
    return {p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*") if p.is_file()
            and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".nbi", ".nbc")}


def test_the_layout_names_every_file_of_the_package():
    listed = layout_files(LAYOUT.read_text(encoding="utf-8"))
    missing, extra = sorted(package_files() - listed), sorted(listed - package_files())
    assert not missing, f"docs/layout.md does not name {missing}"
    assert not extra, f"docs/layout.md names files that are not there: {extra}"
    # negative control: a tree that forgets a file, or puts one in the wrong folder
    tree = "## The package\n\n```\nnumpy_transformer/\n  nn/\n    module.py  x\n  cli.py\n```\n"
    assert layout_files(tree) == {"numpy_transformer/nn/module.py", "numpy_transformer/cli.py"}
    assert layout_files(tree.replace("  cli.py", "    cli.py")) == {
        "numpy_transformer/nn/module.py", "numpy_transformer/nn/cli.py"}


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
    the lines of the pages' prose, in reading order, run in a folder where the README's first
    command has trained (two steps); a broken line is caught (the negative control)."""
    import numpy as np

    import numpy_transformer
    from numpy_transformer import cli
    from numpy_transformer.generate import generate

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NUMPY_TRANSFORMER_STEPS", "2")
    assert cli.main(["train", "--quiet"]) == 0
    lines = [line for doc in DOCUMENTS for line in prose_lines(doc.read_text(encoding="utf-8"))]
    assert any("load_run" in line for line in lines) and any("generate(" in line
                                                              for line in lines)
    namespace = {"numpy_transformer": numpy_transformer, "np": np, "generate": generate}
    assert run_prose(lines, dict(namespace)) == []
    broken = [line.replace("steps=300", "steps=-1") for line in lines]
    assert any("steps must be" in f for f in run_prose(broken, dict(namespace)))

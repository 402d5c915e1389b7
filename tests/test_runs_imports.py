"""The run package's imports point one way (outputs <- options <- environment <- folder <-
training_data <- state <- stored <- sources <- init_from <- ... <- report <- loop), and the
command line imports nothing heavy before a command runs."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import numpy_transformer

PACKAGE = Path(numpy_transformer.__file__).parent
# Each module of numpy_transformer.runs may import only the modules before it.
ORDER = ("outputs", "options", "environment", "folder", "training_data", "state", "stored",
         "sources", "init_from", "importing", "sample", "evaluate", "export", "report",
         "tensorboard", "loop")
# What cli.py may import when it is loaded: the standard library and these light modules.
CLI_TOP_LEVEL = {"numpy_transformer", "numpy_transformer._version", "numpy_transformer.allocator",
                 "numpy_transformer.cli_parser",
                 "numpy_transformer.config", "numpy_transformer.runs.options",
                 "numpy_transformer.runs.outputs",
                 "numpy_transformer.threads"}


def is_module(name: str) -> bool:
    """Whether ``name`` (``numpy_transformer.x.y``) is a module or package of ours."""
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imported_modules(source: str, module: str, top_level_only: bool = False) -> set[str]:
    """Absolute names of the modules ``source`` (the text of module ``module``) imports."""
    tree = ast.parse(source)
    nodes = tree.body if top_level_only else ast.walk(tree)
    package = module.rsplit(".", 1)[0]
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            name = ".".join(p for p in (base, node.module) if p)
            for alias in node.names:  # from a import b: b is a module or a name in a
                found.add(f"{name}.{alias.name}" if is_module(f"{name}.{alias.name}") else name)
    return found


def upward_imports(sources: dict[str, str], order: tuple[str, ...],
                   package: str = "numpy_transformer.runs") -> list[str]:
    """``"a -> b"`` for every module ``a`` of ``order`` that imports ``b`` at or after itself."""
    bad = []
    for i, name in enumerate(order):
        for target in imported_modules(sources[name], f"{package}.{name}"):
            short = target.removeprefix(f"{package}.")
            if short in order[i:] or target == package:
                bad.append(f"{name} -> {short}")
    return bad


def runs_sources() -> dict[str, str]:
    return {name: (PACKAGE / "runs" / f"{name}.py").read_text(encoding="utf-8")
            for name in ORDER}


def test_runs_modules_import_one_way():
    folder = PACKAGE / "runs"
    assert {p.stem for p in folder.glob("*.py")} == set(ORDER) | {"__init__"}
    assert upward_imports(runs_sources(), ORDER) == []
    init = imported_modules((folder / "__init__.py").read_text(), "numpy_transformer.runs")
    assert init == set(), "runs/__init__.py must stay empty of imports"


def test_options_uses_only_the_standard_library_and_the_config():
    """options (and the file reader it takes --config through) load no NumPy."""
    found = imported_modules(runs_sources()["options"], "numpy_transformer.runs.options")
    ours = {m for m in found if m.startswith("numpy_transformer")}
    assert ours == {"numpy_transformer.config", "numpy_transformer.files",
                    "numpy_transformer.runs.outputs"}
    assert not found & {"numpy", "numba", "matplotlib"}
    found = imported_modules((PACKAGE / "files.py").read_text(encoding="utf-8"),
                             "numpy_transformer.files")
    assert not {m for m in found if m.startswith("numpy_transformer")}
    assert not found & {"numpy", "numba", "matplotlib"}
    found = imported_modules(runs_sources()["outputs"], "numpy_transformer.runs.outputs")
    assert not {m for m in found if m.startswith("numpy_transformer")}


def test_negative_control_an_upward_import_is_caught():
    sources = runs_sources()
    sources["folder"] += "\nfrom .loop import train\n"
    sources["options"] += "\nfrom . import state\n"
    assert upward_imports(sources, ORDER) == ["options -> state", "folder -> loop"]


@pytest.mark.parametrize("module", ["cli", "cli_parser"])
def test_cli_imports_nothing_heavy_until_a_command_runs(module):
    source = (PACKAGE / f"{module}.py").read_text(encoding="utf-8")
    ours = {m for m in imported_modules(source, f"numpy_transformer.{module}",
                                        top_level_only=True)
            if m.startswith("numpy_transformer") or m.split(".")[0] in
            ("numpy", "numba", "matplotlib", "scipy")}
    assert ours <= CLI_TOP_LEVEL, ours - CLI_TOP_LEVEL


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["train", "--width", "0"],
                                  ["sample", "--length", "x"]])
def test_help_and_usage_errors_load_no_numpy(argv):
    """What answers before a command runs loads neither NumPy nor numba nor matplotlib."""
    script = ("import sys\nfrom numpy_transformer.cli import main\ntry:\n    main(sys.argv[1:])\n"
              "except SystemExit:\n    pass\nheavy = {'numpy', 'numba', 'matplotlib'} & "
              "set(sys.modules)\nprint(sorted(heavy), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True,
                          cwd=PACKAGE.parent)
    assert proc.stderr.strip().splitlines()[-1] == "[]", proc.stderr

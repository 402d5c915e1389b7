"""The package's import structure: layers that only point down, and no circles.

Every module of ``numpy_transformer`` belongs to one layer below (``docs/architecture.md``
draws the picture). A module may import from its own layer and the layers under it, never from
a layer above, and no chain of imports may lead back to where it started. Imports under
``if TYPE_CHECKING:`` are annotations only and never run, so they are left out; imports inside
functions (the lazy ones) count. A new module must be placed in a layer here, or the test
fails and says so.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = "numpy_transformer"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

# bottom to top; a module is in the first layer one of whose names is its first path part
LAYERS = (
    ("_version", "_checks", "config", "memory", "files", "threads", "allocator",
     "ownership"),  # base
    ("functional",),  # the math: NumPy and the standard library only
    ("kernels",),  # the same contracts, compiled
    ("backend",),  # the one seam between the two
    ("nn",),  # modules and models
    ("optim", "schedules", "train", "generate", "sampling", "checkpoint", "gradcheck", "bpe",
     "gradcheck_tables", "data", "tasks", "corpus", "interop", "plots", "export",
     "torch_twins", "compile_kernels"),  # built on nn
    ("runs", "bench"),  # training runs on disk; the benchmarks the command line runs
    ("cli", "cli_parser", "__main__"),  # the command line: its commands, its parser
)


def module_name(path: Path) -> str:
    parts = (PACKAGE,) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def layer_of(name: str) -> int:
    """The layer index of a module; the package itself (its __init__) is above them all."""
    if name == PACKAGE:
        return len(LAYERS)
    first = name.split(".")[1]
    for i, names in enumerate(LAYERS):
        if first in names:
            return i
    raise AssertionError(f"{name} is in no layer: add it to LAYERS in {__file__}")


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports, at module level or inside functions."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()

    def resolve(base: str, names: list[str]) -> None:
        for n in names:  # "from base import n": a submodule if there is one, else base
            found.add(f"{base}.{n}" if f"{base}.{n}" in known else base)

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(PACKAGE))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            if base.startswith(PACKAGE):
                resolve(base, [a.name for a in node.names])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    found.discard(name)
    return {m for m in found if m in known}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


def upward(edges: dict[str, set[str]]) -> list[str]:
    return [f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)})"
            for a, targets in sorted(edges.items()) for b in sorted(targets)
            if layer_of(b) > layer_of(a)]


def test_every_module_has_a_layer():
    for name in modules():
        layer_of(name)


def test_no_import_circles():
    assert cycles(graph()) == []


def test_imports_only_point_down():
    assert upward(graph()) == []


def test_the_checks_catch_a_circle_and_an_upward_import():
    """Negative control: the same functions on a graph with both faults."""
    edges = {f"{PACKAGE}.optim": {f"{PACKAGE}.kernels.adam"},
             f"{PACKAGE}.kernels.adam": {f"{PACKAGE}.optim"}}
    assert cycles(edges) == [sorted(edges)]
    assert upward(edges) == [f"{PACKAGE}.kernels.adam (layer 2) imports {PACKAGE}.optim "
                             f"(layer 5)"]


def test_the_parser_sees_relative_lazy_and_type_only_imports(tmp_path):
    package = tmp_path / PACKAGE / "nn"
    package.mkdir(parents=True)
    source = ("from typing import TYPE_CHECKING\nfrom ..config import X\n"
              "from . import layers\nif TYPE_CHECKING:\n    from ..runs import Y\n"
              "def f():\n    from ..gradcheck import check_op\n")
    (package / "blocks.py").write_text(source)
    known = {f"{PACKAGE}.config", f"{PACKAGE}.nn.layers", f"{PACKAGE}.runs",
             f"{PACKAGE}.gradcheck", f"{PACKAGE}.nn.blocks"}
    found = imports_of(f"{PACKAGE}.nn.blocks", package / "blocks.py", dict.fromkeys(known))
    assert found == {f"{PACKAGE}.config", f"{PACKAGE}.nn.layers", f"{PACKAGE}.gradcheck"}


# ------------------------------------------------------------------------- the reference alone
FUNCTIONAL_WITHOUT_NUMBA = """
import sys
sys.modules["numba"] = None  # any import of numba now raises ImportError
import numpy as np
import numpy_transformer.functional as F
from numpy_transformer.gradcheck import check_op
rng = np.random.default_rng(0)
x = rng.normal(size=(2, 3, 4))
report = check_op(F.gelu_forward, F.gelu_backward, {"x": x})
assert report.ok(1e-7), report
print("ok", sorted(m for m in sys.modules if "kernels" in m))
"""


def test_functional_imports_and_gradchecks_without_numba():
    proc = subprocess.run([sys.executable, "-c", FUNCTIONAL_WITHOUT_NUMBA],
                          capture_output=True, text=True, cwd=ROOT.parent)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok []"


def test_functional_source_never_names_numba_or_the_kernels():
    for path in sorted((ROOT / "functional").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert "numba" not in text and "kernels" not in text, path


@pytest.mark.parametrize("module", [f"{PACKAGE}.functional", f"{PACKAGE}.nn",
                                    f"{PACKAGE}.config"])
def test_importing_the_library_loads_no_numba(module):
    proc = subprocess.run([sys.executable, "-c", f"import sys, {module}; "
                           "print('numba' in sys.modules)"],
                          capture_output=True, text=True, cwd=ROOT.parent)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


NUMPY_RUN_WITHOUT_NUMBA = """
import sys
sys.modules["numba"] = None  # any import of numba now raises ImportError
from numpy_transformer.cli import main
code = main(["train", "--backend", "numpy", "--width", "16", "--heads", "2", "--layers", "1",
             "--ffn-width", "32", "--context", "16", "--batch", "4", "--steps", "3",
             "--eval-every", "0", "--save-every", "0", "--quiet", "--out", sys.argv[1]])
print("exit", code, sorted(m for m in sys.modules if "kernels" in m))
"""


def test_a_numpy_backend_run_executes_no_numba_code(tmp_path):
    """``train --backend numpy``: model, loss, optimiser, sampling and report all on the
    references, in a process where numba cannot even be imported."""
    proc = subprocess.run([sys.executable, "-c", NUMPY_RUN_WITHOUT_NUMBA, str(tmp_path / "run")],
                          capture_output=True, text=True, cwd=ROOT.parent)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "exit 0 []", proc.stdout
    assert (tmp_path / "run" / "checkpoint.npz").is_file()


GRADCHECK_WITHOUT_NUMBA = """
import sys
sys.modules["numba"] = None  # any import of numba now raises ImportError
import numpy as np
from numpy_transformer import gradcheck_tables
for name, section in gradcheck_tables.SECTIONS.items():
    checks = section(np.random.default_rng(0))  # builds every module and model of the section
    report = next(checks)()
    assert report.ok(1e-6), report
print("ok", sorted(m for m in sys.modules if "kernels" in m))
"""


def test_gradcheck_tables_check_the_references_without_numba():
    """``numpy-transformer gradcheck`` checks the hand-written backwards: its ops, modules and
    models run on the references and compile nothing (see gradcheck_tables' docstring)."""
    proc = subprocess.run([sys.executable, "-c", GRADCHECK_WITHOUT_NUMBA],
                          capture_output=True, text=True, cwd=ROOT.parent)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok []"


# ------------------------------------------------------------------------- the math in front
# functional/ and nn/ read no ambient state: what a cache keeps is the same in every context
AMBIENT = {"ownership", "contextvars"}
# the methods a reader steps into from a model: each must be the function of its class's body
STEPPED_INTO = ("__call__", "forward", "backward", "loss_and_backward", "loss_forward",
                "loss_backward")
# what the training step leaves to the numba backend (train.py names none of it)
MACHINERY = re.compile(r"\bcompil\w*|\btiers?\b|\bthreads?\b|\bownership\b|\bborrow\w*|"
                       r"sys\.modules")


def imported_names(source: str) -> set[str]:
    """Every name an import of ``source`` mentions: each part of the module path and each
    name imported from it (``from ..ownership import kept``: ownership, kept)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(part for alias in node.names for part in alias.name.split("."))
        elif isinstance(node, ast.ImportFrom):
            names.update((node.module or "").split("."))
            names.update(alias.name for alias in node.names)
    return names - {""}


@pytest.mark.parametrize("package", ["functional", "nn"])
def test_the_math_reads_no_ambient_state(package):
    for path in sorted((ROOT / package).rglob("*.py")):
        found = imported_names(path.read_text(encoding="utf-8")) & AMBIENT
        assert not found, f"{path.relative_to(ROOT)} imports {sorted(found)}"


def test_the_ambient_state_check_sees_both_kinds_of_import():
    """Negative control: the imports the references had before issue 41."""
    assert imported_names("from ..ownership import kept\n") & AMBIENT == {"ownership"}
    assert imported_names("import contextvars\n") & AMBIENT == {"contextvars"}
    assert imported_names("from .. import ownership\nimport numpy as np\n") & AMBIENT


def replaced_methods(cls: type) -> list[str]:
    """The methods of :data:`STEPPED_INTO` in ``cls``'s own namespace that are not the
    function written in its body (a wrapper installed by a base class, a decorator, a
    metaclass); ``functools.wraps`` copies a name, not the code a debugger steps into."""
    return [f"{cls.__qualname__}.{name}" for name in STEPPED_INTO if name in cls.__dict__
            and getattr(cls.__dict__[name], "__code__", None) is not None
            and cls.__dict__[name].__code__.co_qualname != f"{cls.__qualname__}.{name}"]


def _module_classes() -> list[type]:
    import numpy_transformer.nn  # noqa: F401  (every module class is defined on import)
    from numpy_transformer.nn import Module

    found, todo = [Module], [Module]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith(f"{PACKAGE}.nn"):
                found.append(sub)
                todo.append(sub)
    return found


def test_no_module_method_is_replaced_at_class_creation():
    """A debugger stepping into ``model.forward`` lands in the model's own forward: no
    ``__init_subclass__``, no metaclass, every method a reader steps into as written."""
    classes = _module_classes()
    assert len(classes) > 15
    for cls in classes:
        assert type(cls) is type, f"{cls.__qualname__} has a metaclass"
        assert "__init_subclass__" not in cls.__dict__, cls.__qualname__
        assert replaced_methods(cls) == []
    tree = ast.parse((ROOT / "nn" / "module.py").read_text(encoding="utf-8"))
    assert "__init_subclass__" not in {n.name for n in ast.walk(tree)
                                       if isinstance(n, ast.FunctionDef)}


def test_the_replaced_method_check_sees_a_wrapper():
    """Negative control: the wrapping the modules had before issue 41."""
    class Base:
        def __init_subclass__(cls, **kwargs):
            super().__init_subclass__(**kwargs)
            forward = cls.forward

            @functools.wraps(forward)
            def recorded(self, *args):
                return forward(self, *args)
            cls.forward = recorded

    class Layer(Base):
        def forward(self, x):
            return x

        def backward(self, dout):
            return dout

    assert replaced_methods(Layer) == [f"{Layer.__qualname__}.forward"]


def machinery(source: str) -> list[str]:
    """What ``source`` names of the numba backend's business (:data:`MACHINERY`)."""
    return sorted(set(MACHINERY.findall(source)))


def test_the_training_step_names_no_compile_tier_or_thread_machinery():
    """``Trainer.step`` is forward, loss, backward, clip, update: compiling, tiers, threads
    and borrowing are the numba backend's, behind ``backend.py``."""
    assert machinery((ROOT / "train.py").read_text(encoding="utf-8")) == []


def test_the_machinery_check_sees_a_tier_poll():
    """Negative control: the lines ``Trainer.step`` had before issue 40."""
    assert machinery('tiers = sys.modules.get("numpy_transformer.kernels._tiers")\n'
                     "from .compile_ahead import precompile\n") == [
        "compile_ahead", "sys.modules", "tiers"]

"""No function of the package is longer than 60 lines, docstring included.

A function is counted from its ``def`` line to its last line (decorators aside), methods and
nested functions alike. Compiled kernels are the exception: a function decorated with
numba's ``njit`` or ``jit`` (``@njit(...)``, ``@numba.njit``) is one loop nest the compiler
must see whole, so it and the functions inside it are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "numpy_transformer"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE
LIMIT = 60
COMPILERS = ("njit", "jit")  # numba's decorators that compile a kernel

# Functions allowed over the limit, each with its reason (none today). The test fails on an
# entry that is no longer too long.
ALLOWED: set[str] = set()


def _compiled(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
        if name in COMPILERS:
            return True
    return False


def long_functions(source: str, filename: str, limit: int = LIMIT) -> list[tuple[str, int, int]]:
    """``(qualified name, line, length)`` of each function in ``source`` longer than ``limit``."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if _compiled(child):
                    continue
                length = child.end_lineno - child.lineno + 1
                if length > limit:
                    found.append((prefix + child.name, child.lineno, length))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source, filename), "")
    return found


def package_long_functions() -> dict[str, str]:
    """``"path::name"`` -> ``"path:line name (length lines)"`` over every module."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        for name, line, length in long_functions(path.read_text(encoding="utf-8"), str(path)):
            found[f"{relative}::{name}"] = f"{PACKAGE}/{relative}:{line} {name} ({length} lines)"
    return found


def test_no_function_is_longer_than_the_limit():
    found = package_long_functions()
    too_long = [where for key, where in found.items() if key not in ALLOWED]
    assert not too_long, f"functions longer than {LIMIT} lines:\n" + "\n".join(too_long)


def test_every_allowed_function_is_still_too_long():
    """An entry of ALLOWED whose function was split (or renamed) is removed from the list."""
    stale = sorted(ALLOWED - set(package_long_functions()))
    assert not stale, f"no longer over {LIMIT} lines, remove from ALLOWED: {stale}"


def _function(lines: int, decorator: str = "", indent: str = "") -> str:
    """The source of a function ``f`` of exactly ``lines`` lines (a docstring counts)."""
    body = [f'{indent}    """A docstring."""'] + [f"{indent}    x{i} = {i}"
                                                  for i in range(lines - 2)]
    head = [f"{indent}{decorator}"] if decorator else []
    return "\n".join(head + [f"{indent}def f():"] + body) + "\n"


def test_negative_control_a_61_line_function_is_reported():
    assert long_functions(_function(61), "one.py") == [("f", 1, 61)]
    assert long_functions(_function(60), "one.py") == []  # the limit itself is allowed
    method = "class Model:\n" + _function(70, indent="    ")
    assert long_functions(method, "one.py") == [("Model.f", 2, 70)]
    nested = "def outer():\n" + _function(61, indent="    ")
    assert long_functions(nested, "one.py") == [("outer", 1, 62), ("outer.f", 2, 61)]


@pytest.mark.parametrize("decorator", ["@njit", "@njit(cache=True)", "@numba.njit(nogil=True)",
                                       "@numba.jit", "@jit(nopython=True)"])
def test_compiled_kernels_are_not_counted(decorator):
    assert long_functions(_function(100, decorator), "kernel.py") == []
    other = _function(100, "@functools.cache")  # any other decorator is counted
    assert long_functions(other, "cached.py") == [("f", 2, 100)]

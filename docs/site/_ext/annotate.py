"""What an annotated reference shows, read from a ``functional/`` module's source, and the
contract it checks: every backward line is tagged with the forward equation it differentiates.

A module's *groups* are what its page shows, one after the other:

* a **pair**: ``<stem>_forward`` and ``<stem>_backward`` of the module's ``__all__``, with
  the equations of the forward's Notes (or of the module's Notes when the forward has none),
  and the helpers of the module the two call whose code carries a tag (``scores_forward`` and
  ``repeat_kv`` for attention, ``compose_backward`` for the feed-forward network);
* an **update**: a function of ``__all__`` that is no pair's but whose lines are tagged with
  the module's Notes (``adam_update``).

A tagged function of ``__all__`` that calls a function a pair shows joins that pair
(``attention_weights``, the forward's first steps, for plotting).

The contract, checked for every group (:func:`check_group`):

1. A tag is a ``(n)`` in a comment (``# (3) out = ...``, ``# (0)-(4)``; a range names every
   equation between its ends), or at the start of a helper's docstring (``"(0) The keys ..."``,
   which tags the helper's whole body). Every tag must name an equation of the group's Notes.
2. A **backward line** is a statement of a backward function (the pair's ``*_backward``, the
   helpers it calls, an update) that computes something: anything but the plumbing around
   the math, which is unpacking the cache, ``check_*`` calls and ``raise``, shapes, reshapes,
   allocations (``np.zeros``, ``np.empty_like``, ...), choosing between arrays
   (``a if c else b``), returning names, and delegating to a helper shown on the same page.
   Every backward line must stand under a tag: on its own line, in the comment lines above
   it (a tag heads the lines below it, up to the next tag, as a reader reads it), or in its
   function's docstring.

A violation is a :class:`ContractError` that names the file and line of each offence.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import io
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from equations import Equation, notes_equations, sections

TAG = re.compile(r"\((\d+[a-z]?)\)(?:\s*-\s*\((\d+[a-z]?)\))?")
CELL = re.compile(r"^# %% (\w+)\n", re.MULTILINE)  # a check-it-yourself cell: # %% <stem>
# calls that move or shape arrays without computing (the plumbing of a backward)
PLUMBING_CALLS = {"np.zeros", "np.zeros_like", "np.empty", "np.empty_like", "np.ones",
                  "tuple", "list", "len", "range", "reversed", "zip", "isinstance", "type",
                  "reshape", "copy", "astype", "swapaxes"}


class ContractError(ValueError):
    """A reference breaks the annotation contract; the message names each ``file:line``."""


@dataclass
class Function:
    """One function of the module as the page shows it."""

    name: str
    node: ast.FunctionDef
    backward: bool  # its lines are held to the contract (2)
    doc_tags: list[str] = field(default_factory=list)  # the tags of its docstring's summary


@dataclass
class Group:
    """A pair or an update: its title, its equations and prose, its functions in order."""

    stem: str  # "sdpa", "adam_update"
    title: str  # "sdpa_forward / sdpa_backward"
    forward: str | None  # the forward's name, None for an update
    equations: list[Equation]
    prose: list[tuple[int, str]]  # (equations before it, paragraph)
    functions: list[Function]

    @property
    def numbers(self) -> list[str]:
        """The equation numbers in order, each once (a gated variant shares its number)."""
        return list(dict.fromkeys(e.number for e in self.equations))


@dataclass
class ModuleInfo:
    """A functional module: its name, file, source lines, comments and groups."""

    name: str  # "attention"
    path: Path
    module: object
    lines: list[str]  # the source, lines[0] is line 1
    comments: dict[int, str]  # line -> the text of its comment
    full_comment_lines: set[int]  # lines that hold nothing but a comment
    tree: ast.Module
    groups: list[Group]
    others: list[str]  # names of __all__ in no group (constants, tables: no backward)


def load(name: str, package: str = "numpy_transformer.functional") -> ModuleInfo:
    """Read the functional module ``name`` and find its groups (not yet checked)."""
    module = importlib.import_module(f"{package}.{name}")
    path = Path(inspect.getsourcefile(module))
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    comments, full = _comments(source)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    exported = list(getattr(module, "__all__", []))
    module_notes = sections(inspect.getdoc(module) or "").get("Notes", "")
    info = ModuleInfo(name, path, module, source.splitlines(), comments, full, tree, [], [])
    grouped: set[str] = set()
    pair_names = {n for n in exported if n.endswith(("_forward", "_backward"))}
    for name_ in exported:
        if not name_.endswith("_forward") or name_[:-8] + "_backward" not in exported:
            continue
        stem = name_[:-8]
        forward, backward = functions[name_], functions[stem + "_backward"]
        notes = sections(inspect.getdoc(getattr(module, name_)) or "").get("Notes", "")
        equations, prose = notes_equations(notes)
        if not equations:
            equations, prose = notes_equations(module_notes)
        helpers_f = _helpers(forward, functions, info, exclude=pair_names)
        helpers_b = _helpers(backward, functions, info, exclude=pair_names | set(helpers_f))
        shown = [Function(name_, forward, False)] + [
            Function(h, functions[h], False) for h in helpers_f] + [
            Function(stem + "_backward", backward, True)] + [
            Function(h, functions[h], True) for h in helpers_b]
        info.groups.append(Group(stem, f"{name_} / {stem}_backward", name_, equations, prose,
                                 _in_source_order(shown)))
        grouped |= {name_, stem + "_backward"}
    for name_ in exported:
        node = functions.get(name_)
        shown = {f.name for g in info.groups for f in g.functions}
        if name_ in grouped | shown or node is None or not _tags_of(node, info):
            continue
        home = next((g for g in info.groups if {f.name for f in g.functions}
                     & set(_called(node))), None)
        if home is not None:  # attention_weights: the forward's first steps, for plotting
            home.functions = _in_source_order(home.functions + [Function(name_, node, False)])
        else:  # an update (adam_update): the module's Notes, its lines held to the contract
            equations, prose = notes_equations(module_notes)
            info.groups.append(Group(name_, name_, None, equations, prose,
                                     [Function(name_, node, True)]))
        grouped.add(name_)
    shown = {f.name for g in info.groups for f in g.functions}
    info.others = [n for n in exported if n not in grouped | shown]
    for group in info.groups:
        for function in group.functions:
            function.doc_tags = _doc_tags(function.node, group)
    return info


def _comments(source: str) -> tuple[dict[int, str], set[int]]:
    comments, full = {}, set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string
            if not token.line[:token.start[1]].strip():
                full.add(token.start[0])
    return comments, full


def _in_source_order(functions: list[Function]) -> list[Function]:
    return sorted(functions, key=lambda f: f.node.lineno)


def _called(node: ast.FunctionDef) -> list[str]:
    """Names called in a function's body, in order, each once."""
    names = [n.func.id for n in ast.walk(node)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    return list(dict.fromkeys(names))


def _helpers(node: ast.FunctionDef, functions: dict, info: ModuleInfo,
             exclude: set[str]) -> list[str]:
    """The module's functions that ``node`` calls, directly or through each other, whose code
    carries a tag; check_* and the functions of another pair are left out."""
    found: list[str] = []
    todo = _called(node)
    while todo:
        name = todo.pop(0)
        if name in found or name in exclude or name not in functions \
                or name.startswith(("check_", "_check")):
            continue
        if _tags_of(functions[name], info):
            found.append(name)
        todo += _called(functions[name])
    return found


def _tags_of(node: ast.FunctionDef, info: ModuleInfo) -> bool:
    """Whether a function's comments or docstring summary hold a tag."""
    doc = ast.get_docstring(node) or ""
    return bool(TAG.match(doc)) or any(
        TAG.search(info.comments[line]) for line in range(node.lineno, node.end_lineno + 1)
        if line in info.comments)


def tags_in(text: str, numbers: list[str]) -> list[str]:
    """The equation numbers a comment names: each ``(n)``, and every number of a range
    ``(a)-(b)`` in the order of ``numbers``. A number that is not in ``numbers`` is kept
    (the check reports it)."""
    found: list[str] = []
    for match in TAG.finditer(text):
        first, last = match.groups()
        if last and first in numbers and last in numbers:
            found += numbers[numbers.index(first):numbers.index(last) + 1]
        else:
            found += [first] + ([last] if last else [])
    return found


def _doc_tags(node: ast.FunctionDef, group: Group) -> list[str]:
    doc = ast.get_docstring(node) or ""
    match = TAG.match(doc)
    return tags_in(match.group(), group.numbers) if match else []


# ------------------------------------------------------------------------ the contract
def check(info: ModuleInfo) -> None:
    """Raise :class:`ContractError` listing every offence of the module's groups."""
    problems = [p for group in info.groups for p in check_group(info, group)]
    if problems:
        raise ContractError("\n".join(problems))


def check_group(info: ModuleInfo, group: Group) -> list[str]:
    """The offences of one group, each ``path:line: what is wrong``."""
    problems: list[str] = []
    where = _where(info)
    if not group.equations:
        line = group.functions[0].node.lineno
        problems.append(f"{where}:{line}: {group.title} has no numbered equations in its "
                        f"Notes (nor has the module): the tags have nothing to name")
    for function in group.functions:
        for line, numbers in line_tags(info, function, group).items():
            for number in numbers:
                if number not in group.numbers:
                    problems.append(f"{where}:{line}: tag ({number}) names no equation of "
                                    f"{group.title}; its Notes number "
                                    f"{', '.join(f'({n})' for n in group.numbers) or 'none'}")
        if function.backward:
            shown = {f.name for f in group.functions}
            for stmt in _statements(function.node.body, skip_docstring=True):
                if not _is_plumbing(stmt, shown) and not governing(info, function, stmt.lineno,
                                                                    stmt.end_lineno, group):
                    code = info.lines[stmt.lineno - 1].strip()
                    problems.append(f"{where}:{stmt.lineno}: {function.name}: backward line "
                                    f"without an equation tag: `{code}` (tag it `# (n) ...` "
                                    f"with the forward equation it differentiates)")
    return problems


def _where(info: ModuleInfo) -> str:
    parts = info.path.parts
    return "/".join(parts[parts.index("numpy_transformer"):]) \
        if "numpy_transformer" in parts else str(info.path)


def line_tags(info: ModuleInfo, function: Function, group: Group) -> dict[int, list[str]]:
    """line -> the equation numbers its comment names, over one function (its docstring's
    tag counts for its ``def`` line)."""
    out = {}
    if function.doc_tags:
        out[function.node.lineno] = function.doc_tags
    for line in range(function.node.lineno, function.node.end_lineno + 1):
        if line in info.comments and TAG.search(info.comments[line]):
            out[line] = tags_in(info.comments[line], group.numbers)
    return out


def governing(info: ModuleInfo, function: Function, first: int, last: int,
              group: Group) -> list[str]:
    """The equation numbers a statement on lines first..last stands under: a tag on one of
    its lines, else the nearest tag comment line above it in its function, else its
    function's docstring tag; [] if none."""
    for line in range(first, last + 1):
        if line in info.comments and TAG.search(info.comments[line]):
            return tags_in(info.comments[line], group.numbers)
    for line in range(first - 1, function.node.lineno, -1):
        if line in info.full_comment_lines and TAG.search(info.comments[line]):
            return tags_in(info.comments[line], group.numbers)
    return function.doc_tags


def _statements(body: list[ast.stmt], skip_docstring: bool = False):
    """The simple statements of a body, compound ones opened (their headers are plumbing)."""
    for i, stmt in enumerate(body):
        if skip_docstring and i == 0 and isinstance(stmt, ast.Expr) \
                and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
            continue
        if isinstance(stmt, (ast.For, ast.While, ast.If, ast.With)):
            yield from _statements(stmt.body)
            yield from _statements(getattr(stmt, "orelse", []))
        else:
            yield stmt


def _call_name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        base = func.value.id if isinstance(func.value, ast.Name) else ""
        return f"{base}.{func.attr}" if base == "np" else func.attr
    return ""


def _is_plumbing(stmt: ast.stmt, shown: set[str]) -> bool:
    """Whether a statement of a backward moves things around the math rather than computing
    (see the module docstring)."""
    if isinstance(stmt, (ast.Raise, ast.Pass, ast.Continue, ast.Break)):
        return True
    if isinstance(stmt, ast.Expr):
        return isinstance(stmt.value, ast.Call) and _call_name(stmt.value).startswith("check_")
    if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.Return)):
        return stmt.value is None or _plumbing_expr(stmt.value, shown)
    return False


def _plumbing_expr(node: ast.expr, shown: set[str]) -> bool:
    if isinstance(node, (ast.Name, ast.Constant, ast.Attribute)):
        return True
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_plumbing_expr(e, shown) for e in node.elts)
    if isinstance(node, ast.Subscript):  # the index is bookkeeping
        return _plumbing_expr(node.value, shown)
    if isinstance(node, ast.IfExp):
        return _plumbing_expr(node.body, shown) and _plumbing_expr(node.orelse, shown)
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.operand, ast.Constant)
    if isinstance(node, (ast.GeneratorExp, ast.ListComp)):
        return _plumbing_expr(node.elt, shown)
    if isinstance(node, ast.Call):
        name = _call_name(node)
        if name.startswith("check_") or name in shown:  # a check, or a helper shown here
            return True
        if name in PLUMBING_CALLS:
            receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
            return receiver is None or name.startswith("np.") \
                or _plumbing_expr(receiver, shown)
    return False


def check_cells(info: ModuleInfo, text: str, where: str) -> dict[str, str]:
    """The check-it-yourself cells of a module's check file (``# %% <stem>`` then its code),
    ``{stem: code}``; :class:`ContractError` unless every pair has exactly one and every
    cell names a pair."""
    parts = CELL.split(text)
    stems = parts[1::2]
    cells = dict(zip(stems, (c.strip("\n") + "\n" for c in parts[2::2]), strict=True))
    pairs = [g.stem for g in info.groups if g.forward]
    missing = [p for p in pairs if p not in cells]
    unknown = [c for c in cells if c not in pairs]
    twice = sorted({s for s in stems if stems.count(s) > 1})
    if missing or unknown or twice:
        raise ContractError(f"{where}: every pair needs one cell `# %% <stem>`: missing "
                            f"{missing or 'none'}, naming no pair {unknown or 'none'}, "
                            f"twice {twice or 'none'}")
    return cells

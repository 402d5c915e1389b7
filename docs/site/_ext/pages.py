"""The RST of an annotated reference: a functional module's pairs, each with its equations as
numbered math beside its code (tags linked both ways), its shapes and its check.

:func:`module_page` is what ``book.generate`` writes to
``docs/site/_generated/functional/<module>.rst``; :mod:`annotate` has read the module and
checked its contract before.
"""

from __future__ import annotations

import html
import inspect
import re

import annotate
from equations import LatexError, sections, to_latex
from pygments.lexers import PythonLexer
from pygments.token import STANDARD_TYPES, Comment, String


def module_page(info: annotate.ModuleInfo, cells: dict[str, tuple[str, str]]) -> str:
    """The RST of one annotated reference."""
    source = f"numpy_transformer/functional/{info.name}.py"
    title = f"functional/{info.name}.py"
    parts = [f".. This page is generated from {source} when the site is built "
             f"(docs/site/_ext/book.py): edit the source, not this page.\n",
             f".. _annotated-{info.name}:\n", title, "=" * len(title), ""]
    doc = sections(_module_doc(info))
    parts += [doc[""], ""]
    if doc.get("References"):
        parts += [".. rubric:: References", ""] + [
            f"| {line.strip()}" if not line.startswith(" ") else f"  {line.strip()}"
            for line in doc["References"].splitlines()] + [""]
    if info.groups:
        parts += ["Every backward line below (and every line of an update) is tagged with the "
                  "equation it differentiates: a tag links to its equation, an equation to the "
                  "lines that use it, and the build fails if a tag is missing or names no "
                  "equation.", ""]
    else:
        parts += ["This module holds no forward/backward pair: what it makes is a constant "
                  "of the computation (no gradient flows into it).", ""]
    for group in info.groups:
        parts += group_section(info, group, cells.get(group.stem))
    if info.others:
        parts += [".. rubric:: Also in this module", ""]
        parts += [f"* :func:`numpy_transformer.functional.{n}`" for n in info.others]
        parts.append("")
    return "\n".join(parts) + "\n"


def _module_doc(info: annotate.ModuleInfo) -> str:

    return inspect.getdoc(info.module) or ""


def group_section(info: annotate.ModuleInfo, group: annotate.Group,
                  cell: tuple[str, str] | None) -> list[str]:
    api = "numpy_transformer.functional"
    names = [group.forward, group.forward[:-8] + "_backward"] if group.forward else [group.stem]
    out = [group.title, "-" * len(group.title), "",
           " and ".join(f":func:`{api}.{n}`" for n in names) + ": "
           + " ".join(_summary(info, n) for n in names), ""]
    shapes = shape_rows(info, group)
    if shapes:
        out += [".. rubric:: Shapes", "", ".. list-table::", "   :header-rows: 1",
                "   :class: shapes", "", "   * - array", "     - shape", "     - what it is"]
        for name, shape, what in shapes:
            out += [f"   * - ``{name}``", f"     - ``{shape}``", f"     - {rst_text(what)}"]
        out.append("")
    out += [".. container:: annotated", "", "   .. container:: annotated-equations", ""]
    out += _indent(equation_column(info, group), 6)
    out += ["   .. container:: annotated-code", "", "      .. raw:: html", ""]
    out += _indent([code_column(info, group)], 9)
    if cell:
        code, printed = cell
        out += [".. rubric:: Check it yourself", "",
                "The finite-difference check of this pair (``numpy_transformer.gradcheck``), "
                "run when this page was built; it prints what follows it.", "",
                ".. code-block:: python", ""] + _indent([code], 3) + [
                ".. code-block:: text", "   :class: check-output", ""] + _indent(
                [printed or "(nothing printed)"], 3)
    elif not group.forward:
        out += [".. rubric:: Check it yourself", "",
                "An update has no gradient to check: ``tests/test_optim.py`` holds it to "
                "``torch.optim``'s numbers step by step (the fixtures in ``tests/fixtures``), "
                "and ``reference_checks/`` against PyTorch itself.", ""]
    return out


def _summary(info: annotate.ModuleInfo, name: str) -> str:
    doc = getattr(info.module, name).__doc__ or ""
    return rst_text(sections(_dedent(doc))[""].split("\n\n")[0].replace("\n", " "),
                     keep_markup=True)


def _dedent(doc: str) -> str:

    return inspect.cleandoc(doc)


def _indent(blocks: list[str], n: int) -> list[str]:
    """Each block indented by n spaces, a blank line after each."""
    pad = " " * n
    return [line for block in blocks for line in (
        "\n".join(pad + row if row else "" for row in block.split("\n")), "")]


def rst_text(text: str, keep_markup: bool = False) -> str:
    """Plain words as RST: the characters RST reads as markup escaped (unless keep_markup)."""
    return text if keep_markup else re.sub(r"([\\`*_|])", r"\\\1", text)


def shape_rows(info: annotate.ModuleInfo, group: annotate.Group) -> list[tuple[str, str, str]]:
    """(name, shape, what) of the forward's parameters and returns with a shape, and of the
    fields of the cache it returns (their shape comments)."""
    if not group.forward:
        return []
    doc = sections(_dedent(getattr(info.module, group.forward).__doc__ or ""))
    rows, cache_class = [], None
    for section, role in (("Parameters", "input"), ("Returns", "output")):
        for match in re.finditer(r"^(\S[^:\n]*?) : (.*)$", doc.get(section, ""), re.MULTILINE):
            names, kind = match.groups()
            shape = re.search(r"shape (\(.*?\))", kind)
            if names.strip() == "cache":
                cache_class = kind.strip()
            elif shape:
                rows += [(n.strip(), shape.group(1), role) for n in names.split(",")]
    for node in info.tree.body:
        if isinstance(node, annotate.ast.ClassDef) and node.name == cache_class:
            for field in node.body:
                comment = info.comments.get(field.lineno, "").lstrip("# ")
                shape = re.match(r"(\([^)]*\))[,:]?\s*(.*)", comment)
                if shape and hasattr(field, "target"):
                    rows.append((f"cache.{field.target.id}", shape.group(1),
                                 "kept for the backward" + (f": {shape.group(2)}"
                                                            if shape.group(2) else "")))
    return rows


def equation_column(info: annotate.ModuleInfo, group: annotate.Group) -> list[str]:
    """RST blocks: prose before the equations, each equation (anchor, math, note, uses),
    prose after."""
    uses = _uses(info, group)
    out = [_prose(text, group) for n, text in group.prose if n == 0]
    for number in group.numbers:
        out.append(f'.. raw:: html\n\n   <span class="eq-anchor" id="eq-{group.stem}-{number}">'
                   f'</span>')
        for eq in (e for e in group.equations if e.number == number):
            try:
                latex = to_latex(eq.math)
            except LatexError as e:
                line = group.functions[0].node.lineno
                raise annotate.ContractError(f"{annotate._where(info)}:{line}: equation "
                                             f"({number}) of "
                                      f"{group.title}: {e}") from None
            label = rf"\text{{{eq.label}: }}\; " if eq.label else ""
            out.append(f".. math::\n   :nowrap:\n\n   \\[ {label}{latex} \\tag{{{number}}} \\]")
            if eq.note:
                out.append(f".. container:: eq-note\n\n   {rst_text(eq.note)}")
        links = " · ".join(
            f"{html.escape(fn)} " + ", ".join(
                f'<a href="#{group.stem}-L{line}">{line}</a>' for line in lines)
            for fn, lines in uses.get(number, {}).items())
        out.append('.. raw:: html\n\n   <p class="eq-uses">' + (
            f"used in {links}" if links else "tagged on no line") + "</p>")
    out += [_prose(text, group) for n, text in group.prose if n > 0]
    return out


def _prose(text: str, group: annotate.Group) -> str:
    """A Notes paragraph; its (n) link to the equations."""
    return re.sub(r"\((\d+[a-z]?)\)", lambda m: f"`({m.group(1)}) <#eq-{group.stem}-"
                  f"{m.group(1)}>`__" if m.group(1) in group.numbers else m.group(), text)


def _uses(info: annotate.ModuleInfo, group: annotate.Group) -> dict[str, dict[str, list[int]]]:
    """number -> {function: the lines whose tag names it}."""
    out: dict[str, dict[str, list[int]]] = {}
    for function in group.functions:
        for line, numbers in annotate.line_tags(info, function, group).items():
            for number in numbers:
                out.setdefault(number, {}).setdefault(function.name, []).append(line)
    return out


def code_column(info: annotate.ModuleInfo, group: annotate.Group) -> str:
    """The HTML of the group's functions: highlighted, numbered as in the file, each line an
    anchor, each tag a link to its equation, docstrings folded to their first line."""
    blocks = []
    for function in group.functions:
        node = function.node
        shown = _shown_lines(info, node)
        text = "\n".join(info.lines[n - 1] if isinstance(n, int) else n[1] for n in shown)
        lines = _highlight(text, group)
        rows = []
        for number, body in zip(shown, lines, strict=True):
            line = number if isinstance(number, int) else number[0]
            tags = annotate.governing(info, function, line, line, group) \
                if function.backward else []
            classes = "line" + (" backward" if function.backward else "")
            data = f' data-eq="{" ".join(tags)}"' if tags else ""
            rows.append(f'<span class="{classes}" id="{group.stem}-L{line}"{data}>'
                        f'<a class="lineno" href="#{group.stem}-L{line}">{line:>4}</a> '
                        f"{body}</span>")
        kind = "backward" if function.backward else "forward"
        blocks.append(f'<div class="fn {kind}"><div class="fn-head">{html.escape(function.name)}'
                      f' <span>{annotate._where(info)}, lines {node.lineno}-{node.end_lineno}'
                      f'</span></div><div class="highlight"><pre>' + "".join(rows)
                      + "</pre></div></div>")
    return "".join(blocks)


def _shown_lines(info: annotate.ModuleInfo, node) -> list:
    """Line numbers of a function, its docstring folded: (line, text) for the folded line."""
    body0 = node.body[0]
    doc_lines = set()
    folded = None
    if isinstance(body0, annotate.ast.Expr) and isinstance(getattr(body0, "value", None),
                                                           annotate.ast.Constant):
        if body0.end_lineno > body0.lineno:
            first = info.lines[body0.lineno - 1].rstrip()
            folded = (body0.lineno, first + ' …"""')
            doc_lines = set(range(body0.lineno + 1, body0.end_lineno + 1))
    out = []
    for line in range(node.lineno, node.end_lineno + 1):
        if line in doc_lines:
            continue
        out.append(folded if folded and line == folded[0] else line)
    return out


def _css_class(ttype) -> str:
    while ttype not in STANDARD_TYPES:
        ttype = ttype.parent
    return STANDARD_TYPES[ttype]


def _highlight(text: str, group: annotate.Group) -> list[str]:
    """Pygments' Python highlighting, line by line, with the tags in comments (and in a
    folded docstring) made links to the equations."""
    lines, current = [], []
    for ttype, value in PythonLexer().get_tokens(text):
        for i, piece in enumerate(value.split("\n")):
            if i:
                lines.append("".join(current))
                current = []
            if not piece:
                continue
            escaped = html.escape(piece)
            if ttype in Comment or ttype in String.Doc or ttype in String:
                escaped = annotate.TAG.sub(lambda m: _tag_links(m, group), escaped) \
                    if ttype in Comment or ttype in String.Doc else escaped
            css = _css_class(ttype)
            current.append(f'<span class="{css}">{escaped}</span>' if css else escaped)
    if current:
        lines.append("".join(current))
    return lines[:len(text.split("\n"))]


def _tag_links(match: re.Match, group: annotate.Group) -> str:
    def link(number: str) -> str:
        return f'<a class="eqref" href="#eq-{group.stem}-{number}">({number})</a>'

    first, last = match.groups()
    return link(first) + (match.group()[len(f"({first})"):-len(f"({last})")] + link(last)
                          if last else "")

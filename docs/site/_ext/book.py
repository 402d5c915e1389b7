"""The site's Sphinx extension: the pages generated from the code when the site is built.

* ``docs/site/_generated/functional/<module>.rst``: one annotated reference per module of
  ``numpy_transformer/functional`` (:mod:`annotate` reads it and checks its tags; a broken
  contract stops the build, naming the file and line), with its check-it-yourself cells
  (``docs/site/checks/<module>.py``) run and their output shown.
* ``docs/site/_generated/api/*.rst``: the API reference, the names of the package's
  ``__all__`` and of its subpackages', documented by autodoc and numpydoc.
* The experiments' page shows the figures its text links to, under the experiment's section.

Nothing here is written by hand twice: edit the source, the Notes or the checks, and build.
"""

from __future__ import annotations

import contextlib
import html
import importlib
import io
import pkgutil
import re
import traceback
from pathlib import Path

import annotate
from docutils import nodes
from equations import LatexError, notes_equations, sections, to_latex
from pygments.lexers import PythonLexer
from pygments.token import STANDARD_TYPES, Comment, String
from sphinx import addnodes
from sphinx.errors import SphinxError
from sphinx.transforms import SphinxTransform
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util import logging

SITE = Path(__file__).resolve().parents[1]
GENERATED = SITE / "_generated"
CHECKS = SITE / "checks"
# The public API: the package's __all__ and its subpackages' (torch_twins needs the torch
# extra, export the hf one: documented when importable)
logger = logging.getLogger(__name__)
API = ("numpy_transformer", "numpy_transformer.gradcheck", "numpy_transformer.nn",
       "numpy_transformer.functional", "numpy_transformer.export",
       "numpy_transformer.torch_twins")


class AnnotationError(SphinxError):
    """A functional reference breaks the annotation contract, or its check fails."""

    category = "Annotated reference error"


def setup(app):
    app.connect("builder-inited", generate)
    app.connect("autodoc-process-docstring", notes_as_math, priority=400)  # before numpydoc
    app.add_transform(ExperimentFigures)
    app.add_post_transform(RepositoryLinks)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


def generate(app) -> None:
    """Write every generated page (only those whose text changed). A module that breaks the
    contract gets no page: each offence is an error at its ``file:line``, and the build
    fails (exit status 1, with or without ``-W``)."""
    names = [m.name for m in pkgutil.iter_modules(
        importlib.import_module("numpy_transformer.functional").__path__)]
    pages = {}
    for name in names:
        info = annotate.load(name)
        try:
            annotate.check(info)
            pages[f"functional/{name}.rst"] = module_page(info, run_cells(info))
        except (annotate.ContractError, AnnotationError) as e:
            for offence in re.split(r"\n(?=\S+:\d+: )", str(e)):
                where = re.match(r"(\S+:\d+): (.*)", offence, re.S)
                logger.error(where.group(2) if where else offence,
                             location=where.group(1) if where else None)
            app.statuscode = 1
    pages.update(api_pages())
    for relative, text in pages.items():
        path = GENERATED / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
    for stale in GENERATED.rglob("*.rst"):
        if str(stale.relative_to(GENERATED)) not in pages:
            stale.unlink()


# ------------------------------------------------------------------ check it yourself
def run_cells(info: annotate.ModuleInfo) -> dict[str, tuple[str, str]]:
    """``{stem: (code, what it printed)}`` of the module's check file, every pair covered."""
    path = CHECKS / f"{info.name}.py"
    pairs = [g.stem for g in info.groups if g.forward]
    if not path.exists():
        if pairs:
            raise AnnotationError(f"{path.relative_to(SITE.parents[1])} is missing: it holds "
                                  f"the check-it-yourself cells of {', '.join(pairs)}")
        return {}
    where = path.relative_to(SITE.parents[1])
    try:
        cells = annotate.check_cells(info, path.read_text(encoding="utf-8"), str(where))
    except annotate.ContractError as e:
        raise AnnotationError(str(e)) from None
    out = {}
    for stem, code in cells.items():
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                exec(compile(code, f"{where} (cell {stem})", "exec"), {"__name__": "__check__"})
        except Exception:
            raise AnnotationError(f"{where}: the cell {stem} failed:\n"
                                  f"{traceback.format_exc(limit=-3)}") from None
        out[stem] = (code, printed.getvalue())
    return out


# ------------------------------------------------------------------ the annotated page
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
    import inspect

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
            out += [f"   * - ``{name}``", f"     - ``{shape}``", f"     - {_rst_text(what)}"]
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
    return _rst_text(sections(_dedent(doc))[""].split("\n\n")[0].replace("\n", " "),
                     keep_markup=True)


def _dedent(doc: str) -> str:
    import inspect

    return inspect.cleandoc(doc)


def _indent(blocks: list[str], n: int) -> list[str]:
    """Each block indented by n spaces, a blank line after each."""
    pad = " " * n
    return [line for block in blocks for line in (
        "\n".join(pad + row if row else "" for row in block.split("\n")), "")]


def _rst_text(text: str, keep_markup: bool = False) -> str:
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
                raise AnnotationError(f"{annotate._where(info)}:{line}: equation ({number}) of "
                                      f"{group.title}: {e}") from None
            label = rf"\text{{{eq.label}: }}\; " if eq.label else ""
            out.append(f".. math::\n   :nowrap:\n\n   \\[ {label}{latex} \\tag{{{number}}} \\]")
            if eq.note:
                out.append(f".. container:: eq-note\n\n   {_rst_text(eq.note)}")
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


# ------------------------------------------------------------------ API reference
def notes_as_math(app, what, name, obj, options, lines: list[str]) -> None:
    """In a docstring's Notes (as autodoc reads it, before numpydoc), each numbered equation
    line becomes a displayed equation with its number, as on the annotated pages."""
    try:
        start = next(i for i in range(len(lines) - 1)
                     if lines[i].strip() == "Notes" and set(lines[i + 1].strip()) == {"-"})
    except StopIteration:
        return
    end = next((i for i in range(start + 2, len(lines) - 1)
                if lines[i].strip() and set(lines[i + 1].strip()) == {"-"}
                and not lines[i].startswith(" ")), len(lines))
    out: list[str] = []
    for line in lines[start + 2:end]:
        equations, _ = notes_equations(line.strip()) if line.strip() else ([], [])
        if not equations or line.startswith(" "):
            out.append(line)
            continue
        for eq in equations:
            try:
                latex = to_latex(eq.math)
            except LatexError:
                out += [f"| ({eq.number}) {eq.math}", ""]
                continue
            label = rf"\text{{{eq.label}: }}\; " if eq.label else ""
            out += ["", ".. math::", "   :nowrap:", "",
                    rf"   \[ {label}{latex} \tag{{{eq.number}}} \]", ""]
            out += [_rst_text(eq.note), ""] if eq.note else []
    lines[start + 2:end] = out



def api_pages() -> dict[str, str]:
    """One page per public namespace, from ``__all__``."""
    pages = {}
    toc, left_out = [], []
    for name in API:
        try:
            pages[f"api/{name.split('.')[-1]}.rst"] = _api_page(name)
        except ImportError as e:  # torch_twins without the torch extra, ...
            left_out.append(f"* ``{name}``: {str(e).splitlines()[0]}")
            continue
        toc.append(name.split(".")[-1])
    pages["api/index.rst"] = "\n".join(
        ["API reference", "=============", "",
         "The public API: the names of ``numpy_transformer.__all__`` and of its subpackages' "
         "``__all__``, documented from their numpydoc docstrings.", "",
         ".. toctree::", "   :maxdepth: 1", ""] + [f"   {t}" for t in toc] + (
            ["", "Not documented by this build, for want of an extra:", ""] + left_out
            if left_out else [])) + "\n"
    return pages


def _api_page(name: str) -> str:
    """The RST of one namespace's page; ImportError if the namespace (or a name of its
    ``__all__``) needs a package this environment lacks."""
    module = importlib.import_module(name)
    title = name
    lines = [f".. This page is generated from {name}.__all__ when the site is built.\n",
             title, "=" * len(title), "", f".. automodule:: {name}", "   :no-members:",
             ""]
    names = list(getattr(module, "__all__", [])) or sorted(
        n for n, v in vars(module).items() if not n.startswith("_")
        and getattr(v, "__module__", None) == name and callable(v))
    if name == "numpy_transformer":
        names = [n for n in names if n == "load_run"]
    if name == "numpy_transformer.functional":
        lines += _functional_api(module)
    else:
        for member in names:
            obj = getattr(module, member)
            if isinstance(obj, type(module)):
                continue
            kind = "autoclass" if isinstance(obj, type) else \
                "autofunction" if callable(obj) else "autodata"
            lines += [f".. {kind}:: {name}.{member}"]
            if kind == "autoclass":
                lines += ["   :members:"]
            lines.append("")
    return "\n".join(lines) + "\n"


def _functional_api(package) -> list[str]:
    lines = []
    for module in pkgutil.iter_modules(package.__path__):
        sub = importlib.import_module(f"{package.__name__}.{module.name}")
        title = f"functional/{module.name}.py"
        lines += [title, "-" * len(title), "",
                  f"The annotated reference: :ref:`annotated-{module.name}`.", ""]
        lines += [f".. autofunction:: {package.__name__}.{n}\n" for n in sub.__all__]
    return lines


# ------------------------------------------------------------------ experiments' figures
class ExperimentFigures(SphinxTransform):
    """On ``experiments/README``: each figure the text links to, shown at the end of its
    experiment's section (a link in the summary table's row ``N`` belongs to section N)."""

    default_priority = 400

    def apply(self, **kwargs) -> None:
        if self.env.docname != "experiments/README":
            return
        sections_by_number = {}
        for section in self.document.findall(nodes.section):
            match = re.match(r"(\d+)\.", section[0].astext())
            if match:
                sections_by_number.setdefault(match.group(1), section)
        figures: dict[int, list[tuple[str, str]]] = {}
        for ref in self.document.findall(addnodes.download_reference):
            target = ref.get("reftarget", "")
            if not target.endswith(".png"):
                continue
            row = next((a for a in _ancestors(ref) if isinstance(a, nodes.row)), None)
            number = row[0].astext().strip() if row is not None else None
            section = sections_by_number.get(number) if number else next(
                (a for a in _ancestors(ref) if isinstance(a, nodes.section)), None)
            if section is not None:
                entries = figures.setdefault(id(section), [])
                if target not in [t for t, _ in entries]:
                    entries.append((target, ref.astext()))
        for section in self.document.findall(nodes.section):
            for target, caption in figures.get(id(section), []):
                figure = nodes.figure(classes=["experiment-figure"],
                                      ids=[nodes.make_id(f"figure-{Path(target).stem}")])
                figure += nodes.image(uri=target, alt=caption)
                figure += nodes.caption(text=f"{Path(target).name}: {caption}")
                section += figure


def _ancestors(node):
    while node.parent is not None:
        node = node.parent
        yield node


# ------------------------------------------------------------------ links into the repository
class RepositoryLinks(SphinxPostTransform):
    """A Markdown link to a folder of the repository goes to its README when that is a page
    of the site (``benchmarks/``); a link to a folder or file the site has no page for
    (``docs/notebooks/solutions/``) keeps its text, unlinked. Links to nothing at all are
    left to MyST, which reports them (and the build fails)."""

    default_priority = 8  # before MyST resolves its links (9)

    def run(self, **kwargs) -> None:
        root = SITE.parents[1]
        for node in list(self.document.findall(addnodes.pending_xref)):
            if node.get("reftype") != "myst":
                continue
            here = Path(self.env.doc2path(node.get("refdoc", self.env.docname))).parent
            target = node["reftarget"]
            if node.get("refdomain") == "doc":
                path = root / f"{target}.md"
                if target not in self.env.all_docs and path.exists():
                    node.replace_self(node[0].deepcopy())
                continue
            path = (here / target).resolve()
            if not path.is_dir() or root not in path.parents and path != root:
                continue
            readme = path.relative_to(root) / "README"
            if readme.as_posix() in self.env.all_docs:
                uri = self.app.builder.get_relative_uri(self.env.docname, readme.as_posix())
                reference = nodes.reference("", "", internal=True, refuri=uri)
                reference += node[0].deepcopy()
                node.replace_self(reference)
            else:
                node.replace_self(node[0].deepcopy())

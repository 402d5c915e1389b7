"""The site's Sphinx extension: the pages generated from the code when the site is built.

* ``docs/site/_generated/functional/<module>.rst``: one annotated reference per module of
  ``numpy_transformer/functional`` (:mod:`annotate` reads it and checks its tags, a broken
  contract failing the build at its file and line; :mod:`pages` writes the page), with its
  check-it-yourself cells (``docs/site/checks/<module>.py``) run and their output shown.
* ``docs/site/_generated/api/*.rst``: the API reference, the names of the package's
  ``__all__`` and of its subpackages', documented by autodoc and numpydoc; numbered
  equations in a docstring's Notes render as math there too.
* The experiments' page shows the figures its text links to, under the experiment's section;
  a link to a folder goes to its README page, and one to a file without a page stays text.

Nothing here is written by hand twice: edit the source, the Notes or the checks, and build.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import pkgutil
import re
import traceback
from pathlib import Path

import annotate
from docutils import nodes
from equations import LatexError, notes_equations, to_latex
from pages import module_page, rst_text
from sphinx import addnodes
from sphinx.errors import SphinxError
from sphinx.transforms import SphinxTransform
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util import logging

SITE = Path(__file__).resolve().parents[1]
GENERATED = SITE / "_generated"
CHECKS = SITE / "checks"
logger = logging.getLogger(__name__)
# The public API: the package's __all__ and its subpackages' (torch_twins needs the torch
# extra: documented when importable)
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
            out += [rst_text(eq.note), ""] if eq.note else []
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

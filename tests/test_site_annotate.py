"""The site's annotated references, without building the site: the plain-text math turned
into LaTeX, the Notes read into numbered equations, and the contract every functional
reference keeps (each backward line tagged with the forward equation it differentiates).

``docs/site/_ext/annotate.py`` and ``equations.py`` are the standard library only, so these
run in the default suite: a reference that breaks the contract fails here as well as in the
site's build. Negative controls: a module with an untagged backward line, one with a tag that
names no equation, and a check file that misses a pair are each refused, naming file and line.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "site" / "_ext"))

import annotate  # noqa: E402
from equations import LatexError, notes_equations, split_note, to_latex  # noqa: E402

MODULES = [m.name for m in pkgutil.iter_modules(
    importlib.import_module("numpy_transformer.functional").__path__)]


@pytest.mark.parametrize("text, latex", [
    ("out = x w + b", r"\mathrm{out} = x\, w + b"),
    ("x_hat = x * rrms", r"\hat{x} = x \cdot \mathrm{rrms}"),
    ("s = q k_h^T * scale", r"s = q\, k_{h}^{\top} \cdot \mathrm{scale}"),
    ("s[~mask] = -inf", r"s[\lnot \mathrm{mask}] = -\infty"),
    ("out = p~ v_h", r"\mathrm{out} = \tilde{p}\, v_{h}"),
    ("out_2i+1 = x_2i sin", r"\mathrm{out}_{2i+1} = x_{2i}\, \sin"),
    ("rstd = 1 / sqrt(var + eps)", r"\mathrm{rstd} = 1 / \sqrt{\mathrm{var} + \varepsilon}"),
    ("v_t = β2 v_{t-1} + (1 - β2) g_t²",
     r"v_{t} = \beta_{2}\, v_{t-1} + \left(1 - \beta_{2}\right)\, g_{t}^{2}"),
    ("θ_t = θ_{t-1} - α m̂_t / (√v̂_t + ε)",
     r"\theta_{t} = \theta_{t-1} - \alpha\, \hat{m}_{t} / \left(\sqrt{\hat{v}_{t}} + "
     r"\varepsilon\right)"),
    ("loss = -(1/N) sum_{counted n} logp[n, target_n]",
     r"\mathrm{loss} = -\left(1/N\right)\, \sum_{\text{counted }n}\, "
     r"\mathrm{logp}[n, \mathrm{target}_{n}]"),
    ("k_h = k[h // G], G = H / H_kv",
     r"k_{h} = k[h \mathbin{/\!/} G], G = H / H_{\mathrm{kv}}"),
    ("i_t = σ(z_i),  f_t = σ(z_f)",
     r"i_{t} = \sigma\left(z_{i}\right),\quad f_{t} = \sigma\left(z_{f}\right)"),
])
def test_plain_text_math_becomes_latex(text, latex):
    assert to_latex(text) == latex


@pytest.mark.parametrize("text", ["(x + 1", "x + 1)", "x $ y", "sqrt", "x_"])
def test_math_the_converter_cannot_read_is_refused(text):
    with pytest.raises(LatexError):
        to_latex(text)


@pytest.mark.parametrize("text, math, note", [
    ("p = softmax(s) along keys (0 for a fully masked row)", "p = softmax(s)",
     "along keys (0 for a fully masked row)"),
    ("mu = mean_C x,  var = mean_C (x - mu)^2  (biased, as PyTorch)",
     "mu = mean_C x,  var = mean_C (x - mu)^2", "(biased, as PyTorch)"),
    ("z_t = x_t W_ih + b   (B, 4H), split into gates", "z_t = x_t W_ih + b",
     "(B, 4H), split into gates"),
    ("y = softmax(x - max x)", "y = softmax(x - max x)", ""),
])
def test_the_words_beside_an_equation_are_a_note(text, math, note):
    assert split_note(text) == (math, note)


def test_a_notes_section_gives_numbered_equations_and_its_prose_in_place():
    notes = textwrap.dedent("""\
        For each step t:

        (1) s = q k^T   (2) p = softmax(s)
        gated: (3) a = silu(g) * u   (4b) out = a w
        Since (1) is linear, ...""")
    equations, prose = notes_equations(notes)
    assert [(e.number, e.math, e.label) for e in equations] == [
        ("1", "s = q k^T", ""), ("2", "p = softmax(s)", ""), ("3", "a = silu(g) * u", "gated"),
        ("4b", "out = a w", "gated")]
    assert prose == [(0, "For each step t:"), (4, "Since (1) is linear, ...")]


def test_a_range_of_tags_names_every_equation_between_its_ends():
    numbers = ["0", "1", "2", "4", "4b", "5"]
    assert annotate.tags_in("# (0)-(4) the scores", numbers) == ["0", "1", "2", "4"]
    assert annotate.tags_in("# (3), (2) pass through; (5)", numbers) == ["3", "2", "5"]


@pytest.mark.parametrize("name", MODULES)
def test_every_functional_reference_keeps_the_contract(name):
    info = annotate.load(name)
    annotate.check(info)  # raises ContractError naming file:line
    for group in info.groups:
        assert group.equations, group.title
        for equation in group.equations:
            latex = to_latex(equation.math)
            assert latex.count("{") == latex.count("}"), (group.title, equation)
        backward = [f for f in group.functions if f.backward]
        tagged = [line for f in backward for line in annotate.line_tags(info, f, group)]
        assert backward and tagged, f"{group.title}: no tagged backward line"


@pytest.mark.parametrize("name", MODULES)
def test_every_pair_has_its_check_it_yourself_cell(name):
    info = annotate.load(name)
    path = ROOT / "docs" / "site" / "checks" / f"{name}.py"
    if not any(g.forward for g in info.groups):
        assert not path.exists(), f"{path} checks no pair"
        return
    cells = annotate.check_cells(info, path.read_text(encoding="utf-8"), str(path))
    for stem, code in cells.items():
        assert "check_op(" in code and "print(" in code, stem


FAKE = '''\
"""A reference with one pair."""
import numpy as np

__all__ = ["scale_forward", "scale_backward"]


def check_input(x):
    if x.ndim == 0:
        raise ValueError("x")


def scale_forward(x, w):
    """out = x w.

    Notes
    -----
    (1) y = x * w   (2) out = y + 1
    """
    return x * w + 1, (x.copy(), w)  # (1), (2)


def scale_backward(dout, cache):
    """Returns (dx, dw)."""
    x, w = cache
    check_input(dout)
    n = dout.reshape(-1).shape[0]
    dout2 = dout.reshape(-1, 1) if n else dout
    # (2) out = y + 1  =>  dy = dout
    dy = dout
    # (1) y = x * w  =>  dx = dy w, dw = sum dy x
    dx = dy * w
    dw = (dy * x).sum()
    return dx, dw
'''


def load_fake(tmp_path, monkeypatch, source: str, name: str) -> annotate.ModuleInfo:
    package = tmp_path / f"fake_{name}"  # a package of its own: imports are cached by name
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return annotate.load(name, package=f"fake_{name}")


def test_a_reference_that_keeps_the_contract_passes(tmp_path, monkeypatch):
    """The positive control of the two below: plumbing lines (unpacking, a check, shapes,
    reshapes) before the first tag need none."""
    info = load_fake(tmp_path, monkeypatch, FAKE, "good")
    annotate.check(info)
    assert [g.title for g in info.groups] == ["scale_forward / scale_backward"]


def test_a_backward_line_without_a_tag_is_refused_naming_file_and_line(tmp_path, monkeypatch):
    source = FAKE.replace("    dw = (dy * x).sum()\n",
                          "    # the weight's gradient\n    dw = (dy * x).sum()\n").replace(
        "    # (2) out = y + 1  =>  dy = dout\n    dy = dout\n", "    dy = dout + 0\n")
    info = load_fake(tmp_path, monkeypatch, source, "untagged")
    with pytest.raises(annotate.ContractError) as raised:
        annotate.check(info)
    line = source.splitlines().index("    dy = dout + 0") + 1
    message = str(raised.value)
    assert f"untagged.py:{line}: scale_backward: backward line without an equation tag: " \
           f"`dy = dout + 0`" in message, message
    assert message.count("without an equation tag") == 1, message  # dw stands under (1)


def test_a_tag_that_names_no_equation_is_refused_naming_file_and_line(tmp_path, monkeypatch):
    source = FAKE.replace("# (1) y = x * w  =>", "# (3) y = x * w  =>")
    info = load_fake(tmp_path, monkeypatch, source, "wrongtag")
    with pytest.raises(annotate.ContractError) as raised:
        annotate.check(info)
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "# (3)" in text)
    assert f"wrongtag.py:{line}: tag (3) names no equation of scale_forward / " \
           f"scale_backward; its Notes number (1), (2)" in str(raised.value)


def test_a_check_file_that_misses_a_pair_is_refused(tmp_path, monkeypatch):
    info = load_fake(tmp_path, monkeypatch, FAKE, "cells")
    assert annotate.check_cells(info, "# %% scale\nprint(1)\n", "checks/cells.py") == {
        "scale": "print(1)\n"}
    for text in ("# %% other\nprint(1)\n", "", "# %% scale\n1\n# %% scale\n2\n"):
        with pytest.raises(annotate.ContractError, match="checks/cells.py: every pair"):
            annotate.check_cells(info, text, "checks/cells.py")

"""The numbered equations of a docstring's Notes, and their plain-text math turned into LaTeX.

The functional references write their equations in plain text and Unicode, for a reader of
the source (``(4) p = softmax(s) along keys``, ``(7) θ_t = θ_{t-1} - α m̂_t / (√v̂_t + ε)``).
The site renders the same lines as math: nothing is written twice. :func:`notes_equations`
finds the equations, :func:`split_note` separates the math from the words around it, and
:func:`to_latex` converts the math.

The plain-text conventions this understands (``docs/site/README.md`` lists them too):

* ``a_b``, ``a_{b c}``, ``a_(b)``: a subscript; ``x_hat`` is x̂; ``x_2i+1`` keeps the ``+1``.
* ``a^b``, ``a^{...}``, ``²``; ``^T`` is the transpose.
* ``sqrt(...)``, ``sqrt 2``, ``√x``: a root; ``sum_j``, ``mean_C``, ``softmax``, ``exp`` ...:
  operators; ``mu``, ``eps``, ``pi``, ``inf`` and Greek letters: symbols.
* ``p~`` is p̃, ``~mask`` is "not mask"; ``*`` and ``·`` a product, ``⊙`` elementwise,
  ``//`` integer division, ``+=``, ``←``, ``=>``.
* Two words in a row (``along keys``), a run of three spaces, or a parenthesis that holds
  words (``(biased, as PyTorch)``) start a note in words, shown beside the equation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# ``(1) ...``, ``(4b) ...``, or ``gated: (1) ...``: an equation starts a line, or follows
# another one after two or more spaces
EQUATION_START = re.compile(r"(?:^|(?<=\s{2}))(?:(?P<label>[a-z][a-z ]*):\s+)?"
                            r"\((?P<number>\d+[a-z]?)\)\s+")
SECTION = re.compile(r"^(?P<name>[A-Z][A-Za-z ]+)\n-+\n", re.MULTILINE)


@dataclass(frozen=True)
class Equation:
    """One numbered equation of a Notes section: ``(number) math   note``."""

    number: str  # "4b"
    math: str  # the plain-text math, "p~ = p * dropout"
    note: str  # the words beside it, "" if none
    label: str  # the variant it belongs to ("gated" in "gated: (1) ..."), "" if none


def sections(doc: str) -> dict[str, str]:
    """A numpydoc docstring (already dedented) cut at its section headers: ``{"": the text
    before the first header, "Notes": ..., "References": ...}``."""
    parts = SECTION.split(doc)
    out = {"": parts[0].strip("\n")}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        out[name.strip()] = body.strip("\n")
    return out


def notes_equations(notes: str) -> tuple[list[Equation], list[tuple[int, str]]]:
    """The equations of a Notes section, in order, and its other paragraphs (the prose),
    each as ``(how many equations come before it, text)``.

    A line holds equations when it starts with ``(n)`` (or ``label: (n)``); further
    equations on the same line follow after two or more spaces. Every other line is prose;
    a prose paragraph ends at a blank line or an equation line. A literal-block marker
    ``::`` that introduced the equations is dropped from the prose.
    """
    equations: list[Equation] = []
    prose: list[tuple[int, str]] = []
    paragraph: list[str] = []

    def close() -> None:
        if paragraph:
            text = " ".join(paragraph)
            prose.append((len(equations), text[:-1] if text.endswith("::") else text))
            paragraph.clear()

    for raw in notes.splitlines():
        line = raw.strip()
        starts = list(EQUATION_START.finditer(line))
        if not starts or starts[0].start() != 0:
            if line:
                paragraph.append(line)
            else:
                close()
            continue
        close()
        label = ""
        for i, start in enumerate(starts):
            end = starts[i + 1].start() if i + 1 < len(starts) else len(line)
            label = start.group("label") or label
            math, note = split_note(line[start.end():end].strip())
            equations.append(Equation(start.group("number"), math, note, label))
    close()
    return equations, prose


def split_note(text: str) -> tuple[str, str]:
    """``(math, note)``: the math of an equation's text and the words after it, if any.

    The note starts at a run of three spaces, at a closing parenthesis group that holds two
    words in a row, or at two words in a row outside brackets.
    """
    if "   " in text:
        math, note = text.split("   ", 1)
        return math.strip(), note.strip()
    depth, word_run, start = 0, 0, None
    for match in re.finditer(r"\(|\)|\[|\]|[A-Za-z][\w.]*|\S", text):
        token = match.group()
        if token in "([":
            if depth == 0 and token == "(" and _holds_words(text[match.start():]):
                return text[:match.start()].strip(), text[match.start():].strip()
            depth += 1
        elif token in ")]":
            depth -= 1
        elif depth == 0 and re.fullmatch(r"[A-Za-z]{2,}", token) \
                and token.lower() not in OPERATORS:
            word_run += 1
            if word_run == 1:
                start = match.start()
            if word_run == 2:
                return text[:start].strip(), text[start:].strip()
            continue
        word_run = 0
    return text, ""


def _holds_words(text: str) -> bool:
    """Whether the parenthesis ``text`` opens (to its match) holds two words in a row."""
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            inner = text[1:i]
            return re.search(r"\b[A-Za-z]{2,} [A-Za-z]{2,}\b", inner) is not None
    return False


# ---------------------------------------------------------------------------- to LaTeX
GREEK = {"α": "alpha", "β": "beta", "γ": "gamma", "δ": "delta", "ε": "varepsilon",
         "η": "eta", "θ": "theta", "λ": "lambda", "μ": "mu", "π": "pi", "σ": "sigma",
         "τ": "tau", "φ": "phi", "ψ": "psi", "ω": "omega", "Φ": "Phi", "Σ": "Sigma"}
SYMBOLS = {"mu": r"\mu", "sigma": r"\sigma", "theta": r"\theta", "pi": r"\pi",
           "eps": r"\varepsilon", "alpha": r"\alpha", "beta": r"\beta", "lambda": r"\lambda",
           "inf": r"\infty", "Phi": r"\Phi", "phi": r"\phi"}
# name -> LaTeX operator; sqrt is special (its argument goes under the root)
OPERATORS = {name: r"\operatorname{" + name.replace("_", r"\_") + "}" for name in (
    "softmax", "log_softmax", "mean", "silu", "sigmoid", "act", "split_heads",
    "cross_entropy", "erf", "onehot")}
OPERATORS.update({name: f"\\{name}" for name in ("exp", "log", "max", "min", "tanh", "cos",
                                                  "sin")})
OPERATORS.update({"sum": r"\sum", "sqrt": r"\sqrt"})
PUNCTUATION = {"*": r"\cdot", "·": r"\cdot", "⊙": r"\odot", "←": r"\leftarrow",
               "=>": r"\Rightarrow", "->": r"\to", "+=": r"\mathrel{+}=", "//": r"\mathbin{/\!/}",
               "<=": r"\le", ">=": r"\ge", "==": "=", "..": r"\ldots", "@": r"\,",
               "{": r"\{", "}": r"\}", "%": r"\%", "&": r"\&", "#": r"\#", "|": r"\vert "}
TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<number>\d+(?:\.\d+)?)
  | (?P<name>(?:log_softmax|split_heads|cross_entropy)\b|[A-Za-zα-ωΑ-Ω]\u0302?[A-Za-z0-9α-ωΑ-Ω]*)
  | (?P<op>=>|->|\+=|//|<=|>=|==|\.\.|[-+*/=<>,:;.@·⊙←√~^_²|!{}()\[\]%&\#])
""", re.VERBOSE)


class LatexError(ValueError):
    """A piece of plain-text math this converter cannot read (unbalanced brackets ...)."""


def to_latex(math: str) -> str:
    """The LaTeX of one equation's plain-text math (see the module docstring).

    Raises
    ------
    LatexError
        If the text has unbalanced brackets or a character the converter does not know.
    """
    tokens = _tokens(math)
    out, i = _convert(tokens, 0, closing=None)
    if i != len(tokens):
        raise LatexError(f"unbalanced {tokens[i][1]!r} in {math!r}")
    return out.strip()


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    while pos < len(text):
        match = TOKEN.match(text, pos)
        if match is None:
            raise LatexError(f"cannot read {text[pos]!r} in {text!r}")
        kind = match.lastgroup
        tokens.append((kind, match.group()))
        pos = match.end()
    return tokens


CLOSE = {"(": ")", "[": "]", "{": "}"}


def _convert(tokens: list[tuple[str, str]], i: int, closing: str | None) -> tuple[str, int]:
    """LaTeX of tokens[i:] up to the bracket ``closing`` (exclusive); returns (text, index
    after the closing bracket or the end)."""
    out: list[str] = []
    previous_atom = ""  # the atom right before (juxtaposed operands get a thin space)
    while i < len(tokens):
        kind, text = tokens[i]
        if closing is not None and text == closing:
            return "".join(out), i + 1
        if text in ")]}":
            raise LatexError(f"unbalanced {text!r}")
        if kind == "space":
            out.append(" ")
            i += 1
            continue
        atom, i = _atom(tokens, i)
        if atom is not None:
            if previous_atom and not previous_atom.endswith(" ") and out[-1] == " ":
                out[-1] = r"\, "
            out.append(atom)
            previous_atom = atom
            continue
        previous_atom = ""
        if text == "~":  # ~mask: not
            out.append(r"\lnot ")
        elif text == "√":
            root, i = _atom(tokens, i + 1)
            if root is None:
                raise LatexError("√ must stand before a symbol")
            previous_atom = rf"\sqrt{{{root}}}"
            out.append(previous_atom)
            continue
        elif text == "," and i + 1 < len(tokens) and tokens[i + 1][1].startswith("  "):
            out.append(r",\quad ")
            i += 1
        else:
            out.append(PUNCTUATION.get(text, text))
        i += 1
    if closing is not None:
        raise LatexError(f"missing {closing!r}")
    return "".join(out), i


def _atom(tokens: list[tuple[str, str]], i: int) -> tuple[str | None, int]:
    """An operand at tokens[i] with its accents, subscript and superscript: ``(latex, next
    index)``, or ``(None, i)`` when tokens[i] is an operator."""
    kind, text = tokens[i]
    if kind == "number":
        body, i = text, i + 1
    elif kind == "name":
        if text == "sqrt":
            return _root(tokens, i + 1)
        body, i = _name(text), i + 1
        if text in OPERATORS and text != "sum":
            body += " "
    elif text in "([":
        inner, i = _convert(tokens, i + 1, CLOSE[text])
        body = (r"\left(" + inner + r"\right)") if text == "(" else f"[{inner}]"
    else:
        return None, i
    while i < len(tokens):
        kind, text = tokens[i]
        if text == "~":  # p~: p tilde
            body, i = rf"\tilde{{{body}}}", i + 1
        elif text in ("_", "^"):
            script, i = _script(tokens, i + 1)
            if text == "_" and script == r"\mathrm{hat}":
                body = rf"\hat{{{body}}}"
                continue
            if text == "^" and script == "T":
                script = r"\top"
            body = f"{body.rstrip()}{text}{{{script}}} " if body.endswith(" ") \
                else f"{body}{text}{{{script}}}"
        elif text == "²":
            body, i = f"{body}^{{2}}", i + 1
        else:
            break
    return body, i


def _root(tokens: list[tuple[str, str]], i: int) -> tuple[str, int]:
    """``sqrt(...)`` or ``sqrt 2``: the argument under the root."""
    while i < len(tokens) and tokens[i][0] == "space":
        i += 1
    if i < len(tokens) and tokens[i][1] == "(":
        inner, i = _convert(tokens, i + 1, ")")
        return rf"\sqrt{{{inner}}}", i
    if i < len(tokens):
        arg, i = _atom(tokens, i)
        if arg is not None:
            return rf"\sqrt{{{arg}}}", i
    raise LatexError("sqrt must stand before a bracket or a symbol")


def _name(text: str) -> str:
    """One identifier: a symbol, an operator, a letter (with digits as its subscript) or a
    word in roman type."""
    if text in SYMBOLS:
        return SYMBOLS[text]
    if text in OPERATORS:
        return OPERATORS[text]
    hat = "\u0302" in text
    text = text.replace("\u0302", "")
    head, digits = re.fullmatch(r"(.*?)(\d*)", text).groups()
    if len(head) == 1:
        head = f"\\{GREEK[head]}" if head in GREEK else head
        head = rf"\hat{{{head}}}" if hat else head
        return f"{head}_{{{digits}}}" if digits else head
    return rf"\mathrm{{{text}}}"


def _script(tokens: list[tuple[str, str]], i: int) -> tuple[str, int]:
    """The sub- or superscript at tokens[i]: a bracketed group or one token; ``x_2i+1``
    keeps the ``+1`` that touches it."""
    if i >= len(tokens):
        raise LatexError("a subscript or superscript is missing")
    kind, text = tokens[i]
    if text in "({":
        inner, i = _convert(tokens, i + 1, CLOSE[text])
        words = re.fullmatch(r"\\mathrm\{(\w+)\}(?:\\,)? (.*)", inner)  # {counted n}
        return (rf"\text{{{words.group(1)} }}{words.group(2)}" if words else inner), i
    if kind not in ("name", "number"):
        raise LatexError(f"a subscript or superscript cannot be {text!r}")
    script, i = text, i + 1
    while i < len(tokens) and tokens[i][0] in ("name", "number"):  # 2i: a number and a name
        script, i = script + tokens[i][1], i + 1
    if i + 1 < len(tokens) and tokens[i][1] in "+-" and tokens[i + 1][0] == "number":
        script, i = script + tokens[i][1] + tokens[i + 1][1], i + 2  # x_2i+1
    if re.fullmatch(r"[A-Za-z]{2,}", script):
        return (OPERATORS.get(script) or SYMBOLS.get(script) or rf"\mathrm{{{script}}}"), i
    return "".join(f"\\{GREEK[ch]} " if ch in GREEK else ch for ch in script).strip(), i

"""The embedded training text: a frozen snapshot of this library's own code and docs.

"The library reads itself": ``assets/corpus.txt`` concatenates the package's Python source, the
Markdown documentation and the tests, each file under a ``# file: path`` header. It is frozen
by ``tools/freeze_corpus.py`` and shipped as package data, so every run trains on the same
characters even after the code moves on. Refreeze deliberately; results quoted in the docs
are tied to one snapshot (compare ``data.fingerprint`` of its encoding, or its SHA-256).
"""

from __future__ import annotations

from importlib import resources

__all__ = ["load_corpus"]


def load_corpus() -> str:
    """Return the embedded corpus as one string.

    Raises
    ------
    FileNotFoundError
        If the package was installed without its data file (freeze it with
        ``python tools/freeze_corpus.py`` from the repository root).
    """
    path = resources.files("numpy_transformer") / "assets" / "corpus.txt"
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"the embedded corpus {path} is missing; run "
                                f"'python tools/freeze_corpus.py' from the repository root "
                                f"and reinstall") from None

"""Freeze the embedded corpus: concatenate the library's own text into one file.

Usage (from anywhere)::

    python tools/freeze_corpus.py              # write numpy_transformer/assets/corpus.txt
    python tools/freeze_corpus.py --dry-run    # only report what would be written

What goes in, in this order, each path sorted and each file under a ``# file: <path>`` line:

1. every ``*.md`` in the repository (hidden and build folders skipped),
2. every ``*.py`` under ``numpy_transformer/`` except the ``data/`` folder,
3. every ``*.py`` under ``tests/``.

Line endings are normalised to ``\\n``. The script refuses to write a corpus shorter than
``--min-chars`` (default 100,000) so a half-empty snapshot is not frozen by accident.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "numpy_transformer" / "assets" / "corpus.txt"
SKIP_DIRS = {"__pycache__", "build", "dist", "node_modules"}
# The package data, and the run folders `numpy-transformer train` makes in the repository (not
# the package numpy_transformer/runs/, which is code).
SKIP_PATHS = (("numpy_transformer", "assets"), ("runs",))


def _visible(path: Path) -> bool:
    """False for files inside hidden, cache or build folders, the package data folder or the
    repository's run folders."""
    parts = path.relative_to(ROOT).parts[:-1]
    if any(p.startswith(".") or p in SKIP_DIRS or p.endswith(".egg-info") for p in parts):
        return False
    return not any(parts[:len(skip)] == skip for skip in SKIP_PATHS)


def corpus_files(root: Path = ROOT) -> list[Path]:
    """The files of the corpus, in corpus order."""
    md = sorted(p for p in root.rglob("*.md") if _visible(p))
    src = sorted(p for p in (root / "numpy_transformer").rglob("*.py") if _visible(p))
    tests = sorted(p for p in (root / "tests").rglob("*.py") if _visible(p))
    return md + src + tests


def build_corpus(files: list[Path], root: Path = ROOT) -> str:
    """Concatenate ``files`` under ``# file:`` headers, one blank line between files."""
    parts = []
    for path in files:
        data = path.read_bytes()
        if b"\x00" in data:
            raise ValueError(f"{path}: contains NUL bytes, not text")
        text = data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
        if not text.endswith("\n"):
            text += "\n"
        parts.append(f"# file: {path.relative_to(root).as_posix()}\n{text}")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="output file (default: %(default)s)")
    parser.add_argument("--min-chars", type=int, default=100_000,
                        help="refuse to write a shorter corpus (default: %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="report only, write nothing")
    args = parser.parse_args(argv)

    files = corpus_files()
    text = build_corpus(files)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    print(f"{len(files)} files, {len(text):,} characters, {len(set(text))} distinct, "
          f"sha256 {digest[:16]}")
    if len(text) < args.min_chars:
        print(f"corpus has {len(text):,} characters, fewer than --min-chars "
              f"{args.min_chars:,}: not written", file=sys.stderr)
        return 1
    if not args.dry_run:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8", newline="\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

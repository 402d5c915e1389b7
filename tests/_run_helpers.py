"""Shared by test_cli, test_checkpoint and test_resume: tiny runs that take a second."""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

from numpy_transformer import cli
from numpy_transformer.corpus import load_corpus

# Small enough that a step takes milliseconds and evaluation is instant.
TINY = ["--width", "16", "--heads", "2", "--layers", "1", "--ffn-width", "32",
        "--context", "16", "--batch", "4"]
TINY_FIELDS = dict(width=16, heads=2, layers=1, ffn_width=32, max_len=16, batch=4)


def small_text(folder: Path, chars: int = 6000) -> Path:
    """A few thousand characters of the embedded corpus in a file."""
    path = folder / "small.txt"
    if not path.exists():
        path.write_text(load_corpus()[:chars], encoding="utf-8")
    return path


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``cli.main(argv)`` in-process: ``(exit code, stdout, stderr)``; argparse's exits too."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main([str(a) for a in argv])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def resumed_to_equal_steps(short: Path, long: Path, steps: int):
    """``train --resume short --steps steps``, then its weights against ``long``'s (a run of
    that many steps from the start), bit for bit; returns both checkpoints."""
    import numpy as np

    from numpy_transformer.checkpoint import load_checkpoint

    code, _, err = run_cli(["train", "--resume", short, "--steps", str(steps), "--quiet"])
    assert code == 0, err
    mine = load_checkpoint(short / "checkpoint.npz")
    theirs = load_checkpoint(long / "checkpoint.npz")
    for name in theirs.params:
        np.testing.assert_array_equal(mine.params[name], theirs.params[name], err_msg=name)
    return mine, theirs


def one_line_error(err: str) -> bool:
    """The bad-input contract: exactly one non-empty line on stderr, no traceback."""
    lines = [line for line in err.splitlines() if line.strip()]
    return len(lines) == 1 and "Traceback" not in err and "error" in lines[0]


PYTHON = sys.executable

"""The recipe of ``docs/architecture.md`` for a new elementwise activation, followed as written.

The package, its tests and its PyTorch checks are copied to a temporary folder, and the
recipe's steps, read from the page itself (leaky ReLU), are made there as text edits of the
files they name: at most three. Then, in subprocesses on the copy: with the twin's step still
left out, the registry's test fails and names the twin (the negative control); with all the
steps, the command line offers the activation and trains with it, ``gradcheck`` checks and
passes it, a model with it trains on both backends to the same losses, and the copied tests
(its parts, the pair, the layer, the PyTorch twin) take it. The numba backend is limited to
the kernels of the feed-forward network (``NUMPY_TRANSFORMER_KERNELS``): the copy has a cold
Numba cache, and the new activation has no kernel, so the backend runs its reference.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import numpy_transformer

ROOT = Path(numpy_transformer.__file__).resolve().parents[1]
SECTION = "**A new elementwise activation"
NAME = "leaky_relu"


def recipe_steps() -> list[tuple[str, str, list[str]]]:
    """``(file, text, code blocks)`` of each numbered step of the recipe on the page."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = page[page.index(SECTION):]
    section = section[:section.index("\n**", 1)]
    steps = re.findall(r"^\d+\. `([^`]+)`:(.*?)(?=^\d+\. |\Z)", section, re.M | re.S)
    return [(path, text, [textwrap.dedent(b) for b in
                          re.findall(r"```python\n(.*?)^\s*```", text, re.M | re.S)])
            for path, text in steps]


def make_step(package: Path, path: str, text: str, blocks: list[str]) -> None:
    """A step as the recipe says it: its code appended to the file, the functions it defines
    in the file's ``__all__`` (if it has one); a step without code puts the name it quotes in
    the registry it names (`"leaky_relu"` in `ACTIVATIONS`)."""
    file = package / path
    source = file.read_text(encoding="utf-8")
    for block in blocks:
        source = source.rstrip("\n") + "\n\n\n" + block
        names = re.findall(r"^def (\w+)", block, re.M)
        source = source.replace("__all__ = [", "__all__ = [" + "".join(
            f"{n!r}, " for n in names), 1)
    if not blocks:
        name, registry = re.search(r'`"(\w+)"` in `(\w+)`', text).groups()
        source, count = re.subn(rf"^({registry} = \(.*?)\)", rf'\1, "{name}")', source,
                                count=1, flags=re.M | re.S)
        assert count == 1, f"no {registry} tuple in {path}"
    file.write_text(source, encoding="utf-8")


def run(copy: Path, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=copy,
                          env=env, timeout=1200)


TRAINS = f"""
import numpy as np
from numpy_transformer.nn import DecoderLM, TransformerConfig
from numpy_transformer.optim import Adam
from numpy_transformer.schedules import constant_lr
from numpy_transformer.train import Batch, Trainer

tokens = np.random.default_rng(0).integers(0, 7, size=(4, 7))
batch = Batch((tokens[:, :-1],), tokens[:, 1:])
for backend in ("numpy", "numba"):
    model = DecoderLM(TransformerConfig(vocab=7, width=8, heads=2, layers=1, ffn_width=12,
                                        max_len=6, activation="{NAME}", backend=backend))
    trainer = Trainer(model, Adam(), constant_lr(1e-2))
    print(backend, *[trainer.step(batch).loss for _ in range(20)])
"""


def test_a_new_activation_by_the_recipe(tmp_path):
    pytest.importorskip("torch")  # the recipe's last part is the twin (the torch extra)
    steps = recipe_steps()
    assert 1 <= len({path for path, _, _ in steps}) <= 3, steps
    copy = tmp_path / "copy"
    ignore = shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc", "fixtures")
    for folder in ("numpy_transformer", "tests", "reference_checks"):
        shutil.copytree(ROOT / folder, copy / folder, ignore=ignore)
    env = {**os.environ, "PYTHONPATH": str(copy), "COLUMNS": "200",
           "NUMPY_TRANSFORMER_KERNELS": "activations,feedforward"}
    pytest_args = ("-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                   "-k", NAME, "-rA")

    twin = [step for step in steps if step[0].startswith("torch_twins/")]
    assert len(twin) == 1, "the recipe has no step for the PyTorch twin"
    for step in steps:
        if step is not twin[0]:
            make_step(copy / "numpy_transformer", *step)
    proc = run(copy, *pytest_args, "tests/test_registry.py", env=env)
    assert proc.returncode != 0 and f"PyTorch twin {NAME}(...)" in proc.stdout, proc.stdout
    make_step(copy / "numpy_transformer", *twin[0])

    proc = run(copy, "-m", "numpy_transformer", "train", "--help", env=env)
    assert re.search(rf"--activation {{[a-z_,]*\b{NAME}\b", proc.stdout), proc.stdout
    proc = run(copy, "-m", "numpy_transformer", "train", "--backend", "numpy", "--activation",
               NAME, "--width", "16", "--heads", "2", "--layers", "1", "--ffn-width", "32",
               "--context", "16", "--batch", "4", "--steps", "3", "--quiet", "--out",
               str(tmp_path / "run"), env=env)
    assert proc.returncode == 0 and f"FFN 32 {NAME}" in proc.stdout, proc.stdout + proc.stderr

    proc = run(copy, "-m", "numpy_transformer", "gradcheck", "ops", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(rf"^{NAME}\n(  .*\n)+  -> ok$", proc.stdout, re.M), proc.stdout

    proc = run(copy, "-c", TRAINS, env=env)
    assert proc.returncode == 0, proc.stderr
    losses = {line.split()[0]: [float(v) for v in line.split()[1:]]
              for line in proc.stdout.splitlines()}
    assert losses["numpy"][-1] < 0.9 * losses["numpy"][0]
    assert losses["numba"] == pytest.approx(losses["numpy"], rel=1e-12)

    files = ("tests/test_registry.py", "tests/test_functional.py", "tests/test_nn_layers.py",
             "reference_checks/test_ops.py", "reference_checks/test_modules.py")
    proc = run(copy, *pytest_args, *files, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for file in files:  # each file took the new name
        assert re.search(rf"^PASSED {re.escape(file)}::\S*{NAME}", proc.stdout, re.M), file

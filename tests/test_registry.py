"""The registries of ``numpy_transformer.config``: every registered name has all its parts.

A choice is its name in ``config.py`` and the pieces the recipes of ``docs/architecture.md``
name; the backends, the command line, the gradient-check tables, the PyTorch twins, the
compile workers and the tests iterate over the registry. So a piece left out is never skipped
in silence: it fails here, by name. ``tests/test_recipe.py`` adds an activation by its recipe.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import numpy_transformer
from numpy_transformer import config, gradcheck_tables
from numpy_transformer import functional as F
from numpy_transformer.backend import Backend, get_backend
from numpy_transformer.gradcheck import check_direction
from numpy_transformer.kernels import _jit, _validate
from numpy_transformer.nn import DecoderLM, TransformerConfig

PACKAGE = Path(numpy_transformer.__file__).parent


@pytest.fixture(scope="module")
def rows() -> dict:
    """{title: report} of the gradient-check tables' ops and positional schemes."""
    rng = np.random.default_rng(0)
    checks = [*gradcheck_tables.op_checks(rng),
              *gradcheck_tables.positional_checks(rng.integers(0, 7, size=(2, 5)))]
    return {report.title: report for report in (check() for check in checks)}


def _twins():
    """The PyTorch twins; a skip where torch (the torch extra, which CI installs) is missing."""
    pytest.importorskip("torch")
    from numpy_transformer import torch_twins

    return torch_twins


def missing_parts_of_activation(name: str, rows: dict) -> list[str]:
    """The parts of the activation ``name`` that are missing, by name."""
    missing = [f"functional pair ({name}_forward, {name}_backward)"
               for op in (f"{name}_forward", f"{name}_backward") if op not in F.__all__][:1]
    row = rows.get(name)
    if row is None or not row.ok(1e-6):
        missing.append(f"gradcheck row {name!r} (numpy_transformer/gradcheck_tables.py)")
    try:
        _twins().ops.activation(name)
    except ValueError:
        missing.append(f"PyTorch twin {name}(...) (numpy_transformer/torch_twins/ops.py)")
    return missing


@pytest.mark.parametrize("name", config.ACTIVATIONS)
def test_an_activation_has_its_pair_its_gradcheck_row_and_its_twin(name, rows):
    assert missing_parts_of_activation(name, rows) == []


def test_the_parts_check_names_what_an_activation_lacks(rows):
    """Negative control: an activation nobody wrote lacks all three parts."""
    missing = missing_parts_of_activation("no_such_activation", rows)
    assert [part.split()[0] for part in missing] == ["functional", "gradcheck", "PyTorch"]


def test_the_gated_activations_are_activations():
    assert set(config.GATED_ACTIVATIONS) <= set(config.ACTIVATIONS)
    assert (sorted(config.ELEMENTWISE_ACTIVATIONS + config.GATED_ACTIVATIONS)
            == sorted(config.ACTIVATIONS))


@pytest.mark.parametrize("name", config.NORMS)
def test_a_norm_has_its_pair_its_gradcheck_row_and_its_twin(name, rows):
    stem = config.NORM_PAIRS[name]
    assert {f"{stem}_forward", f"{stem}_backward"} <= set(F.__all__)
    assert rows[name].ok(1e-6)
    _twins().make_norm(name, 4)


@pytest.mark.parametrize("positions", config.POSITIONS)
def test_a_positional_scheme_has_its_gradcheck_row_and_its_twin(positions, rows):
    assert rows[f"decoder-only LM (positions {positions!r}): random direction"].ok(1e-6)
    _twins().DecoderLM(tiny_config(positions=positions))


def test_the_twins_refuse_a_name_they_do_not_know():
    twins = _twins()
    for build in (lambda: twins.FeedForward(4, 6, "no_such_activation"),
                  lambda: twins.make_norm("batchnorm", 4),
                  lambda: twins.Embeddings(replace(tiny_config(), positions="spiral"))):
        with pytest.raises(ValueError, match="no PyTorch twin"):
            build()


# ------------------------------------------------------------------------- a model of each
def tiny_config(**choices) -> TransformerConfig:
    return TransformerConfig(vocab=7, width=8, heads=2, layers=1, ffn_width=12, max_len=6,
                             **choices)


CHOICES = ([("activation", a) for a in config.ACTIVATIONS]
           + [("norm", n) for n in config.NORMS]
           + [("positions", p) for p in config.POSITIONS])


@pytest.mark.parametrize("key, value", CHOICES, ids=[f"{k}={v}" for k, v in CHOICES])
def test_a_model_with_each_choice_is_right_on_every_backend(key, value):
    """One random direction by finite differences on every backend, and every backend's
    logits and gradients equal the references' (the numba backend runs the reference where a
    choice has no kernel)."""
    rng = np.random.default_rng(5)
    tokens, g = rng.integers(0, 7, size=(2, 6)), rng.normal(size=(2, 6, 7))
    results = {}
    for backend in config.BACKENDS:
        model = DecoderLM(tiny_config(**{key: value}, backend=backend))
        shift = np.random.default_rng(6)
        for _, p, _ in model.named_parameters():  # norms off their ones/zeros init
            if p.ndim == 1:
                p += 0.3 * shift.normal(size=p.shape)
        assert check_direction(model, {"tokens": tokens}).ok(1e-6), backend
        model.zero_grad()
        logits = model.forward(tokens)
        model.backward(g)
        results[backend] = logits, {n: grad.copy() for n, _, grad in model.named_parameters()}
    want_logits, want_grads = results["numpy"]
    for backend, (logits, grads) in results.items():
        np.testing.assert_allclose(logits, want_logits, rtol=1e-12, atol=1e-12, err_msg=backend)
        for n, grad in grads.items():  # floor 1e-3: a zero true gradient is rounding noise
            scale = max(np.abs(want_grads[n]).max(), 1e-3)
            assert np.abs(grad - want_grads[n]).max() <= 1e-12 * scale, (backend, n)


def test_the_command_line_offers_every_choice():
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(PACKAGE.parent)}
    proc = subprocess.run([sys.executable, "-m", "numpy_transformer", "train", "--help"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for names in (config.ACTIVATIONS, config.NORMS, config.POSITIONS, config.BACKENDS,
                  config.DTYPES):
        assert "{" + ",".join(names) + "}" in proc.stdout, names


# ------------------------------------------------------------------------- the references
def _public_submodules(package) -> list[str]:
    return [m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_")]


def test_functional_is_its_files_all_lists():
    exported = {}
    for name in _public_submodules(F):
        module = importlib.import_module(f"{F.__name__}.{name}")
        assert hasattr(module, "__all__"), f"functional/{name}.py has no __all__"
        for op in module.__all__:
            assert getattr(module, op).__module__ == module.__name__, op  # defined there
            assert op not in exported, f"{op} in functional/{name}.py and {exported[op]}.py"
            exported[op] = name
    assert sorted(exported) == F.__all__
    assert all(getattr(F, op) is getattr(get_backend("numpy"), op) for op in exported)
    assert not set(exported) & set(dir(Backend)) - {"__doc__"}  # no op hides an attribute


# ------------------------------------------------------------------------- the kernels
def test_the_kernel_modules_are_the_files_with_operations():
    from numpy_transformer import kernels

    with_ops = [name for name in _public_submodules(kernels)
                if hasattr(importlib.import_module(f"{kernels.__name__}.{name}"), "__all__")]
    assert sorted(with_ops) == sorted(config.KERNEL_MODULES)
    for name in config.KERNEL_MODULES:  # each kernel under its reference's name
        ops = importlib.import_module(f"{kernels.__name__}.{name}").__all__
        assert set(ops) <= set(F.__all__), (name, set(ops) - set(F.__all__))


def test_every_other_kernel_file_stamps_the_kernels_cache():
    files = {p.name for p in (PACKAGE / "kernels").glob("*.py")}
    kernel_files = {f"{name}.py" for name in config.KERNEL_MODULES}
    assert set(_jit.SHARED_SOURCES) == files - kernel_files
    assert {"_jit.py", "blas.py", "special.py"} <= set(_jit.SHARED_SOURCES)


def test_every_dtype_runs_on_the_kernels_and_the_twins():
    assert {np.dtype(d) for d in config.DTYPES} <= set(_validate.KERNEL_DTYPES)
    ops = pytest.importorskip("numpy_transformer.torch_twins.ops", exc_type=ImportError)
    assert set(ops.TORCH_DTYPES) == {np.dtype(d) for d in config.DTYPES}

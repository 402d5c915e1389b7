"""The benchmark's bookkeeping (``numpy_transformer.bench.train_step``): which workers a run
starts, the model each configuration builds and its FLOP count. The timing itself is in
``benchmarks/``, never in a test; ``test_cli.py`` runs ``bench --quick`` end to end."""

from __future__ import annotations

import pytest

from numpy_transformer.bench import train_step
from numpy_transformer.config import BENCH_CONFIGS
from numpy_transformer.nn import LSTMLM, DecoderLM


def test_the_command_line_offers_every_configuration():
    assert tuple(train_step.CONFIGS) == BENCH_CONFIGS


@pytest.mark.parametrize("attention", [True, False])
def test_variants_compare_with_the_right_pytorch(attention):
    kinds = {v[1] for v in train_step.variants_for([1, 2], numpy=False, attention=attention)}
    assert "torch" in kinds and "numba" in kinds  # the twin always: the LSTM's only reference
    assert ("torch-sdpa" in kinds) == attention  # fused attention only where there is some
    without = {v[1] for v in train_step.variants_for([2], numpy=True, torch=False)}
    assert without == {"numba", "numpy"}


@pytest.mark.parametrize("name", BENCH_CONFIGS)
def test_each_configuration_builds_its_model(name):
    config = train_step.CONFIGS[name]
    model = train_step._model(config, backend="numpy")
    assert isinstance(model, LSTMLM if train_step.model_kind(config) == "lstm" else DecoderLM)
    assert model.config.dtype == "float32"


def test_step_flops_count_the_products():
    """Three times the forward's 2 x tokens x weights (plus the attention scores)."""
    lstm = train_step.CONFIGS["lstm"]
    m = lstm["model"]
    weights = 4 * m["hidden"] * (m["embed"] + m["hidden"]) + m["hidden"] * m["vocab"]
    assert train_step.step_flops(lstm) == 3 * 2 * 64 * 100 * weights
    chapter = train_step.CONFIGS["chapter"]
    c = chapter["model"]
    linear = c["layers"] * (4 * c["width"] ** 2 + 2 * c["width"] * c["ffn_width"]) \
        + c["width"] * c["vocab"]
    scores = c["layers"] * 2 * 64 * 100 * 100 * c["width"]
    assert train_step.step_flops(chapter) == 3 * (2 * 64 * 100 * linear + scores)

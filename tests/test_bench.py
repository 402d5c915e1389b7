"""The benchmark's bookkeeping (``numpy_transformer.bench.train_step``, ``.real_machine``):
which workers a run starts, the model each configuration builds and its FLOP count, the
competing processes and the busy machine's warning. The timing itself is in ``benchmarks/``,
never in a test; ``test_cli.py`` runs ``bench --quick`` end to end."""

from __future__ import annotations

import pytest

from numpy_transformer.bench import configs, real_machine, train_step
from numpy_transformer.config import BENCH_CONFIGS
from numpy_transformer.nn import LSTMLM, DecoderLM


def test_the_command_line_offers_every_configuration():
    assert tuple(configs.CONFIGS) == BENCH_CONFIGS


@pytest.mark.parametrize("attention", [True, False])
def test_variants_compare_with_the_right_pytorch(attention):
    kinds = {v[1] for v in train_step.variants_for([1, 2], numpy=False, attention=attention)}
    assert "torch" in kinds and "numba" in kinds  # the twin always: the LSTM's only reference
    assert ("torch-sdpa" in kinds) == attention  # fused attention only where there is some
    without = {v[1] for v in train_step.variants_for([2], numpy=True, torch=False)}
    assert without == {"numba", "numpy"}


@pytest.mark.parametrize("name", BENCH_CONFIGS)
def test_each_configuration_builds_its_model(name):
    config = configs.CONFIGS[name]
    model = train_step._model(config, backend="numpy")
    assert isinstance(model, LSTMLM if configs.model_kind(config) == "lstm" else DecoderLM)
    assert model.config.dtype == "float32"


def test_step_flops_of_the_lstm_count_its_products():
    """Three times the forward's 2 x tokens x weights."""
    lstm = configs.CONFIGS["lstm"]
    m = lstm["model"]
    weights = 4 * m["hidden"] * (m["embed"] + m["hidden"]) + m["hidden"] * m["vocab"]
    assert configs.step_flops(lstm) == 3 * 2 * 64 * 100 * weights


@pytest.mark.parametrize("name", [n for n in BENCH_CONFIGS if n != "lstm"])
def test_step_flops_count_the_products(name):
    """Three times the forward's 2 x tokens x weights, plus the visible half of the causal
    scores and of p v: the sum over the products' shapes is the textbook count."""
    config = configs.CONFIGS[name]
    c, n, t = config["model"], config["batch"] * config["context"], config["context"]
    linear = c["layers"] * (4 * c["width"] ** 2 + 2 * c["width"] * c["ffn_width"]) \
        + c["width"] * c["vocab"]
    scores = c["layers"] * 2 * n * t * c["width"]
    assert configs.step_flops(config) == 3 * (2 * n * linear + scores)


def test_the_gpt2_configuration_has_gpt2_smalls_parameters():
    """124.5 M with the head tied (GPT-2 small's 124.4 M, its vocabulary padded to 50,304)."""
    model = train_step._model(configs.CONFIGS["gpt2"], backend="numpy")
    count = sum(p.size for _, p, _ in model.named_parameters())
    assert 124.0e6 < count < 124.6e6, count


def test_the_summary_prints_the_fraction_of_the_products_rate(capsys):
    """The effective GFLOP/s over the products' rate, for ours and for PyTorch."""
    from types import SimpleNamespace

    from numpy_transformer.bench import summary

    cfg = configs.CONFIGS["chapter"]
    step = configs.step_flops(cfg) / 50e9  # a step at 50 GFLOP/s
    ours = SimpleNamespace(times=[step], rss_mib=100.0, first_loss=4.8, first_step=1.0)
    theirs = SimpleNamespace(times=[2 * step], rss_mib=200.0, first_loss=4.8, first_step=1.0)
    summary.print_summary(cfg, ours, theirs, {"cold": 9.0, "warm": 1.0}, (200.0, 250.0), 2)
    out = capsys.readouterr().out
    assert "| fraction of the products' rate (200 GFLOP/s) | 0.25 | 0.12 |" in out
    assert "| effective GFLOP/s | 50.0 | 25.0 |" in out


def test_a_timed_process_sets_its_threads_after_the_backend_and_keeps_freed_memory(
        monkeypatch):
    """The numba backend's threads set up first (its hook), then the count asked for."""
    import numba

    from numpy_transformer import allocator, backend

    kept, built = [], []
    monkeypatch.setattr(allocator, "reuse_freed_memory", lambda: kept.append(True))
    monkeypatch.setattr(backend, "get_backend", lambda name: built.append(
        (name, numba.get_num_threads())))
    threads = numba.get_num_threads()
    try:
        train_step.steady_state(1)
        assert built == [("numba", threads)] and numba.get_num_threads() == 1
        assert kept == [True]  # freed memory kept, as the command line keeps it
    finally:
        numba.set_num_threads(threads)


def test_competing_processes_run_for_the_block_only():
    with real_machine.competing(2) as loops:
        assert len(loops) == 2 and all(loop.poll() is None for loop in loops)
    assert all(loop.returncode is not None for loop in loops)  # ended and waited for
    with real_machine.competing(0) as loops:
        assert loops == []


def test_a_busy_machine_is_warned_about_in_one_line():
    import os

    used = real_machine.cores_in_use(0.2)
    assert 0.0 <= used <= (os.cpu_count() or 1) + 1e-9
    assert real_machine.busy_line(0.0) is None
    line = real_machine.busy_line(1.5)
    assert "\n" not in line and "busy" in line and "not comparable" in line


def test_products_variants_time_numpys_and_torchs_products():
    kinds = {v[1] for v in train_step.variants_for([2], numpy=False, products=True)}
    assert {"numpy-products", "torch-products"} <= kinds
    kinds = {v[1] for v in train_step.variants_for([2], numpy=False, torch=False, products=True)}
    assert kinds == {"numba", "numpy-products"}


@pytest.mark.parametrize("name", ["chapter", "lstm"])
def test_linear_operands_are_the_linear_maps_products(name):
    """One pair per product of a linear map, each on arrays of its own, of the shapes and the
    FLOPs that configs.products counts for them (attention's left out)."""
    from numpy_transformer.bench.sgemm import linear_operands

    config = configs.CONFIGS[name]
    pairs = linear_operands(config)
    linear = [p for p in configs.products(config) if p.batch == 1]
    assert len(pairs) == sum(p.count for p in linear)
    assert len({id(a) for a, _ in pairs} | {id(b) for _, b in pairs}) == 2 * len(pairs)
    assert sum(2 * a.shape[0] * a.shape[1] * b.shape[1] for a, b in pairs) == \
        sum(p.flops for p in linear)
    assert all(a.shape[1] == b.shape[0] and a.dtype == b.dtype == "float32" for a, b in pairs)
    if name == "chapter":
        assert configs.step_flops(config) > sum(p.flops for p in linear)  # attention's rest

"""The training loop: one step does what it says, stops on non-finite values, is repeatable."""

import io
import sys

import numpy as np
import pytest

from numpy_transformer.data import window_schedule
from numpy_transformer.nn import DecoderLM, TransformerConfig
from numpy_transformer.optim import Adam
from numpy_transformer.schedules import constant_lr
from numpy_transformer.train import Batch, NonFiniteError, Trainer, lm_batches


def tiny_lm(**kw):
    cfg = dict(vocab=11, width=16, heads=2, layers=1, ffn_width=32, max_len=12, seed=3)
    return DecoderLM(TransformerConfig(**{**cfg, **kw}))


def corpus(n=400, seed=0):
    """A learnable sequence: counting mod 11 with occasional noise."""
    rng = np.random.default_rng(seed)
    ids = np.arange(n) % 11
    flip = rng.random(n) < 0.05
    ids[flip] = rng.integers(0, 11, flip.sum())
    return ids


def test_loss_falls_on_a_learnable_sequence():
    ids = corpus()
    schedule = window_schedule(len(ids), 10, 16, 60, np.random.default_rng(0))
    trainer = Trainer(tiny_lm(), Adam(lr=1e-2), constant_lr(1e-2), clip=1.0)
    log = trainer.fit(lm_batches(ids, schedule, 10), total=60, progress=False)
    assert len(log) == 60 and trainer.step_count == 60
    assert np.mean([r.loss for r in log[-10:]]) < 0.5 * np.mean([r.loss for r in log[:5]])


def test_identical_schedule_and_init_give_identical_runs():
    ids = corpus()
    schedule = window_schedule(len(ids), 10, 8, 15, np.random.default_rng(1))
    runs = []
    for _ in range(2):
        model = tiny_lm()
        trainer = Trainer(model, Adam(lr=3e-3), constant_lr(3e-3), clip=1.0)
        log = trainer.fit(lm_batches(ids, schedule, 10), total=15, progress=False)
        runs.append(([r.loss for r in log], model.state_dict()))
    assert runs[0][0] == runs[1][0]
    for name, value in runs[0][1].items():
        np.testing.assert_array_equal(value, runs[1][1][name])


def test_step_records_the_norm_before_clipping_and_clips_globally():
    ids = corpus()
    x, y = ids[:40].reshape(4, 10), ids[1:41].reshape(4, 10)
    model = tiny_lm()
    trainer = Trainer(model, Adam(lr=1e-3), constant_lr(1e-3), clip=1e-3)
    record = trainer.step(Batch((x,), y))
    # recompute the unclipped global norm on a fresh copy of the same model
    fresh = tiny_lm()
    Trainer(fresh, Adam(lr=1e-3), constant_lr(1e-3)).loss_and_grads(Batch((x,), y))
    norm = np.sqrt(sum((g.astype(np.float64) ** 2).sum() for _, _, g in fresh.named_parameters()))
    assert record.grad_norm == pytest.approx(norm, rel=1e-10)
    clipped = np.sqrt(sum((g ** 2).sum() for _, _, g in model.named_parameters()))
    assert clipped == pytest.approx(1e-3, rel=1e-3)


def test_tensor_stats_every_n_steps():
    ids = corpus()
    schedule = window_schedule(len(ids), 10, 4, 6, np.random.default_rng(2))
    trainer = Trainer(tiny_lm(), Adam(lr=1e-3), constant_lr(1e-3), stats_every=3)
    trainer.fit(lm_batches(ids, schedule, 10), total=6, progress=False)
    assert [s["step"] for s in trainer.tensor_stats] == [3, 6]
    stats = trainer.tensor_stats[0]["head.w"]
    assert stats["grad_norm"] > 0 and 0 < stats["update_ratio"] < 0.1


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the inf weight is the point of the test
def test_non_finite_gradient_stops_and_names_the_tensor():
    ids = corpus()
    x, y = ids[:40].reshape(4, 10), ids[1:41].reshape(4, 10)
    model = tiny_lm()
    before = model.state_dict()
    model.decoder.blocks[0].ffn.up.params["w"][0, 0] = np.inf
    trainer = Trainer(model, Adam(lr=1e-3), constant_lr(1e-3))
    with pytest.raises(NonFiniteError, match="step 1"):
        trainer.step(Batch((x,), y))
    assert trainer.step_count == 0
    for name, value in model.state_dict().items():  # nothing else was updated
        if name != "decoder.blocks.0.ffn.up.w":
            np.testing.assert_array_equal(value, before[name])


def test_non_finite_gradient_names_the_first_tensor():
    ids = corpus()
    x, y = ids[:40].reshape(4, 10), ids[1:41].reshape(4, 10)
    model = tiny_lm()
    trainer = Trainer(model, Adam(lr=1e-3), constant_lr(1e-3))
    original = trainer.loss_and_grads

    def poisoned(batch):
        loss = original(batch)
        model.head.grads["b"][0] = np.nan
        return loss

    trainer.loss_and_grads = poisoned
    with pytest.raises(NonFiniteError, match="head.b"):
        trainer.step(Batch((x,), y))


def test_named_access_to_activations_and_gradients_after_a_step():
    ids = corpus()
    x, y = ids[:40].reshape(4, 10), ids[1:41].reshape(4, 10)
    model = tiny_lm()
    Trainer(model, Adam(lr=1e-3), constant_lr(1e-3)).step(Batch((x,), y))
    names = dict(model.named_modules())
    assert "decoder.blocks.0.attn" in names and names[""] is model
    attn = model.submodule("decoder.blocks.0.attn")
    assert attn is names["decoder.blocks.0.attn"]
    assert attn.cache.sdpa is not None and np.abs(attn.grads["wq"]).sum() > 0
    norm = model.submodule("decoder.final_norm")
    assert norm.cache.x_hat.shape == (4, 10, 16)
    with pytest.raises(ValueError, match="'block'"):
        model.submodule("decoder.block.0")


def test_tensor_stats_plot(tmp_path):
    from numpy_transformer.plots import tensor_groups, tensor_stats_figure, tensor_stats_plot

    ids = corpus()
    schedule = window_schedule(len(ids), 10, 4, 4, np.random.default_rng(2))
    trainer = Trainer(tiny_lm(), Adam(lr=1e-3), constant_lr(1e-3), stats_every=2)
    trainer.fit(lm_batches(ids, schedule, 10), total=4, progress=False)
    tensor_stats_plot(trainer.tensor_stats, tmp_path / "stats.png")
    assert (tmp_path / "stats.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = tensor_stats_figure(trainer.tensor_stats)  # what a notebook displays
    names = [name for name, _, _ in trainer.model.named_parameters()]
    groups = tensor_groups(names)  # by layer: each block, and the rest
    assert list(groups) == ["", "decoder.blocks.0"] and sum(map(len, groups.values())) == \
        len(names)
    assert len(fig.axes) == 2 * len(groups)
    assert [len(ax.lines) for ax in fig.axes[::2]] == [len(g) for g in groups.values()]
    legend = [t.get_text() for t in fig.axes[3].get_legend().get_texts()]
    assert legend == [n.removeprefix("decoder.blocks.0.") for n in groups["decoder.blocks.0"]]
    with pytest.raises(ValueError, match="stats_every"):
        tensor_stats_plot([], tmp_path / "empty.png")


def test_set_blas_threads():
    from numpy_transformer.threads import _loaded_openblas, set_blas_threads

    found = _loaded_openblas()  # NumPy's wheels ship OpenBLAS; other builds may have none
    assert (set_blas_threads(1) >= 1) == bool(found)
    with pytest.raises(ValueError, match="0"):
        set_blas_threads(0)


def test_progress_bar_writes_to_stderr_when_not_a_terminal(capsys):
    from numpy_transformer.train import ProgressBar, StepRecord

    bar = ProgressBar(total=2)  # the stream is looked up now: pytest's captured stderr
    bar.update(StepRecord(1, 2.5, 1e-3, 0.7, 1000.0))
    bar.update(StepRecord(2, 2.25, 1e-3, 0.6, 1000.0))
    bar.close()
    err = capsys.readouterr().err
    assert "step 2/2" in err and "loss 2.2500" in err and "tok/s" in err and "s left" in err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("installed", [True, False])
def test_on_a_terminal_the_bar_is_tqdm_where_installed(installed, monkeypatch):
    """A resumed run of 10 steps, from step 3: tqdm's bar (its "step" unit and the count from
    the run's step) with the numbers after it; without tqdm, the plain bar redrawn in place."""
    from numpy_transformer.train import ProgressBar, StepRecord

    if installed:
        pytest.importorskip("tqdm")
    else:
        monkeypatch.setitem(sys.modules, "tqdm", None)  # import fails as if not installed
    stream = _Terminal()
    bar = ProgressBar(total=10, stream=stream, clip=1.0)
    for step in (4, 5):
        bar.update(StepRecord(step, 2.0, 1e-3, 1.5, 1000.0))
    bar.close()
    out = stream.getvalue()
    assert "loss 2.0000" in out and "|g| 1.500* (2 clipped)" in out
    if installed:
        assert "5/10" in out and "step/s" in out and "[#" not in out
    else:
        assert "\r[" in out and "step 5/10" in out and "s left" in out


def test_progress_bar_marks_the_clipped_steps_and_counts_them(capsys):
    from numpy_transformer.train import ProgressBar, StepRecord

    bar = ProgressBar(total=4, clip=1.0)
    for step, norm in enumerate((1.5, 0.5, 2.0, 0.9), 1):
        bar.update(StepRecord(step, 2.0, 1e-3, norm, 1000.0 * step))
    lines = capsys.readouterr().err.splitlines()
    assert "|g| 1.500* (1 clipped)" in lines[0] and "|g| 0.500  (1 clipped)" in lines[1]
    assert "|g| 0.900  (2 clipped)" in lines[-1]
    assert "1,100 tok/s" in lines[1]  # smoothed: 0.9 * 1000 + 0.1 * 2000



class _LogitsOnly:
    """A model with forward and backward but no ``loss_and_backward``: a user's own."""

    def __init__(self, model):
        self.model, self.config = model, model.config

    def forward(self, tokens):
        return self.model.forward(tokens)

    def backward(self, dlogits):
        self.model.backward(dlogits)

    def zero_grad(self):
        self.model.zero_grad()

    def named_parameters(self):
        return self.model.named_parameters()


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_a_model_without_loss_and_backward_trains_alike(backend):
    """The trainer's two paths, the library models' fused ``loss_and_backward`` and forward,
    loss, backward for any other model, give the same losses and weights (to rounding)."""
    ids = corpus()
    x, y = ids[:40].reshape(4, 10), ids[1:41].reshape(4, 10)
    models = [tiny_lm(backend=backend) for _ in range(2)]
    runs = []
    for model in (models[0], _LogitsOnly(models[1])):
        trainer = Trainer(model, Adam(lr=1e-2, backend=backend), constant_lr(1e-2), clip=1.0)
        runs.append([trainer.step(Batch((x,), y)).loss for _ in range(3)])
    np.testing.assert_allclose(runs[0], runs[1], rtol=1e-12)
    for (name, p, _), (_, q, _) in zip(models[0].named_parameters(),
                                       models[1].named_parameters(), strict=True):
        np.testing.assert_allclose(p, q, rtol=1e-10, atol=1e-12, err_msg=name)

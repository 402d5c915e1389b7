"""``train --resume RUN --steps N``: a run, finished or not, extended to N steps ends bit for
bit as the run configured with N steps from the start, in its weights, Adam's state, random
generators, log, held-out evaluations, ``best.npz`` and early stop (issue 43).

The property draws ``--eval-every``, ``--early-stop`` and ``--stats-every``, the two lengths
and, besides the real held-out losses, scripted ones (``Run.evaluate`` replaced by a drawn
curve, ties included), so that every way a best and an early stop can fall is met: a best
at the old last step, one the final evaluation found between two evaluations, a stop just
after the extension begins. Its negative controls drop the evaluation the longer run makes at
the old last step, or leave out the best the final evaluation replaced, and are caught.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import numpy as np
import pytest
from _run_helpers import TINY, one_line_error, run_cli, small_text
from hypothesis import HealthCheck, currently_in_test_context, event, given, settings
from hypothesis import strategies as st

from numpy_transformer.checkpoint import load_checkpoint
from numpy_transformer.runs import loop, report
from numpy_transformer.runs.folder import read_log
from numpy_transformer.runs.outputs import BEST, BEST_BEFORE_FINAL, CHECKPOINT
from numpy_transformer.runs.state import Run

TRAIN = [*TINY, "--backend", "numpy", "--quiet"]
UNTIMED = ("time", "tokens_per_s")  # a log's only entries that differ between equal runs


def _train(folder, text, *extra):
    code, _, err = run_cli(["train", "--text", text, *TINY, "--eval-every", "0",
                            "--out", folder, "--quiet", *extra])
    assert code == 0, err


def _losses(folder) -> list[float]:
    return [r["loss"] for r in read_log(folder / "log.jsonl") if "loss" in r]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A finished run of 3 steps, and one configured with 7 from the start."""
    tmp = tmp_path_factory.mktemp("extend")
    text = small_text(tmp)
    _train(tmp / "short", text, "--steps", "3", "--warmup", "2", "--dropout", "0.1")
    _train(tmp / "long", text, "--steps", "7", "--warmup", "2", "--dropout", "0.1")
    return tmp, text


@pytest.mark.parametrize("how", ["finished", "twice"])
def test_an_extended_run_is_the_run_configured_that_long(runs, how, tmp_path):
    tmp, _ = runs
    run = tmp_path / "run"
    shutil.copytree(tmp / "short", run)
    for steps in (["5", "7"] if how == "twice" else ["7"]):
        code, out, err = run_cli(["train", "--resume", run, "--steps", steps, "--quiet"])
        assert code == 0 and f"to {steps} steps" in out + err, err
    assert not differences(recorded(run), recorded(tmp / "long"))
    assert _losses(run) == _losses(tmp / "long")
    # negative control: the short run is not the long one
    short = load_checkpoint(tmp / "short" / "checkpoint.npz")
    theirs = load_checkpoint(tmp / "long" / "checkpoint.npz")
    assert any(not np.array_equal(short.params[n], theirs.params[n]) for n in theirs.params)


def test_extending_is_refused_where_it_cannot_be_exact(runs, tmp_path):
    tmp, text = runs
    _train(tmp_path / "cos", text, "--steps", "3", "--schedule", "cosine", "--warmup", "1")
    code, _, err = run_cli(["train", "--resume", tmp_path / "cos", "--steps", "6", "--quiet"])
    assert code == 2 and one_line_error(err) and "cosine" in err, err
    code, _, err = run_cli(["train", "--resume", tmp / "long", "--steps", "2", "--quiet"])
    assert code == 2 and one_line_error(err) and "made 7 steps" in err, err
    code, _, err = run_cli(["train", "--resume", tmp / "long", "--lr", "0.1", "--quiet"])
    assert code == 2 and one_line_error(err) and "drop --lr" in err, err


# ------------------------------------------------------------------ what equal runs share
def _checkpoint(path: Path) -> dict | None:
    """Everything a checkpoint holds but its format version, arrays as bytes with dtype and
    shape (so float -0.0 and 0.0, or a NaN, compare as the bits they are)."""
    if not path.exists():
        return None
    ckpt = load_checkpoint(path)
    arrays = {f"{group}.{name}": (a.dtype.str, a.shape, a.tobytes())
              for group in ("params", "adam_m", "adam_v")
              for name, a in getattr(ckpt, group).items()}
    return {"step": ckpt.step, "arrays": arrays, **{k: getattr(ckpt, k) for k in (
        "optimizer", "rng", "config", "options", "tokenizer", "meta")}}


def recorded(folder: Path) -> dict:
    """What two equal runs have equal: their checkpoint, best.npz, the best kept for an
    extension, and every line of the log but its clock times."""
    log = [{k: v for k, v in r.items() if k not in UNTIMED} for r in read_log(folder)]
    return {name: _checkpoint(folder / name) for name in (CHECKPOINT, BEST, BEST_BEFORE_FINAL)
            } | {"log": log}


def differences(mine: dict, theirs: dict) -> list[str]:
    """What differs between two :func:`recorded` runs, named entry by entry."""
    found = []
    for name in theirs:
        a, b = mine[name], theirs[name]
        if isinstance(b, dict) and isinstance(a, dict):
            found += [f"{name}: {key}" for key in sorted(set(a) | set(b))
                      if a.get(key) != b.get(key)]
        elif a != b:
            found.append(f"{name}: {a if name == 'log' else 'missing' if a is None else a}"[:2000])
    return found


# ------------------------------------------------------------------------------ the property
@contextlib.contextmanager
def scripted(curve: list[float] | None):
    """Within: every held-out evaluation after step k says ``curve[k]`` (None: the real
    ones). The training itself stays real."""
    if curve is None:
        yield
        return
    real = Run.evaluate
    Run.evaluate = lambda run: {"val_loss": curve[run.trainer.step_count]}
    try:
        yield
    finally:
        Run.evaluate = real


def extended_and_reference(root: Path, text: Path, options: list[str], lengths: list[int],
                           curve: list[float] | None = None) -> tuple[dict, dict]:
    """The run of ``lengths[0]`` steps extended to each of the others in turn, and the run of
    the last from the start: both :func:`recorded`."""
    with scripted(curve):
        for name, steps in (("reference", lengths[-1]), ("extended", lengths[0])):
            code, _, err = run_cli(["train", "--text", text, *TRAIN, *options, "--steps", steps,
                                    "--out", root / name])
            assert code == 0, err
        for steps in lengths[1:]:
            if (root / "extended" / BEST_BEFORE_FINAL).exists():
                _note("a best the final evaluation replaced is put back")
            code, out, err = run_cli(["train", "--resume", root / "extended", "--steps", steps,
                                      "--quiet"])
            assert code == 0 and f"to {steps} steps" in out, err
            if "stopped early at step" in out:
                _note("a run that stopped early is extended")
    return recorded(root / "extended"), recorded(root / "reference")


def _note(what: str) -> None:
    """Count ``what`` among the property's examples (pytest --hypothesis-show-statistics)."""
    if currently_in_test_context():
        event(what)


@st.composite
def extensions(draw):
    """``(options, lengths, curve)``: the options of a run, the lengths it is extended
    through, and a scripted held-out curve (None: the real one)."""
    every = draw(st.integers(0, 4))
    options = ["--eval-every", every, "--early-stop", draw(st.integers(0, 3)),
               "--stats-every", draw(st.integers(0, 3)),
               "--lr", draw(st.sampled_from(["0.002", "0.3"]))]
    first = draw(st.integers(1, 9))
    more = draw(st.lists(st.integers(1, 6), min_size=1, max_size=2))
    lengths = [first] + [first + sum(more[:i + 1]) for i in range(len(more))]
    curve = draw(st.none() | st.lists(st.sampled_from([1.0, 2.0, 3.0, 2.5]),
                                      min_size=lengths[-1] + 1, max_size=lengths[-1] + 1))
    return [str(o) for o in options], [str(n) for n in lengths], curve


@pytest.mark.slow
@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=extensions())
def test_any_extension_is_the_longer_run(case, tmp_path_factory):
    options, lengths, curve = case
    root = tmp_path_factory.mktemp("case")
    mine, theirs = extended_and_reference(root, small_text(root), options, lengths, curve)
    assert not differences(mine, theirs), (options, lengths, curve, differences(mine, theirs))
    if "early_stopped" in theirs[CHECKPOINT]["meta"]:  # --hypothesis-show-statistics
        event("the longer run stops early")


# --------------------------------------------------- the cases of issue 43, and the controls
def test_the_evaluation_at_the_old_last_step_is_made(tmp_path, monkeypatch):
    """A run of 4 steps evaluating every 2, extended to 8: the evaluation at step 4 is in its
    log as in the run of 8 ([2, 4, 6] and the final 8). Negative control: an extension that
    drops it differs from the longer run, in the log and the early stop's count."""
    text = small_text(tmp_path)
    options = ["--eval-every", "2"]
    mine, theirs = extended_and_reference(tmp_path / "good", text, options, [4, 8])
    assert not differences(mine, theirs)
    assert [r["step"] for r in theirs["log"] if "val_loss" in r] == [2, 4, 6, 8]

    class NeverMadeAgain(report.BestCheckpoint):  # the extension of main before issue 43
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.evaluated = range(10**9)  # as if every step had been evaluated already

    monkeypatch.setattr(loop, "BestCheckpoint", NeverMadeAgain)
    mine, theirs = extended_and_reference(tmp_path / "broken", text, options, [4, 8])
    assert "log" in " ".join(differences(mine, theirs))


# the held-out loss after each step: the best of the loop's evaluations (every 2) is step 2;
# the final evaluation of a run of 3 steps finds a lower one, which the run of 8 never makes
BETWEEN = [9.0, 9.0, 2.0, 1.0, 5.0, 5.0, 5.0, 5.0, 5.0]


def test_the_best_a_final_evaluation_replaced_comes_back(tmp_path, monkeypatch):
    text = small_text(tmp_path)
    options = ["--eval-every", "2"]
    mine, theirs = extended_and_reference(tmp_path / "good", text, options, [3, 8], BETWEEN)
    assert not differences(mine, theirs)
    assert theirs[BEST]["step"] == 2 and theirs[BEST]["meta"]["val_loss"] == 2.0
    # negative control: without putting it back, best.npz holds the short run's step 3
    monkeypatch.setattr(report.BestCheckpoint, "reopen", lambda self: None)
    mine, theirs = extended_and_reference(tmp_path / "broken", text, options, [3, 8], BETWEEN)
    assert f"{BEST}: step" in differences(mine, theirs)


# the run of 20 steps evaluating every step with --early-stop 2: best at step 3, stopped at 5
STOPPING = [9.0, 4.0, 3.0, 1.0, 2.0, 2.0] + [0.5] * 15


@pytest.mark.parametrize("first", [3, 4, 6])
def test_an_early_stop_falls_where_the_longer_runs_does(first, tmp_path):
    """Extended from before its best (3), between its best and its stop (4) and from a run
    that stopped early itself (6 steps, stopped at 5): the run stops at step 5, best.npz holds
    step 3, as the run of 20 steps."""
    options = ["--eval-every", "1", "--early-stop", "2"]
    mine, theirs = extended_and_reference(tmp_path, small_text(tmp_path), options,
                                          [first, 20], STOPPING)
    assert not differences(mine, theirs)
    assert theirs[CHECKPOINT]["meta"]["early_stopped"] == 5 and theirs[BEST]["step"] == 3
    # an early-stopped run cannot be cut to where it stopped: the run of 5 steps would not
    # have evaluated (and stopped) after step 5
    code, _, err = run_cli(["train", "--resume", tmp_path / "extended", "--steps", "5",
                            "--quiet"])
    assert code == 2 and one_line_error(err) and "made 5 steps already" in err, err


def test_the_comparison_sees_every_part_of_a_run():
    """Negative control of :func:`differences`: a run differing in one array, one generator,
    the early stop or one log line is told apart from itself."""
    base = {CHECKPOINT: {"step": 1, "arrays": {"params.w": ("<f4", (1,), b"\0\0\0\0")},
                         "rng": {"sample": 1}, "meta": {}}, BEST: None, BEST_BEFORE_FINAL: None,
            "log": [{"step": 1, "loss": 1.0}]}
    assert not differences(base, base)
    for change in ({"arrays": {"params.w": ("<f4", (1,), b"\0\0\0\x80")}}, {"rng": {}},
                   {"meta": {"early_stopped": 1}}):
        assert differences({**base, CHECKPOINT: {**base[CHECKPOINT], **change}}, base)
    assert differences({**base, "log": base["log"][:0]}, base)

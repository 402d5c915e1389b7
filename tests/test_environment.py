"""The environment variables are input too: a bad value is one line and exit 2 from every
command, checked once before the command runs (``runs/environment.py``)."""

from __future__ import annotations

import argparse
import importlib

import numpy as np
import pytest
from _aliasing_helpers import upstream
from _run_helpers import one_line_error, run_cli
from test_aliasing import PAIR_CASES, _feed_forward

from numpy_transformer import cli
from numpy_transformer.backend import NEEDS_ITS_PARTNER, get_backend, kernel_selection
from numpy_transformer.config import ACTIVATIONS, KERNEL_MODULES
from numpy_transformer.runs.environment import VARIABLES

# A value each variable refuses, and what the refusal says.
BAD = {
    "NUMPY_TRANSFORMER_KERNELS": ("atention", "not a kernel module"),
    "NUMPY_TRANSFORMER_STEPS": ("-3", "expected a positive integer"),
    "NUMBA_NUM_THREADS": ("two", "expected a positive integer"),
    "OMP_NUM_THREADS": ("4,0", "expected positive integers"),
}
# Every command, with arguments it would otherwise run with; the check comes first, so none
# of them starts its work.
COMMANDS = {"train": ["train", "--steps", "1"], "sample": ["sample", "no-such-run"],
            "eval": ["eval", "no-such-run"],
            "export": ["export", "no-such-run"], "gradcheck": ["gradcheck", "ops"],
            "import": ["import", "no-such-export", "--out", "unused"],
            "bench": ["bench", "--quick"]}


def test_every_variable_read_has_a_refused_value_and_every_command_a_case():
    assert set(BAD) == set(VARIABLES)
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(COMMANDS) == set(commands.choices)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("name", BAD)
def test_a_bad_value_is_one_line_and_exit_2_from_every_command(name, command, monkeypatch,
                                                               tmp_path):
    monkeypatch.chdir(tmp_path)
    value, message = BAD[name]
    monkeypatch.setenv(name, value)
    code, _, err = run_cli(COMMANDS[command])
    assert code == 2 and one_line_error(err), err
    assert name in err and value in err, err
    assert message in err, err
    assert not list(tmp_path.iterdir())  # nothing was started, nothing written


@pytest.mark.parametrize("value", ["lstm.", ".lstm", "lstm..lstm_forward",
                                   "lstm.lstm_backward."])
def test_a_kernel_name_cut_by_a_stray_dot_is_refused(value, monkeypatch):
    """A trailing dot is not the whole module (negative control: the module and one of its
    operations, spelled right, are taken)."""
    monkeypatch.setenv("NUMPY_TRANSFORMER_KERNELS", value)
    with pytest.raises(ValueError, match=f"names '{value}', not a kernel module"):
        kernel_selection()
    code, _, err = run_cli(["train", "--steps", "1", "--out", "unused"])
    assert code == 2 and one_line_error(err) and repr(value) in err, err
    for fine in ("lstm", "lstm.lstm_forward,lstm.lstm_backward"):
        monkeypatch.setenv("NUMPY_TRANSFORMER_KERNELS", fine)
        assert kernel_selection() == tuple(fine.split(","))


@pytest.mark.parametrize("kernel", NEEDS_ITS_PARTNER)
def test_a_kernel_that_needs_its_partner_is_refused_alone(kernel, monkeypatch):
    partner, why = NEEDS_ITS_PARTNER[kernel]
    monkeypatch.setenv("NUMPY_TRANSFORMER_KERNELS", kernel)
    with pytest.raises(ValueError, match=f"without '{partner}'") as caught:
        kernel_selection()
    assert why in str(caught.value)
    for fine in (f"{kernel},{partner}", f"{kernel},{kernel.split('.')[0]}"):
        monkeypatch.setenv("NUMPY_TRANSFORMER_KERNELS", fine)
        assert kernel_selection() == tuple(fine.split(","))
    monkeypatch.setenv("NUMPY_TRANSFORMER_KERNELS", kernel)
    code, _, err = run_cli(["train", "--steps", "1", "--out", "unused"])
    assert code == 2 and one_line_error(err) and partner in err, err


def _runs_beside(forward, backward, builds) -> bool:
    """Whether ``backward`` takes the cache of ``forward`` on every one of the pair's aliasing
    cases (the feed-forward network's: one for each activation)."""
    for build in builds:
        case = build(np.random.default_rng(0), np.dtype("float64"))
        outputs, cache = case.split(forward(*case.args, **case.kwargs))
        try:
            case.call(backward, upstream(outputs, 1), cache)
        except (ValueError, TypeError, AttributeError):
            return False
    return True


def test_the_kernels_that_need_their_partner_are_exactly_those_the_table_names():
    numpy_ops, numba_ops = get_backend("numpy"), get_backend("numba")
    needy, tried = set(), 0
    for module in KERNEL_MODULES:
        ops = importlib.import_module(f"numpy_transformer.kernels.{module}").__all__
        for pair in (op.removesuffix("_forward") for op in ops if op.endswith("_forward")):
            forward, backward = f"{pair}_forward", f"{pair}_backward"
            if backward not in ops:
                continue
            tried += 1
            builds = ([_feed_forward(a) for a in ACTIVATIONS] if pair == "feed_forward"
                      else [PAIR_CASES[pair]])
            if not _runs_beside(getattr(numba_ops, forward), getattr(numpy_ops, backward),
                                builds):
                needy.add(f"{module}.{forward}")
            if not _runs_beside(getattr(numpy_ops, forward), getattr(numba_ops, backward),
                                builds):
                needy.add(f"{module}.{backward}")
    assert tried > 10 and needy == set(NEEDS_ITS_PARTNER)


@pytest.mark.parametrize("name, value", [("NUMBA_NUM_THREADS", "1"), ("OMP_NUM_THREADS", "2,1"),
                                         ("NUMPY_TRANSFORMER_STEPS", "2")])
def test_a_good_value_passes(name, value, monkeypatch):
    from numpy_transformer.runs.environment import check_environment

    monkeypatch.setenv(name, value)
    check_environment()


def test_a_numba_pool_larger_than_the_machine_is_refused_not_a_crash(tmp_path):
    """NUMBA_NUM_THREADS=99999 crashed ``sample`` with a segmentation fault when Numba started
    its pool; now it is one line and exit 2. The machine's own CPU count passes."""
    import os
    import subprocess
    import sys

    from _subprocess_helpers import ROOT

    def sample(threads: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_NUM_THREADS": threads}
        return subprocess.run([sys.executable, "-m", "numpy_transformer", "sample",
                               tmp_path / "no-such-run"], env=env, capture_output=True,
                              text=True, timeout=120)

    refused = sample("99999")
    assert refused.returncode == 2 and one_line_error(refused.stderr), refused.stderr
    assert "NUMBA_NUM_THREADS='99999': at most" in refused.stderr
    fine = sample(str(os.cpu_count()))  # passes the check, then finds no run
    assert fine.returncode == 2 and "no-such-run" in fine.stderr, fine.stderr

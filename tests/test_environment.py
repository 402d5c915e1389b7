"""The environment variables are input too: a bad value is one line and exit 2 from every
command, checked once before the command runs (``runs/environment.py``)."""

from __future__ import annotations

import argparse

import pytest
from _run_helpers import one_line_error, run_cli

from numpy_transformer import cli
from numpy_transformer.backend import NEEDS_ITS_FORWARD, kernel_selection
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


@pytest.mark.parametrize("backward", NEEDS_ITS_FORWARD)
def test_a_backward_that_needs_its_kernel_forward_is_refused_alone(backward, monkeypatch):
    forward, kept = NEEDS_ITS_FORWARD[backward]
    monkeypatch.setenv("NUMPY_TRANSFORMER_KERNELS", backward)
    with pytest.raises(ValueError, match=f"without '{forward}'") as caught:
        kernel_selection()
    assert kept in str(caught.value)
    for fine in (f"{backward},{forward}", f"{backward},{backward.split('.')[0]}"):
        monkeypatch.setenv("NUMPY_TRANSFORMER_KERNELS", fine)
        assert kernel_selection() == tuple(fine.split(","))
    monkeypatch.setenv("NUMPY_TRANSFORMER_KERNELS", backward)
    code, _, err = run_cli(["train", "--steps", "1", "--out", "unused"])
    assert code == 2 and one_line_error(err) and forward in err, err


@pytest.mark.parametrize("name, value", [("NUMBA_NUM_THREADS", "1"), ("OMP_NUM_THREADS", "2,1"),
                                         ("NUMPY_TRANSFORMER_STEPS", "2")])
def test_a_good_value_passes(name, value, monkeypatch):
    from numpy_transformer.runs.environment import check_environment

    monkeypatch.setenv(name, value)
    check_environment()

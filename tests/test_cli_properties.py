"""Properties over every command and every option: any value, any state of the files it names
and any value of the environment variables gives exit 0 with a checked result, or a documented
exit code with one line on stderr and no traceback.

The values are drawn from the parser itself (:func:`strategy_for`): an option with choices
draws one of them or junk, a numeric option numbers of every kind (tiny, astronomical, NaN,
infinite) or junk, a switch is given or not, and an option that names a file or folder draws
one of the states of :data:`PATHS` (a FIFO, a socket, a binary file among them). ``train
--config`` also draws the TOML file itself: any of the keys a run records (and keys it does
not), each with a value of its kind or of another (:func:`toml_value`, made from the option
table). An option or a key the drawer cannot place fails
``test_every_command_and_option_is_drawn``: a new command, option or key must say what its
values are before it can land. The commands run in this process (``cli.main``), so an
exception that escapes the command line fails the example with its traceback, and one that
blocks (a FIFO opened) fails it at :data:`DEADLINE`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import sys
import tempfile
from pathlib import Path

import pytest
from _run_helpers import TINY, run_cli, small_text
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_environment import BAD as BAD_ENVIRONMENT
from test_failures import ANY_FLOAT, HUGE_INT, INVALID, SMALL_INT

from numpy_transformer import cli
from numpy_transformer.bench import summary
from numpy_transformer.checkpoint import load_checkpoint
from numpy_transformer.export import load_safetensors
from numpy_transformer.gradcheck_tables import SECTIONS
from numpy_transformer.runs.options import OPTIONS, Option, flag

# a long property suite of the command line (hypothesis): pytest -m slow (CI runs it too)
pytestmark = pytest.mark.slow

NUMBER = st.one_of(SMALL_INT, HUGE_INT, ANY_FLOAT, INVALID)
WORDS = st.sampled_from(["", "x", "all", "1", "-1", "none"])
# What a path option may find: the states each one draws (made by ``materialise``); every
# option that reads a file also meets the wrong kinds of thing
WRONG_KINDS = ("fifo", "socket", "binary")
RUNS = ("lm", "lstm", "lm checkpoint", "missing", "empty folder", "text file", *WRONG_KINDS)
PATHS = {
    "run": RUNS,
    "resume": RUNS,
    "text": ("text", "missing", "empty", "not utf-8", "folder", "characters the run lacks",
             *WRONG_KINDS),
    "out": ("new", "empty folder", "folder with a file", "file", "''", "under a file",
            "fifo", "socket"),
    "config": ("steps 2", "not toml", "unknown key", "bad value", "missing", "folder",
               "not utf-8", "nested toml", *WRONG_KINDS),
    "source": ("export", "export file", "lm", "missing", "empty folder", "text file",
               *WRONG_KINDS),
    "init_from": ("export", "export file", "lm", "lstm", "lm checkpoint", "missing",
                  "empty folder", "text file", *WRONG_KINDS),
}
DEADLINE = 120  # seconds an example may take: a FIFO opened by mistake would block forever
OTHER = {"prompt": st.text(max_size=6),
         "names": st.lists(st.sampled_from([*SECTIONS, "nothing"]), max_size=2)}
ALLOWED = {"train": {0, 1, 2}, "sample": {0, 2}, "eval": {0, 2}, "export": {0, 2},
           "import": {0, 2}, "gradcheck": {0, 1, 2}, "bench": {0, 2}}
ENVIRONMENT = st.one_of(st.just({}), st.sampled_from(
    [{name: value} for name, (value, _) in BAD_ENVIRONMENT.items()]
    + [{"NUMPY_TRANSFORMER_KERNELS": "norms,linear"}, {"NUMBA_NUM_THREADS": "1"}]))
PROPERTY = settings(max_examples=20, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


def commands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    return next(a for a in parser._actions
                if isinstance(a, argparse._SubParsersAction)).choices


def actions(command: str) -> list[argparse.Action]:
    return [a for a in commands()[command]._actions if not isinstance(a, argparse._HelpAction)]


# ------------------------------------------------------------------ the TOML of --config
JUNK = st.one_of(st.text(max_size=4), st.booleans(), st.integers(-2, 2),
                 st.floats(allow_nan=True, allow_infinity=True),
                 st.lists(st.integers(0, 3), max_size=2))
# keys a run does not record: a flag's spelling, the folder's options, nothing at all
FOREIGN_KEYS = ("context", "ffn-width", "out", "resume", "config", "colour")


def toml_value(option: Option):
    """How a TOML file draws the value of ``option``: one of its kind (its choices, a number
    of its type in and out of range, a switch's booleans, a file's states) or junk of another
    kind. An option of no known kind raises ``LookupError``."""
    if option.choices is not None:
        own = st.sampled_from(option.choices)
    elif option.rule is not None and option.rule.kind is int:
        own = st.integers(-3, 4) | st.integers(10**12, 10**30)
    elif option.rule is not None:
        own = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-3, 4)
    elif option.switch is not None:
        own = st.booleans()
    elif option.key in PATHS:
        own = st.sampled_from(PATHS[option.key]).map(lambda state: ("path", state))
    else:
        raise LookupError(f"no strategy draws the TOML key {option.key!r}")
    return own | JUNK


def toml_files():
    """``{key: value}`` of a --config file: some of the keys a run records, some it does not."""
    recorded = {o.key: toml_value(o) for o in OPTIONS if o.store}
    keys = st.sampled_from(sorted(recorded) + list(FOREIGN_KEYS))
    return st.lists(keys, unique=True, max_size=5).flatmap(
        lambda chosen: st.fixed_dictionaries({key: recorded.get(key, JUNK) for key in chosen}))


def toml_text(table: dict, make_path) -> str:
    """``table`` as TOML; a ``("path", state)`` value becomes the path ``make_path`` makes."""
    def value(v) -> str:
        if isinstance(v, tuple):
            return json.dumps(make_path(v[1]))
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float) and not math.isfinite(v):
            return "nan" if v != v else ("inf" if v > 0 else "-inf")
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(v) if isinstance(v, str) else repr(v)

    return "".join(f"{key} = {value(v)}\n" for key, v in table.items())


def strategy_for(action: argparse.Action):
    """How values of ``action`` are drawn: a strategy of the argv words it contributes."""
    name = action.option_strings[0] if action.option_strings else None
    if action.nargs == 0:  # a switch (a pair of them for --x / --no-x)
        return st.sampled_from([[], *([s] for s in action.option_strings)])
    if action.dest == "config" and action.choices is None:  # train's; bench's is a choice
        values = st.one_of(st.sampled_from(PATHS["config"]).map(lambda state: ("path", state)),
                           toml_files().map(lambda table: ("toml", table))).map(lambda v: [v])
    elif action.dest in PATHS and action.choices is None:
        values = st.sampled_from(PATHS[action.dest]).map(lambda state: [("path", state)])
    elif action.dest in OTHER:
        values = OTHER[action.dest]
        values = values if action.nargs == "*" else values.map(lambda v: [v])
    elif action.choices is not None:
        values = st.one_of(st.sampled_from(list(action.choices)), WORDS).map(lambda v: [v])
    elif action.type is not None and action.type.__name__ == "parse":  # cli_parser.number
        values = NUMBER.map(lambda v: [v])
    else:
        raise LookupError(f"no strategy draws {name or action.dest} of this command")
    return values.map(lambda words: [name, *words] if name else words)


def test_every_command_and_option_is_drawn():
    """Each option of each command has a strategy, and each command a property below; a new
    one fails here until it is given them (negative control: an unknown option is refused)."""
    assert set(commands()) == set(ALLOWED)
    for command in commands():
        for action in actions(command):
            strategy_for(action)
    bare = argparse.ArgumentParser().add_argument("--colour")
    with pytest.raises(LookupError, match="--colour"):
        strategy_for(bare)
    for option in OPTIONS:  # every key of the TOML file, as every option
        if option.store:
            toml_value(option)
    with pytest.raises(LookupError, match="'colour'"):
        toml_value(Option("colour", ""))


@st.composite
def argv_of(draw, command: str, fixed=()):
    """Up to four of the command's options (its positionals always), drawn as above."""
    chosen = [a for a in actions(command) if not a.option_strings and a.dest not in fixed]
    optional = [a for a in actions(command) if a.option_strings and a.dest not in fixed]
    chosen += draw(st.lists(st.sampled_from(optional), max_size=4, unique_by=id))
    return [word for a in chosen for word in draw(strategy_for(a))]


# ------------------------------------------------------------------------------- the states
@pytest.fixture(scope="module")
def runs_made(tmp_path_factory):
    """A finished tiny LM run and a tiny LSTM run, made once and copied into each example."""
    pytest.importorskip("safetensors")  # the export state (the hf extra; CI installs it)
    tmp = tmp_path_factory.mktemp("properties")
    text = small_text(tmp)
    for name, model in (("lm", []), ("lstm", ["--model", "lstm", "--hidden", "8", "--embed",
                                              "4", "--context", "16", "--batch", "4"])):
        sizes = TINY if not model else []
        code, _, err = run_cli(["train", *sizes, *model, "--text", text, "--steps", "3",
                                "--eval-every", "2", "--backend", "numpy", "--out",
                                tmp / name, "--quiet"])
        assert code == 0, err
    code, _, err = run_cli(["export", tmp / "lm", "--out", tmp / "export"])
    assert code == 0, err
    return tmp


def materialise(state: str, folder: Path, runs: Path, dest: str) -> str:
    """Make the file or folder ``state`` names inside ``folder``; return its path."""
    path = folder / dest.replace("_", "-")
    if state in ("lm", "lstm"):
        shutil.copytree(runs / state, path)
    elif state == "export":
        shutil.copytree(runs / "export", path)
    elif state == "export file":
        shutil.copytree(runs / "export", path)
        path = path / "model.safetensors"
    elif state == "lm checkpoint":
        shutil.copytree(runs / "lm", path)
        path = path / "checkpoint.npz"
    elif state in ("empty folder", "folder"):
        path.mkdir()
    elif state == "folder with a file":
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"someone else's")
    elif state in ("text file", "file"):
        path.write_text("not a run\n")
    elif state == "text":
        path.write_text(small_text(runs).read_text())
    elif state == "empty":
        path.write_text("")
    elif state == "not utf-8":
        path.write_bytes(b"\xff\xfe\x00abc" * 50)
    elif state == "characters the run lacks":
        path.write_text("\u2603\u2764" * 500)
    elif state == "''":
        return ""
    elif state == "fifo":
        os.mkfifo(path)
    elif state == "socket":
        with contextlib.closing(socket.socket(socket.AF_UNIX)) as sock:
            sock.bind(str(path))
    elif state == "binary":
        path.write_bytes(b"\x00\x01binary\x00" * 20)
    elif state == "under a file":
        path.write_text("in the way\n")
        path = path / "out"
    elif state == "nested toml":
        path.write_text("steps = " + "[" * 50_000 + "]" * 50_000 + "\n")
    elif state.startswith(("steps", "not toml", "unknown", "bad")):
        path.write_text({"steps 2": "steps = 2\n", "not toml": "steps = = 2\n",
                         "unknown key": "colour = 'red'\n", "bad value": "lr = -1.0\n"}[state])
    return str(path)


def realise(argv: list, folder: Path, runs: Path) -> list[str]:
    """argv with each drawn ``("path", state)`` made real, and each ``("toml", table)`` a
    file of it (its own paths made real too)."""
    words, dests = [], iter(range(10**6))

    def make(state: str) -> str:
        return materialise(state, folder, runs, f"p{next(dests)}")

    for word in argv:
        if isinstance(word, tuple) and word[0] == "toml":
            path = folder / f"p{next(dests)}.toml"
            path.write_text(toml_text(word[1], make), encoding="utf-8")
            words.append(str(path))
        elif isinstance(word, tuple):
            words.append(make(word[1]))
        else:
            words.append(str(word))
    return words


class Overdue(BaseException):
    """An example past its deadline: a BaseException, so no handler of the command line
    takes it for an error of its own (a TimeoutError is an OSError: exit 74)."""


@contextlib.contextmanager
def deadline(seconds: int):
    """Within: :class:`Overdue` after ``seconds`` (SIGALRM interrupts a blocking open)."""
    def expire(signum, frame):
        raise Overdue(f"the example took more than {seconds} s (a FIFO opened?)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_example(command: str, argv: list[str], environment: dict, folder: Path,
                monkeypatch) -> tuple[int, str, str]:
    """``cli.main`` in ``folder`` with ``environment``; the exit code is one it documents,
    and any failure is one line."""
    with monkeypatch.context() as m, deadline(DEADLINE):
        m.chdir(folder)
        for name, value in environment.items():
            m.setenv(name, value)
        code, out, err = run_cli([command, *argv])
    assert code in ALLOWED[command], (argv, environment, code, err)
    assert "Traceback" not in err, err
    if code:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1, (argv, err)
    if any(BAD_ENVIRONMENT.get(name, (None,))[0] == value
           for name, value in environment.items()):
        assert code == 2, (environment, err)  # named, unless an option was refused first
    return code, out, err


# ---------------------------------------------------------------------------- the commands
def _example(command, draw_argv, environment, runs, monkeypatch, check):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        argv = realise(draw_argv, folder, runs)
        code, out, err = run_example(command, argv, environment, folder, monkeypatch)
        event(f"exit {code}")  # pytest --hypothesis-show-statistics: how often each came
        if code == 0:
            check(argv, out, folder)


def all_finished(argv, out, folder):
    """Every checkpoint under ``folder`` (the new run's, and the copies a run state made) is
    a finished run's."""
    ckpts = [load_checkpoint(p) for p in folder.rglob("checkpoint.npz")]
    assert ckpts and all(c.meta["finished"] for c in ckpts), out


@PROPERTY
@given(argv=argv_of("train", fixed=("resume", "quiet")), environment=ENVIRONMENT)
def test_train(runs_made, monkeypatch, argv, environment):
    base = [*TINY, "--steps", "2", "--backend", "numpy", "--eval-every", "0", "--quiet"]
    _example("train", [*base, *argv], environment, runs_made, monkeypatch, all_finished)


@PROPERTY
@given(table=toml_files(), argv=argv_of("train", fixed=("resume", "quiet", "config")),
       environment=ENVIRONMENT)
def test_train_config_file(runs_made, monkeypatch, table, argv, environment):
    """Every --config gets a drawn TOML file: a run that starts took each of the file's
    options that no flag gave (its files' paths aside, made absolute)."""
    base = [*TINY, "--steps", "2", "--backend", "numpy", "--eval-every", "0", "--quiet"]
    words = [*base, *argv]
    flagged = {o.key for o in OPTIONS if flag(o.key) in words or
               f"--no-{flag(o.key)[2:]}" in words}

    def check(argv, out, folder):
        all_finished(argv, out, folder)
        if "init_from" in table or "init_from" in flagged:
            return  # the model's options came from the source
        run_dir = Path(folder) / out.split("run folder ", 1)[1].splitlines()[0]
        held = json.loads((run_dir / "config.json").read_text())
        recorded = {**held["config"], **held["options"]}
        for key, value in table.items():
            if key in recorded and key not in flagged and key != "text":
                assert recorded[key] == value, (key, value, recorded[key])

    _example("train", [*words, "--config", ("toml", table)], environment, runs_made,
             monkeypatch, check)


@PROPERTY
@given(state=st.sampled_from(RUNS), steps=st.one_of(st.just([]), NUMBER.map(
    lambda v: ["--steps", v])), environment=ENVIRONMENT)
def test_train_resume(runs_made, monkeypatch, state, steps, environment):
    """--resume of every run state, extended by any --steps (the one option it takes besides
    --quiet; ``tests/test_cli.py`` refuses the others by name)."""
    _example("train", ["--resume", ("path", state), "--quiet", *steps], environment,
             runs_made, monkeypatch, all_finished)


@PROPERTY
@given(argv=argv_of("sample"), environment=ENVIRONMENT)
def test_sample(runs_made, monkeypatch, argv, environment):
    def check(argv, out, folder):
        prompt = argv[argv.index("--prompt") + 1] if "--prompt" in argv else None
        assert out.strip() or prompt == "", out
        if prompt:
            assert out.startswith(prompt), (prompt, out)

    _example("sample", argv, environment, runs_made, monkeypatch, check)


@PROPERTY
@given(argv=argv_of("eval"), environment=ENVIRONMENT)
def test_eval(runs_made, monkeypatch, argv, environment):
    def check(argv, out, folder):
        assert "loss" in out and "perplexity" in out, out

    _example("eval", argv, environment, runs_made, monkeypatch, check)


@PROPERTY
@given(argv=argv_of("export"), environment=ENVIRONMENT)
def test_export(runs_made, monkeypatch, argv, environment):
    def check(argv, out, folder):
        written = [Path(p) for p in out.removeprefix("wrote ").strip().split(", ")]
        assert written and all(p.is_file() for p in written), out
        for path in written:
            if path.name == "model.safetensors" and "--format" not in argv[-2:]:
                assert load_safetensors(path).info["step"] == 3
        assert not [p for p in folder.rglob(".*")], "a staging folder was left"

    _example("export", argv, environment, runs_made, monkeypatch, check)


@PROPERTY
@given(argv=argv_of("import"), environment=ENVIRONMENT)
def test_import(runs_made, monkeypatch, argv, environment):
    def check(argv, out, folder):
        run_dir = Path(out.split("/:")[0].removeprefix("wrote "))
        ckpt = load_checkpoint(run_dir / "checkpoint.npz")
        assert ckpt.step == 0 and ckpt.params, out

    _example("import", argv, environment, runs_made, monkeypatch, check)


@PROPERTY
@given(argv=argv_of("gradcheck"), environment=ENVIRONMENT)
def test_gradcheck(runs_made, monkeypatch, argv, environment):
    """The checks themselves are ``tests/test_gradcheck.py``'s; here every option value
    reaches them checked, or is refused (the tables are replaced by a recorder)."""
    from numpy_transformer import gradcheck_tables

    calls = []
    monkeypatch.setattr(gradcheck_tables, "print_tables",
                        lambda names, tol: calls.append((names, tol)) or True)

    def check(argv, out, folder):
        if "--list" in argv:
            assert out.split() == list(SECTIONS)
        else:
            (names, tol), = calls
            assert set(names or SECTIONS) <= set(SECTIONS) and 0 < tol < float("inf")

    _example("gradcheck", argv, environment, runs_made, monkeypatch, check)


@PROPERTY
@given(argv=argv_of("bench"), environment=ENVIRONMENT)
def test_bench(runs_made, monkeypatch, argv, environment):
    """As for gradcheck: what ``bench`` measures is ``tests/test_bench.py``'s; here any value
    either reaches it checked or is refused."""
    from numpy_transformer.bench.train_step import CONFIGS
    from numpy_transformer.threads import available_cores

    calls = []
    monkeypatch.setattr(summary, "run", lambda config, threads, quick, busy: calls.append(
        (config, threads)))

    def check(argv, out, folder):
        (config, threads), = calls
        assert config in CONFIGS and (threads is None or 1 <= threads <= available_cores())

    _example("bench", argv, environment, runs_made, monkeypatch, check)


def test_an_escaping_exception_fails_the_property(runs_made, monkeypatch, tmp_path):
    """Negative control: a command that raises past the command line is caught by
    run_example (it would pass silently if run_cli swallowed it)."""
    from numpy_transformer.runs import sample

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(sample, "sample_checkpoint", broken)
    with pytest.raises(ZeroDivisionError):
        run_example("sample", [str(runs_made / "lm")], {}, tmp_path, monkeypatch)
    monkeypatch.undo()
    with pytest.raises(AssertionError):  # a documented code, but two lines: not one line
        monkeypatch.setattr(cli, "cmd_sample", lambda args: print("a\nb", file=sys.stderr)
                            or 2)
        run_example("sample", [str(runs_made / "lm")], {}, tmp_path, monkeypatch)
    fifo = tmp_path / "fifo"  # a command that opens a FIFO blocks: the deadline ends it
    os.mkfifo(fifo)
    monkeypatch.setattr(cli, "cmd_sample", lambda args: open(fifo).read() and 0)
    monkeypatch.setattr(sys.modules[__name__], "DEADLINE", 1)
    with pytest.raises(Overdue):
        run_example("sample", [str(runs_made / "lm")], {}, tmp_path, monkeypatch)

"""Every failure is one clear sentence (issue 14): each class of failure met as a user meets it,
the command line in a subprocess, asserting the exit code, exactly one line on stderr and no
traceback.

The exit codes are those of ``runs/options.py``'s EXIT_CODES. Runs that train are tiny and
use the NumPy backend (no numba to load).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from _run_helpers import small_text
from _subprocess_helpers import ROOT, cli, fsize_limit, honour_permissions, one_line, refused
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numpy_transformer.checkpoint import load_checkpoint
from numpy_transformer.config import TransformerConfig
from numpy_transformer.data import window_schedule
from numpy_transformer.generate import generate
from numpy_transformer.nn import DecoderLM
from numpy_transformer.optim import clip_grad_norm, global_norm
from numpy_transformer.runs.outputs import EXIT_IO

TINY = ["--width", "16", "--heads", "2", "--layers", "1", "--ffn-width", "32", "--context",
        "16", "--batch", "4", "--backend", "numpy", "--quiet"]
HUGE = str(10 ** 12)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A finished tiny LM run (checkpoint with Adam moments) and its text."""
    tmp = tmp_path_factory.mktemp("failures")
    text = small_text(tmp)
    code, _, err = cli("train", *TINY, "--text", text, "--steps", "4", "--out", tmp / "run")
    assert code == 0, err
    return tmp / "run", text


def copy_run(tiny, dest: Path) -> Path:
    shutil.copytree(tiny[0], dest)
    return dest


def rewrite(src: Path, dst: Path, replace: dict | None = None, drop=()) -> Path:
    with np.load(src, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files if k not in drop}
    arrays.update(replace or {})
    np.savez(dst, **arrays)
    return dst


def sample_and_resume_refuse(run_dir: Path, *patterns: str) -> None:
    """Both ``sample`` and ``train --resume`` of ``run_dir``: exit 2, one line."""
    for argv in (["sample", run_dir, "--length", "5"], ["train", "--resume", run_dir]):
        code, _, err = cli(*argv)
        refused(code, err, 2, *patterns)


# ------------------------------------------------------------------- 1. sizes that cannot fit

@pytest.mark.parametrize("flag", ["--layers", "--width", "--ffn-width", "--context", "--batch",
                                  "--steps"])
def test_a_size_that_cannot_fit_is_refused_naming_it(flag, tiny, tmp_path):
    # a context longer than the LM's text is refused for that reason: the sort task has none
    data = ["--task", "sort"] if flag == "--context" else ["--text", tiny[1]]
    code, _, err = cli("train", *TINY, *data, flag, HUGE, "--out", tmp_path / "r", timeout=60)
    refused(code, err, 2, f"{flag} {HUGE} is too large", "of memory", "available")
    assert not (tmp_path / "r").exists()


def test_sample_length_has_a_stated_bound(tiny):
    code, _, err = cli("sample", tiny[0], "--length", HUGE, timeout=60)
    refused(code, err, 2, "--length", "1,000,000")
    code, out, err = cli("train", "--help")
    assert code == 0 and "74" in out and "143" in out


def test_library_sizes_that_cannot_fit_raise_value_error():
    with pytest.raises(ValueError, match="max_len=1000000000000 is too large"):
        TransformerConfig(vocab=10, width=8, heads=2, layers=1, ffn_width=8,
                          max_len=10 ** 12).validate()
    with pytest.raises(ValueError, match="steps=1000000000000 is too large"):
        window_schedule(1000, 10, 64, 10 ** 12, np.random.default_rng(0))
    TransformerConfig(vocab=10, width=8, heads=2, layers=1, ffn_width=8, max_len=64).validate()


def test_estimate_counts_every_weight():
    from numpy_transformer.memory import parameter_count, weight_count
    from numpy_transformer.nn import EncoderClassifier, EncoderDecoder

    for kw in (dict(), dict(positions="learned", activation="swiglu"),
               dict(positions="rope", norm="rmsnorm", tie_embeddings=True, norm_first=False),
               dict(bias=False, activation="swiglu"), dict(bias=False, positions="learned")):
        config = TransformerConfig(vocab=13, width=16, heads=2, layers=2, ffn_width=24,
                                   max_len=12, num_classes=5, **kw)
        kinds = (DecoderLM, EncoderDecoder) if config.tie_embeddings else \
            (DecoderLM, EncoderClassifier, EncoderDecoder)
        for model in (kind(config) for kind in kinds):
            tables = sum(b.size for _, m in model.named_modules() for b in m.buffers.values())
            assert weight_count(config, type(model).__name__) == \
                model.num_parameters() + tables, (kw, type(model).__name__)
            assert parameter_count(config, type(model).__name__) == model.num_parameters()


def test_the_lstm_parameter_count_is_exact():
    from numpy_transformer.config import LSTMConfig
    from numpy_transformer.memory import parameter_count, weight_count
    from numpy_transformer.nn import LSTMLM

    for kw in (dict(), dict(embed=5), dict(layers=3, embed=9)):
        config = LSTMConfig(vocab=11, hidden=7, max_len=8, **kw)
        assert parameter_count(config, "LSTMLM") == weight_count(config, "LSTMLM") == \
            LSTMLM(config).num_parameters(), kw


@pytest.mark.parametrize("kind", ["DecoderLM", "EncoderClassifier", "EncoderDecoder",
                                  "LSTMLM"])
def test_the_estimate_counts_the_objects_of_many_tiny_layers(kind):
    """200 layers of width 2: the modules, dicts and array headers outweigh the numbers many
    times over. The estimate (weights + objects) stays below what building the model
    allocates (a lower bound) and above half of it; the weights alone are far below."""
    import gc
    import tracemalloc

    from numpy_transformer import nn
    from numpy_transformer.config import LSTMConfig
    from numpy_transformer.memory import object_bytes, weight_count

    def build(layers):
        if kind == "LSTMLM":
            config = LSTMConfig(vocab=4, embed=2, hidden=2, layers=layers, max_len=4,
                                backend="numpy")
        else:
            config = TransformerConfig(vocab=4, width=2, heads=1, layers=layers, ffn_width=2,
                                       max_len=4, backend="numpy",
                                       num_classes=2 if kind == "EncoderClassifier" else None)
        gc.collect()
        tracemalloc.start()
        try:
            model = getattr(nn, kind)(config)
            allocated = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        del model
        return config, allocated

    build(1)  # the first model of a process also loads what every later one shares
    config, allocated = build(200)
    weights = weight_count(config, kind) * 8
    estimate = weights + object_bytes(config, kind)
    assert 0.5 * allocated < estimate <= allocated, (estimate, allocated)
    assert weights < 0.25 * allocated  # negative control: the numbers alone miss most of it


def test_checkpoint_borne_sizes_are_refused(tiny, tmp_path):
    run_dir = copy_run(tiny, tmp_path / "config")
    path = run_dir / "checkpoint.npz"
    ckpt = load_checkpoint(path)
    rewrite(path, path, {"config": np.array(json.dumps({**ckpt.config, "max_len": 10 ** 12}))})
    sample_and_resume_refuse(run_dir, "1000000000000")
    run_dir = copy_run(tiny, tmp_path / "options")
    path = run_dir / "checkpoint.npz"
    rewrite(path, path, {"options": np.array(json.dumps({**ckpt.options, "batch": 10 ** 12}))})
    code, _, err = cli("train", "--resume", run_dir)
    refused(code, err, 2, "--batch 1000000000000 is too large")


def test_npy_header_claiming_1e12_floats_is_refused_before_reading(tiny, tmp_path):
    run_dir = copy_run(tiny, tmp_path / "run")
    path = run_dir / "checkpoint.npz"
    with zipfile.ZipFile(path) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    name = next(n for n in members if n.startswith("param."))
    data = members[name]
    header_len = int.from_bytes(data[8:10], "little")
    header = data[10:10 + header_len].decode("latin1")
    shape = header[header.index("(") : header.index(")") + 1]
    forged = header.replace(shape, f"({10 ** 12},)").ljust(header_len)[:header_len]
    members[name] = data[:10] + forged.encode("latin1") + data[10 + header_len:]
    with zipfile.ZipFile(path, "w") as z:
        for n, b in members.items():
            z.writestr(n, b)
    sample_and_resume_refuse(run_dir, "claims shape (1000000000000,)")


# ------------------------------------------------------------------- 2. file-system faults

def test_unreadable_text_is_an_io_error(tmp_path):
    preexec = honour_permissions()
    text = small_text(tmp_path)
    text.chmod(0)
    code, _, err = cli("train", *TINY, "--text", text, "--out", tmp_path / "r",
                       preexec_fn=preexec)
    refused(code, err, EXIT_IO, str(text), "Permission denied")


def test_read_only_run_folder_at_start(tmp_path):
    preexec = honour_permissions()
    text = small_text(tmp_path)
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o555)
    code, _, err = cli("train", *TINY, "--text", text, "--steps", "2", "--out", out,
                       preexec_fn=preexec)
    out.chmod(0o755)
    refused(code, err, EXIT_IO, str(out), "Permission denied")
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("kind", ["folder", "fifo", "device"])
def test_a_folder_fifo_or_device_is_named_for_what_it_is(kind, tmp_path):
    path = {"folder": tmp_path, "device": Path("/dev/zero")}.get(kind, tmp_path / "pipe")
    if kind == "fifo":
        os.mkfifo(path)
    name = {"folder": "a folder", "fifo": "a named pipe (FIFO)",
            "device": "a character device"}[kind]
    code, _, err = cli("train", *TINY, "--text", path, "--out", tmp_path / "r", timeout=60)
    refused(code, err, 2, f"{path} is {name}, not a file")
    code, _, err = cli("sample", path if kind != "folder" else tmp_path / "x", timeout=60)
    assert code == 2 and "Traceback" not in err


def test_config_json_replaced_by_a_folder(tiny, tmp_path):
    run_dir = copy_run(tiny, tmp_path / "run")
    (run_dir / "config.json").unlink()
    (run_dir / "config.json").mkdir()
    code, _, err = cli("train", *TINY, "--text", tiny[1], "--steps", "4", "--out", run_dir)
    refused(code, err, 2, "config.json is a folder")
    code, _, err = cli("train", *TINY, "--text", tiny[1], "--steps", "4", "--out", run_dir,
                       "--force")
    refused(code, err, 2, "config.json is a folder")


def test_file_size_limit_during_a_save_keeps_the_last_checkpoint(tiny, tmp_path):
    """The step-0 checkpoint (weights only) fits under the cap, the first one with Adam's
    moments does not: EFBIG in the middle of the run, exit 74, the step-0 checkpoint loads."""
    step0 = load_checkpoint(tiny[0] / "checkpoint.npz")
    full = (tiny[0] / "checkpoint.npz").stat().st_size
    cap = full * 2 // 3  # above the weights-only file (a third of it), below the full one
    run_dir = tmp_path / "run"
    code, _, err = cli("train", *TINY, "--text", tiny[1], "--steps", "20", "--save-every", "3",
                       "--out", run_dir, preexec_fn=fsize_limit(cap))
    refused(code, err, EXIT_IO, "checkpoint.npz", "File too large",
            "the checkpoint of step 0", "left intact")
    ckpt = load_checkpoint(run_dir / "checkpoint.npz")
    assert ckpt.step == 0 and set(ckpt.params) == set(step0.params)
    assert not list(run_dir.glob(".*.tmp"))


def test_run_folder_becoming_read_only_during_training(tiny, tmp_path):
    preexec = honour_permissions()
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "numpy_transformer", "train", *TINY,
                             "--text", str(tiny[1]), "--steps", "100000", "--save-every", "1",
                             "--out", str(run_dir)], env=env, preexec_fn=preexec,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        log = run_dir / "log.jsonl"
        deadline = time.monotonic() + 120
        while (not log.exists() or log.stat().st_size < 500) and time.monotonic() < deadline:
            time.sleep(0.2)
        run_dir.chmod(0o555)
        _, err = proc.communicate(timeout=120)
    finally:
        run_dir.chmod(0o755)
        if proc.poll() is None:
            proc.kill()
    refused(proc.returncode, err, EXIT_IO, "Permission denied", "left intact")
    assert load_checkpoint(run_dir / "checkpoint.npz").step > 0


# ------------------------------------------------------------------- 3, 4, 8. the run folder

def test_stale_temporary_files_are_removed_when_the_folder_is_next_opened(tiny, tmp_path):
    run_dir = copy_run(tiny, tmp_path / "run")
    stale = [run_dir / ".checkpoint.npz.abc123.tmp", run_dir / ".log.jsonl.x.tmp"]
    for p in stale:
        p.write_bytes(b"half a save")
    (run_dir / ".lock").write_text("999999999\n")  # left by a kill -9: its pid is gone
    code, out, err = cli("train", "--resume", run_dir)
    assert code == 0 and "nothing to resume" in out, err
    assert not any(p.exists() for p in stale) and not (run_dir / ".lock").exists()


def test_folder_with_only_its_config_resumes_from_step_0(tiny, tmp_path):
    run_dir = tmp_path / "run"
    args = ["train", *TINY, "--text", tiny[1], "--steps", "3", "--out", run_dir]
    assert cli(*args)[0] == 0
    for p in run_dir.iterdir():
        if p.name != "config.json":
            p.unlink()  # what a kill before the first save leaves
    code, _, err = cli(*args)
    refused(code, err, 2, "before its first checkpoint", "--resume")
    code, out, err = cli("train", "--resume", run_dir)
    assert code == 0 and "from step 0" in out, err
    assert load_checkpoint(run_dir / "checkpoint.npz").step == 3


def test_a_second_process_is_refused_while_the_run_goes_on(tiny, tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen([sys.executable, "-m", "numpy_transformer", "train", *TINY,
                              "--text", str(tiny[1]), "--steps", "100000", "--out",
                              str(run_dir)], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "checkpoint.npz").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        code, _, err = cli("train", "--resume", run_dir)
        refused(code, err, 2, "in use by process", str(first.pid))
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=120) == 143
    finally:
        if first.poll() is None:
            first.kill()
    assert not (run_dir / ".lock").exists()


# ------------------------------------------------------------------- 5. divergence

def test_gradient_norm_cannot_overflow_for_finite_gradients():
    rng = np.random.default_rng(0)
    grads = {"a": (rng.standard_normal(1000) * 1e20).astype(np.float32),
             "b": (rng.standard_normal((30, 30)) * 1e19).astype(np.float32)}
    exact = np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads.values()))
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.dot(grads["a"], grads["a"]))  # the plain sum overflows
    assert global_norm(grads) == pytest.approx(exact, rel=1e-5)
    assert global_norm({k: g.astype(np.float64) for k, g in grads.items()}) == \
        pytest.approx(exact, rel=1e-12)
    assert clip_grad_norm(grads, 1.0) == pytest.approx(exact, rel=1e-5)
    assert np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads.values())) == \
        pytest.approx(1.0, rel=1e-5)  # clipped
    assert np.isinf(global_norm({"a": np.array([np.inf, 1.0])}))
    assert np.isnan(global_norm({"a": np.array([np.nan, 1.0])}))


@pytest.mark.parametrize("lr", ["1e6", "1e30"])
def test_divergence_verdict_is_the_same_on_both_backends(lr, tiny, tmp_path):
    results = {}
    for backend in ("numpy", "numba"):
        args = [a if a != "numpy" else backend for a in TINY]
        code, _, err = cli("train", *args, "--text", tiny[1], "--steps", "20", "--lr", lr,
                           "--out", tmp_path / backend, timeout=600)
        assert code in (0, 1) and "Traceback" not in err, err
        if code == 1:
            line = one_line(err)
            assert "diverged" in line and ("weight" in line or "gradient of" in line), line
            ckpt = load_checkpoint(tmp_path / backend / "checkpoint.npz")  # finite, loads
            assert all(np.isfinite(p).all() for p in ckpt.params.values())
        results[backend] = code
    assert results["numpy"] == results["numba"], results


def test_non_finite_weights_are_refused_by_sample_and_resume(tiny, tmp_path):
    run_dir = copy_run(tiny, tmp_path / "run")
    path = run_dir / "checkpoint.npz"
    ckpt = load_checkpoint(path)
    name = next(iter(ckpt.params))
    bad = ckpt.params[name].copy()
    bad.flat[0] = np.nan
    rewrite(path, path, {f"param.{name}": bad})
    sample_and_resume_refuse(run_dir, f"param.{name} holds NaN or infinity")


# ------------------------------------------------------------------- 6. sampling

def test_tiny_temperature_is_greedy(tiny):
    code, greedy, err = cli("sample", tiny[0], "--greedy", "--length", "40")
    assert code == 0, err
    code, tiny_t, err = cli("sample", tiny[0], "--temperature", "1e-310", "--length", "40")
    assert code == 0 and tiny_t == greedy, err
    model = DecoderLM(TransformerConfig(vocab=7, width=8, heads=2, layers=1, ffn_width=8,
                                        max_len=8, backend="numpy"))
    prompt = np.array([1, 2, 3])
    np.testing.assert_array_equal(
        generate(model, prompt, 12, np.random.default_rng(0), temperature=1e-310),
        generate(model, prompt, 12, None, greedy=True))


def test_prompt_with_a_byte_that_is_not_utf8(tiny):
    prompt = os.fsdecode(b"de\xff ")  # what the command line makes of that byte
    code, _, err = cli("sample", tiny[0], "--prompt", prompt)
    refused(code, err, 2, "--prompt: byte 0xff at position 2 is not UTF-8")


# ------------------------------------------------------------------- 7. tampered checkpoints

def test_zip_member_that_is_not_npy(tiny, tmp_path):
    run_dir = copy_run(tiny, tmp_path / "run")
    with zipfile.ZipFile(run_dir / "checkpoint.npz", "a") as z:
        z.writestr("notes.txt", "hello")
    sample_and_resume_refuse(run_dir, "'notes.txt' is not an .npy array")


def test_config_json_nested_100000_deep(tiny, tmp_path):
    run_dir = copy_run(tiny, tmp_path / "run")
    path = run_dir / "checkpoint.npz"
    rewrite(path, path, {"config": np.array("[" * 100_000 + "]" * 100_000)})
    sample_and_resume_refuse(run_dir, "'config'", "nested too deeply")


def test_tokenizer_that_no_longer_matches_the_embedding(tiny, tmp_path):
    run_dir = copy_run(tiny, tmp_path / "run")
    path = run_dir / "checkpoint.npz"
    tok = load_checkpoint(path).tokenizer
    rewrite(path, path, {"tokenizer": np.array(json.dumps({**tok, "chars": tok["chars"][:-1]}))})
    sample_and_resume_refuse(run_dir, "tokenizer does not match the embedding table")


def test_absurd_option_types_in_a_checkpoint(tiny, tmp_path):
    run_dir = copy_run(tiny, tmp_path / "run")
    path = run_dir / "checkpoint.npz"
    options = load_checkpoint(path).options
    rewrite(path, path, {"options": np.array(json.dumps({**options, "clip": "lots"}))})
    code, _, err = cli("train", "--resume", run_dir)
    refused(code, err, 2, "--clip 'lots'")


# ------------------------------------------------------------------- every numeric option

INVALID = st.sampled_from(["-1", "-1e-3", "0", "nan", "-nan", "inf", "-inf", "fast", "1e", "",
                           "0x10", "1_000"])
SMALL_INT = st.integers(1, 4).map(str)
HUGE_INT = st.integers(10 ** 12, 10 ** 40).map(str)
ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True).map(repr)
# Integer options get small values (a run that trains stays tiny), huge ones (refused: they
# cannot fit, or the text is too short for them) or junk; the rest may take any value.
TRAIN_INTS = ("--width", "--heads", "--layers", "--ffn-width", "--context", "--batch",
              "--steps", "--kv-heads")
TRAIN_ANY = {"--seed": st.integers(0, 10 ** 30).map(str),
             "--warmup": st.integers(0, 10 ** 30).map(str),
             "--eval-every": st.integers(0, 10 ** 30).map(str),
             "--save-every": st.integers(0, 10 ** 30).map(str),
             "--early-stop": st.integers(0, 10 ** 30).map(str),
             "--stats-every": st.integers(0, 10 ** 30).map(str),
             "--vocab-size": st.integers(0, 10 ** 30).map(str),
             "--norm-eps": ANY_FLOAT,
             "--lr": ANY_FLOAT, "--weight-decay": ANY_FLOAT, "--clip": ANY_FLOAT,
             "--dropout": ANY_FLOAT, "--attn-dropout": ANY_FLOAT}
SAMPLE_OPTIONS = {"--length": st.one_of(SMALL_INT, HUGE_INT), "--temperature": ANY_FLOAT,
                  "--top-k": st.one_of(SMALL_INT, HUGE_INT), "--top-p": ANY_FLOAT,
                  "--seed": st.integers(0, 10 ** 30).map(str)}
PROPERTY = settings(max_examples=15, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
LIMIT = 60  # seconds: a refusal comes long before; a tiny run of two steps well within


def _option_and_value(options: dict):
    return st.sampled_from(sorted(options)).flatmap(
        lambda name: st.tuples(st.just(name), st.one_of(options[name], INVALID)))


def _no_traceback(code: int, err: str) -> None:
    assert "Traceback" not in err, err
    if code:
        line = one_line(err)
        assert code == 2 or (code == 1 and "diverged" in line), (code, line)


@pytest.mark.slow  # a sweep: pytest -m slow (CI runs it too)
@PROPERTY
@given(_option_and_value({**{name: st.one_of(SMALL_INT, HUGE_INT) for name in TRAIN_INTS},
                          **TRAIN_ANY}))
def test_every_numeric_train_option_is_refused_or_works(tiny, option):
    name, value = option
    args = [a for a in TINY if a != "--quiet"] + ["--quiet", "--steps", "2"]
    with tempfile.TemporaryDirectory() as out:
        code, _, err = cli("train", *args, "--text", tiny[1], name, value, "--out",
                           Path(out) / "run", timeout=LIMIT)
    assert code in (0, 1, 2), (code, err)
    _no_traceback(code, err)


# the LSTM's own sizes, on a tiny LSTM (the Transformer's options are refused with it)
TINY_LSTM = ["--model", "lstm", "--hidden", "8", "--embed", "4", "--context", "16", "--batch",
             "4", "--backend", "numpy", "--quiet"]
LSTM_INTS = ("--hidden", "--embed", "--layers")


def test_every_numeric_train_option_is_drawn():
    """A new numeric option joins the properties below: every one of TRAIN_NUMBERS is drawn."""
    from numpy_transformer.runs.options import TRAIN_NUMBERS, flag

    drawn = set(TRAIN_INTS) | set(TRAIN_ANY) | set(LSTM_INTS)
    assert {flag(key) for key in TRAIN_NUMBERS} == drawn


@pytest.mark.slow  # a sweep: pytest -m slow (CI runs it too)
@PROPERTY
@given(_option_and_value({name: st.one_of(SMALL_INT, HUGE_INT) for name in LSTM_INTS}))
def test_every_numeric_lstm_option_is_refused_or_works(tiny, option):
    name, value = option
    with tempfile.TemporaryDirectory() as out:
        code, _, err = cli("train", *TINY_LSTM, "--steps", "2", "--text", tiny[1], name, value,
                           "--out", Path(out) / "run", timeout=LIMIT)
    assert code in (0, 1, 2), (code, err)
    _no_traceback(code, err)


@pytest.mark.slow  # a sweep: pytest -m slow (CI runs it too)
@PROPERTY
@given(_option_and_value(SAMPLE_OPTIONS))
def test_every_numeric_sample_option_is_refused_or_works(tiny, option):
    code, _, err = cli("sample", tiny[0], *option, timeout=LIMIT)
    assert code in (0, 2), (code, err)
    _no_traceback(code, err)

"""Tokenizer, text loading, split, window schedule, batches, fingerprints, fixed-window loss,
and the embedded corpus."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from numpy_transformer.corpus import load_corpus
from numpy_transformer.data import (
    CharTokenizer,
    fingerprint,
    fixed_window_loss,
    fixed_window_windows,
    get_batch,
    load_text,
    train_val_split,
    window_schedule,
)

TEXT = "Attention é tout ce dont vous avez besoin — 注意 (2017)!\n\tfin"


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------

def test_tokenizer_vocab_ids_and_round_trip():
    tok = CharTokenizer(TEXT)
    chars = sorted(set(TEXT))
    assert tok.vocab_size == len(chars) and tok.chars == chars
    ids = tok.encode(TEXT)
    assert ids.dtype == np.int64 and ids.shape == (len(TEXT),)
    assert ids.tolist() == [chars.index(c) for c in TEXT]  # id = rank among sorted characters
    assert tok.decode(ids) == TEXT
    assert tok.decode(ids.tolist()) == TEXT
    assert tok.decode([]) == "" and tok.encode("").shape == (0,)


def test_unknown_error_names_first_unseen_character_and_position():
    tok = CharTokenizer("abc ")
    with pytest.raises(ValueError, match=r"'x' \(U\+0078\) at position 4"):
        tok.encode("abc xyz")
    with pytest.raises(ValueError, match="U\\+00E9.* position 0"):
        tok.encode("éa")


def test_unknown_skip_and_replace():
    tok = CharTokenizer("abc ", replacement=" ")
    assert tok.decode(tok.encode("a-b-cz", unknown="skip")) == "abc"
    assert tok.decode(tok.encode("a-b-cz", unknown="replace")) == "a b c "
    assert tok.decode(tok.encode("abc", unknown="replace")) == "abc"
    with pytest.raises(ValueError, match="replacement"):
        CharTokenizer("abc").encode("x", unknown="replace")
    with pytest.raises(ValueError, match="unknown"):
        tok.encode("a", unknown="ignore")


@pytest.mark.parametrize("text, replacement", [("", None), (None, None), ("abc", "?"),
                                               ("abc", "ab"), ("abc", "")])
def test_tokenizer_bad_construction(text, replacement):
    with pytest.raises(ValueError, match="text|replacement"):
        CharTokenizer(text, replacement=replacement)


def test_tokenizer_dict_round_trip_through_json():
    tok = CharTokenizer(TEXT, replacement="!")
    again = CharTokenizer.from_dict(json.loads(json.dumps(tok.to_dict())))
    assert again.chars == tok.chars and again.replacement == "!"
    probe = TEXT[::-1] + "§"
    np.testing.assert_array_equal(again.encode(probe, unknown="replace"),
                                  tok.encode(probe, unknown="replace"))
    with pytest.raises(ValueError, match="distinct"):
        CharTokenizer.from_dict({"chars": "aab", "replacement": None})
    with pytest.raises(ValueError, match="keys"):
        CharTokenizer.from_dict({"chars": "ab"})


@pytest.mark.parametrize("ids", [[0, 99], [-1], np.array([0.0, 1.0]), [[0, 1]]])
def test_decode_rejects_bad_ids(ids):
    with pytest.raises(ValueError, match="ids"):
        CharTokenizer("abc").decode(ids)


# --------------------------------------------------------------------------------------------
# load_text
# --------------------------------------------------------------------------------------------

def test_load_text_reads_utf8_and_drops_bom(tmp_path):
    path = tmp_path / "good.txt"
    path.write_bytes(b"\xef\xbb\xbf" + TEXT.encode("utf-8"))
    assert load_text(path) == TEXT
    assert load_text(str(path)) == TEXT


@pytest.mark.parametrize("content, message", [
    (None, "no such file"), (b"", "empty"), (b"abc\x00def", "binary"),
    (b"caf\xe9 latin-1", "not valid UTF-8"),
])
def test_load_text_errors_name_the_file(tmp_path, content, message):
    path = tmp_path / "corpus_under_test.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as err:
        load_text(path)
    assert "corpus_under_test.txt" in str(err.value)


# --------------------------------------------------------------------------------------------
# Split, schedule, batches
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [10, 101, 148_594])
def test_split_is_contiguous(n):
    ids = np.arange(n)
    train, val = train_val_split(ids)
    assert len(train) == int(0.9 * n) and len(train) + len(val) == n
    np.testing.assert_array_equal(np.concatenate([train, val]), ids)  # first part, then rest
    assert train[-1] + 1 == val[0]


@pytest.mark.parametrize("frac, n", [(0.0, 10), (1.0, 10), (1.5, 10), (0.05, 10), (0.9, 1)])
def test_split_rejects_bad_input(frac, n):
    with pytest.raises(ValueError, match="frac|empty"):
        train_val_split(np.arange(n), frac)


def test_schedule_is_determined_by_the_seed():
    a = window_schedule(5000, 100, 64, 50, np.random.default_rng(1337))
    b = window_schedule(5000, 100, 64, 50, np.random.default_rng(1337))
    c = window_schedule(5000, 100, 64, 50, np.random.default_rng(1338))
    assert a.shape == (50, 64) and a.dtype == np.int64
    np.testing.assert_array_equal(a, b)
    assert fingerprint(a) == fingerprint(b)
    assert not np.array_equal(a, c) and fingerprint(a) != fingerprint(c)


def test_schedule_covers_every_valid_start_and_no_other():
    n, context = 12, 4  # valid starts 0 .. 7: the window [7, 12) has context + 1 tokens
    starts = window_schedule(n, context, 50, 40, np.random.default_rng(0))
    assert set(np.unique(starts).tolist()) == set(range(n - context))
    window_schedule(context + 1, context, 1, 1, np.random.default_rng(0))  # one window: fine


@pytest.mark.parametrize("args, word", [
    ((100, 0, 4, 10), "context"), ((100, 10, 0, 10), "batch"), ((100, 10, 4, -1), "steps"),
    ((100, 10.0, 4, 10), "context"), ((0, 10, 4, 10), "n_tokens"),
    ((10, 10, 4, 10), "shorter than one window"),
])
def test_schedule_rejects_bad_input(args, word):
    with pytest.raises(ValueError, match=word):
        window_schedule(*args, np.random.default_rng(0))
    with pytest.raises(ValueError, match="rng"):
        window_schedule(100, 10, 4, 10, 1234)


def test_get_batch_inputs_and_shifted_targets():
    ids = np.random.default_rng(0).integers(0, 50, size=200)
    starts = np.array([0, 17, 199 - 8])
    x, y = get_batch(ids, starts, context=8)
    assert x.shape == y.shape == (3, 8)
    for b, s in enumerate(starts):
        assert x[b].tolist() == ids[s:s + 8].tolist()
        assert y[b].tolist() == ids[s + 1:s + 9].tolist()
    with pytest.raises(ValueError, match="start 192"):
        get_batch(ids, np.array([192]), context=8)
    with pytest.raises(ValueError, match="start -1"):
        get_batch(ids, np.array([-1]), context=8)
    with pytest.raises(ValueError, match="context"):
        get_batch(ids, starts, context=0)


# --------------------------------------------------------------------------------------------
# Fingerprints
# --------------------------------------------------------------------------------------------

def test_fingerprint_sees_dtype_shape_data_and_names_but_not_dict_order():
    a = np.arange(6, dtype=np.float32)
    base = fingerprint(a)
    assert len(base) == 64 and int(base, 16) >= 0
    assert fingerprint(a.copy()) == base
    assert fingerprint(a.astype(np.float64)) != base
    assert fingerprint(a.reshape(2, 3)) != base
    changed = a.copy()
    changed[3] += 1
    assert fingerprint(changed) != base
    d1 = {"w": a, "b": np.zeros(2)}
    d2 = {"b": np.zeros(2), "w": a}
    assert fingerprint(d1) == fingerprint(d2)
    assert fingerprint({"w2": a, "b": np.zeros(2)}) != fingerprint(d1)
    assert fingerprint(d1, a) != fingerprint(a, d1)
    assert fingerprint({"m": d1}) != fingerprint(d1)
    with pytest.raises(ValueError, match="at least one"):
        fingerprint()


# --------------------------------------------------------------------------------------------
# Fixed-window evaluation
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n, context", [(101, 10), (102, 10), (105, 10), (11, 10), (2, 10),
                                        (1000, 7), (7, 1)])
def test_fixed_windows_predict_every_target_exactly_once(n, context):
    ids = np.arange(n) * 3  # distinct values, so positions can be read back from them
    windows = fixed_window_windows(ids, context)
    targets = np.concatenate([w[1:] for w in windows])
    np.testing.assert_array_equal(targets, ids[1:])  # each target once, in order
    for k, w in enumerate(windows):
        assert w[0] == ids[k * context]  # starts 0, context, 2 context, ...
        assert len(w) == context + 1 or (k == len(windows) - 1 and len(w) >= 2)
    assert len(windows) == math.ceil((n - 1) / context)


def test_fixed_windows_reject_bad_input():
    with pytest.raises(ValueError, match="at least 2 tokens"):
        fixed_window_windows(np.arange(1), 5)
    with pytest.raises(ValueError, match="context"):
        fixed_window_windows(np.arange(10), 0)


def _log_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def test_fixed_window_loss_equals_mean_over_all_targets():
    rng = np.random.default_rng(0)
    vocab, context = 7, 10
    ids = rng.integers(0, vocab, size=257)  # 25 full windows and one of 7 tokens
    table = rng.standard_normal((vocab, vocab))  # bigram logits
    pos_bias = rng.standard_normal((context, vocab))  # position in the window matters too
    calls = []

    def logits_fn(x):
        calls.append(x.shape)
        return table[x] + pos_bias[:x.shape[1]]  # (B, T, V)

    loss = fixed_window_loss(logits_fn, ids, context, batch=8)
    # independent reference: one window at a time, one target at a time, plain Python sums
    total, count = 0.0, 0
    for s in range(0, len(ids) - 1, context):
        for t in range(min(context, len(ids) - 1 - s)):
            logp = _log_softmax(table[ids[s + t]] + pos_bias[t])
            total -= logp[ids[s + t + 1]]
            count += 1
    assert count == len(ids) - 1
    assert math.isclose(loss, total / count, rel_tol=1e-12)
    assert calls == [(8, 10), (8, 10), (8, 10), (1, 10), (1, 6)]


def test_fixed_window_loss_of_a_uniform_model_is_log_vocab():
    ids = np.random.default_rng(1).integers(0, 13, size=50)
    loss = fixed_window_loss(lambda x: np.zeros(x.shape + (13,), dtype=np.float32), ids, 16)
    assert math.isclose(loss, math.log(13), rel_tol=1e-6)


def test_fixed_window_loss_rejects_wrong_logits_and_batch():
    ids = np.arange(30) % 5
    with pytest.raises(ValueError, match="logits_fn"):
        fixed_window_loss(lambda x: np.zeros((1, 2, 5)), ids, 10)
    with pytest.raises(ValueError, match="batch"):
        fixed_window_loss(lambda x: np.zeros(x.shape + (5,)), ids, 10, batch=0)


# --------------------------------------------------------------------------------------------
# The embedded corpus and its freezer
# --------------------------------------------------------------------------------------------

def test_embedded_corpus_is_the_library_reading_itself():
    text = load_corpus()
    assert len(text) >= 100_000
    assert "# file: numpy_transformer/optim.py\n" in text
    assert "def clip_grad_norm(" in text
    tok = CharTokenizer(text)
    assert tok.decode(tok.encode(text)) == text


def _freeze_module():
    path = Path(__file__).resolve().parents[1] / "tools" / "freeze_corpus.py"
    spec = importlib.util.spec_from_file_location("freeze_corpus", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_freeze_tool_concatenates_with_headers(tmp_path):
    freeze = _freeze_module()
    (tmp_path / "a.md").write_text("# Title\r\nline\r\n", encoding="utf-8")
    (tmp_path / "b.py").write_text("x = 1", encoding="utf-8")
    text = freeze.build_corpus([tmp_path / "a.md", tmp_path / "b.py"], root=tmp_path)
    assert text == "# file: a.md\n# Title\nline\n\n# file: b.py\nx = 1\n"
    files = [p.relative_to(freeze.ROOT).as_posix() for p in freeze.corpus_files()]
    assert "numpy_transformer/optim.py" in files and "tests/test_data.py" in files
    assert "numpy_transformer/runs/loop.py" in files  # a package named runs is not a run folder
    assert not any(f.startswith("numpy_transformer/data/") or "__pycache__" in f
                   for f in files)

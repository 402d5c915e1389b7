"""``train --tokenizer bpe --vocab-size N``: a byte-level BPE learned on the text, kept in the
run folder, used by ``sample``, ``eval`` and the exports."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from _run_helpers import TINY, one_line_error, resumed_to_equal_steps, run_cli, small_text

from numpy_transformer.checkpoint import load_checkpoint
from numpy_transformer.corpus import load_corpus
from numpy_transformer.generate import generate
from numpy_transformer.runs.folder import read_log
from numpy_transformer.runs.stored import load_run

pytest.importorskip("tokenizers")
from numpy_transformer.bpe import BPETokenizer, tokenizer_from_dict  # noqa: E402

GPT2 = ["--positions", "learned", "--norm", "layernorm", "--activation", "gelu_tanh",
        "--tie-embeddings", "--bias", "--no-embed-scale"]
BPE = ["--tokenizer", "bpe", "--vocab-size", "320"]


def _train(*argv) -> str:
    code, out, err = run_cli(["train", "--quiet", "--eval-every", "0", *argv])
    assert code == 0, err
    return out


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory):
    """A BPE run of GPT-2's shape, 30 steps on 6,000 characters of the corpus."""
    tmp = tmp_path_factory.mktemp("bpe")
    text = small_text(tmp)
    _train("--text", text, *TINY, *GPT2, *BPE, "--steps", "30", "--lr", "1e-2",
           "--out", tmp / "run")
    return tmp / "run", text


def test_the_tokenizer_round_trips_and_merges():
    text = load_corpus()[:20_000] + " ünïcödé ☃"
    tok = BPETokenizer.train(text, 400)
    ids = tok.encode(text)
    assert tok.decode(ids) == text and tok.vocab_size == 400
    assert len(ids) < 0.6 * len(text.encode("utf-8"))  # merged: fewer tokens than bytes
    assert tok.decode(tok.encode("never seen: ∮ 🙂")) == "never seen: ∮ 🙂"  # bytes cover all
    assert tok.missing("∮ 🙂") == []
    back = tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))
    assert np.array_equal(back.encode(text), ids)
    assert BPETokenizer.train(text, 400).to_dict() == tok.to_dict()  # deterministic
    with pytest.raises(ValueError, match="vocab_size must be an integer >= 257"):
        BPETokenizer.train(text, 256)
    with pytest.raises(ValueError, match="its dict says"):
        tokenizer_from_dict({**tok.to_dict(), "vocab_size": 401})


def test_a_bpe_run_keeps_its_tokenizer_and_samples_and_evaluates(bpe_run):
    run_dir, text = bpe_run
    ckpt = load_checkpoint(run_dir / "checkpoint.npz")
    assert (run_dir / "tokenizer.json").read_text(encoding="utf-8") == ckpt.tokenizer["bpe"]
    assert ckpt.config["vocab"] == ckpt.tokenizer["vocab_size"] == 320
    assert ckpt.options["tokenizer"] == "bpe" and ckpt.options["vocab_size"] == 320
    losses = [r["loss"] for r in read_log(run_dir) if "loss" in r]
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5
    code, out, err = run_cli(["sample", run_dir, "--prompt", "def ☃", "--length", "20"])
    assert code == 0 and out.startswith("def ☃"), err
    code, out, err = run_cli(["eval", run_dir, "--text", text])
    assert code == 0, err
    ids = load_run(run_dir).tokenizer.encode(text.read_text(encoding="utf-8"))
    assert f"{len(ids):,} tokens in" in out and "bits per token" in out
    assert "6,000 characters: " in out and "bits per character" in out


def test_a_bpe_run_resumes_and_extends_bit_for_bit(bpe_run, tmp_path):
    _, text = bpe_run
    _train("--text", text, *TINY, *BPE, "--steps", "3", "--out", tmp_path / "short")
    _train("--text", text, *TINY, *BPE, "--steps", "5", "--out", tmp_path / "long")
    mine, theirs = resumed_to_equal_steps(tmp_path / "short", tmp_path / "long", 5)
    assert mine.tokenizer == theirs.tokenizer


@pytest.mark.parametrize("argv,message", [
    (["--tokenizer", "bpe"], "--tokenizer bpe takes its size from --vocab-size N"),
    (["--vocab-size", "300"], "--tokenizer bpe takes its size from --vocab-size N"),
    (["--tokenizer", "bpe", "--vocab-size", "256"], "expected an integer >= 257"),
    (["--task", "sort", *BPE], "--vocab-size is for --task lm"),
])
def test_bad_tokenizer_options_are_refused_in_one_line(argv, message, tmp_path):
    code, _, err = run_cli(["train", *argv, "--out", tmp_path / "run", "--quiet"])
    assert code == 2 and one_line_error(err) and message in err, err
    assert not (tmp_path / "run").exists()


def test_without_the_tokenizers_package_bpe_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers -> ImportError
    code, _, err = run_cli(["train", *BPE, "--text", small_text(tmp_path), *TINY,
                            "--out", tmp_path / "run", "--quiet"])
    assert code == 2 and one_line_error(err), err
    assert "tokenizers package" in err and "pip install" in err and "[hf]" in err


def test_the_hf_export_writes_the_bpe_and_the_pipeline_continues_as_we_do(bpe_run, tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    run_dir, text = bpe_run
    code, _, err = run_cli(["export", run_dir, "--format", "hf", "--out", tmp_path / "hf"])
    assert code == 0, err
    pipe = transformers.pipeline("text-generation", model=str(tmp_path / "hf"))
    prompt = "def train"  # and 10 tokens: within the context of 16 the positions cover
    theirs = pipe(prompt, max_new_tokens=10, do_sample=False)[0]["generated_text"]
    run = load_run(run_dir)
    ids = generate(run.model, run.tokenizer.encode(prompt), 10, np.random.default_rng(0),
                   greedy=True)
    assert theirs == run.tokenizer.decode(ids)
    tokens = pipe.tokenizer(theirs)["input_ids"]
    assert len(tokens) < len(theirs)  # words and pieces of words, not characters
    assert np.array_equal(tokens, run.tokenizer.encode(theirs))
    # and back: a fine-tune starts from the exported folder, with its BPE, on any text
    strange = tmp_path / "strange.txt"
    strange.write_text(text.read_text(encoding="utf-8") + " ☃ ∮", encoding="utf-8")
    out = _train("--init-from", tmp_path / "hf", "--text", strange, "--steps", "2",
                 "--batch", "4", "--out", tmp_path / "ft")
    assert "tokenized by the tokenizer of the model it started from" in out
    assert "tokens, vocabulary 320" in out
    ft = load_checkpoint(tmp_path / "ft" / "checkpoint.npz")
    assert ft.options["tokenizer"] == "bpe" and ft.options["vocab_size"] == 320


def test_a_vocabulary_larger_than_the_text_can_make_is_not_asked_for(tmp_path):
    """--vocab-size 10**12 once aborted the interpreter (the trainer reserved 72 TB for the
    size it was asked). The trainer is now asked for no more entries than the text can make
    (each merge joins two of its bytes), in a subprocess: an abort cannot take pytest with it.
    Negative control: the tokenizers trainer asked for 10**12 itself aborts."""
    import subprocess

    from _subprocess_helpers import cli

    text = small_text(tmp_path)
    size = len(text.read_text(encoding="utf-8").encode("utf-8"))
    code, out, err = cli("train", "--text", text, *TINY, "--backend", "numpy", "--steps", "1",
                         "--tokenizer", "bpe", "--vocab-size", 10**12, "--quiet",
                         "--out", tmp_path / "run")
    assert code == 0, err
    vocab = load_checkpoint(tmp_path / "run" / "checkpoint.npz").config["vocab"]
    assert 256 < vocab <= 256 + size
    raw = ("import tokenizers as tk\n"
           "t = tk.Tokenizer(tk.models.BPE())\n"
           "t.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)\n"
           "t.train_from_iterator(['abc abd'], tk.trainers.BpeTrainer(vocab_size=10**12))\n")
    aborted = subprocess.run([sys.executable, "-c", raw], capture_output=True, timeout=120)
    assert aborted.returncode != 0, "the trainer took 10**12 without reserving it"

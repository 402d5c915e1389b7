"""Checkpoints: exact round trip, no pickle, atomic writes, and one clear line per bad file."""

from __future__ import annotations

import json
import os
import zipfile

import numpy as np
import pytest
from _run_helpers import TINY_FIELDS, small_text

from numpy_transformer import checkpoint as ck
from numpy_transformer.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from numpy_transformer.nn import DecoderLM, EncoderDecoder, TransformerConfig
from numpy_transformer.runs.options import resolve_options
from numpy_transformer.runs.state import Run
from numpy_transformer.runs.stored import read_run, rebuild_run
from numpy_transformer.train import Batch


@pytest.fixture
def run(tmp_path):
    """A tiny LM run with dropout (so its generators matter) after three updates."""
    fields, options = resolve_options("lm", dict(TINY_FIELDS, text=small_text(tmp_path),
                                                 dropout=0.1, steps=10))
    r = Run(fields, options)
    for i in range(3):
        r.trainer.step(r.batch(i))
    return r


def test_round_trip_is_bit_exact(run, tmp_path):
    path = tmp_path / "c.npz"
    run.save(path)
    c = load_checkpoint(path)
    assert c.step == 3 and c.optimizer["t"] == 3 and c.optimizer["kind"] == "Adam"
    for name, p, _ in run.model.named_parameters():
        assert c.params[name].dtype == p.dtype == np.float32
        assert c.params[name].tobytes() == p.tobytes(), name
        assert c.adam_m[name].tobytes() == run.optimizer.m[name].tobytes(), name
        assert c.adam_v[name].tobytes() == run.optimizer.v[name].tobytes(), name
    assert c.rng == ck.rng_states(run.generators())
    assert c.tokenizer == run.tokenizer.to_dict()
    assert c.config["width"] == 16 and c.options["steps"] == 10


def test_every_generator_is_saved(run, tmp_path):
    """The embedding dropout and two per block: each with its own state, plus the sampler."""
    names = set(run.generators())
    assert names == {"dropout.decoder.embed.drop", "dropout.decoder.blocks.0.drop1",
                     "dropout.decoder.blocks.0.drop2", "sample"}
    model = EncoderDecoder(TransformerConfig(vocab=5, width=8, heads=2, layers=2, ffn_width=8,
                                             max_len=4, dropout=0.1))
    assert len(ck.dropout_layers(model)) == 2 + 2 * 2 + 2 * 3  # embeds, enc blocks, dec blocks


def test_restoring_generators_replays_the_same_draws(run):
    states = ck.rng_states(run.generators())
    before = {n: g.random(4) for n, g in run.generators().items()}
    ck.set_rng_states(run.generators(), json.loads(json.dumps(states)))  # through JSON
    after = {n: g.random(4) for n, g in run.generators().items()}
    for n in before:
        np.testing.assert_array_equal(before[n], after[n])
    with pytest.raises(CheckpointError, match="missing"):
        ck.set_rng_states(run.generators(), {})


def test_file_holds_no_pickle_and_is_read_without_it(run, tmp_path):
    path = tmp_path / "c.npz"
    run.save(path)
    with np.load(path, allow_pickle=False) as npz:  # would raise on an object array
        assert all(npz[k].dtype != object for k in npz.files)
    evil = tmp_path / "evil.npz"
    np.savez(evil, format_version=np.array(1), step=np.array(0),
             optimizer=np.array([{"code": "x"}], dtype=object))
    with pytest.raises(CheckpointError, match="unreadable|pickle"):
        load_checkpoint(evil)


def test_write_is_atomic_and_leaves_no_temporary_file(run, tmp_path, monkeypatch):
    path = tmp_path / "c.npz"
    run.save(path)
    good = path.read_bytes()
    fsyncs = []
    monkeypatch.setattr(os, "fsync", lambda fd: fsyncs.append(fd))
    run.trainer.step(run.batch(3))
    run.save(path)
    assert len(fsyncs) == 2  # the file, then its folder
    assert path.read_bytes() != good
    good = path.read_bytes()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", crash)
    with pytest.raises(OSError, match="disk full"):
        run.save(path)
    assert path.read_bytes() == good  # the old checkpoint, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npz", "small.txt"]


def _rewrite(src, dst, drop=(), replace=None):
    """Copy checkpoint ``src`` to ``dst`` without the keys ``drop``, with ``replace`` applied."""
    with np.load(src, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files if k not in drop}
    arrays.update(replace or {})
    np.savez(dst, **arrays)


def _bad_files(run, tmp_path):
    good = tmp_path / "good.npz"
    run.save(good)
    cases = {}
    p = tmp_path / "text.npz"
    p.write_text("this is a text file\n")
    cases["text file renamed"] = (p, "not an .npz")
    p = tmp_path / "truncated.npz"
    p.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    cases["truncated"] = (p, "not an .npz|truncated|unreadable")
    p = tmp_path / "foreign.npz"
    np.savez(p, weights=np.zeros(3))
    cases["zip without our keys"] = (p, "not a numpy_transformer checkpoint")
    p = tmp_path / "plainzip.npz"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("hello.txt", "hi")
    cases["plain zip"] = (p, "not a numpy_transformer checkpoint")
    p = tmp_path / "version.npz"
    _rewrite(good, p, replace={"format_version": np.array(99)})
    cases["future version"] = (p, "format version 99")
    p = tmp_path / "norng.npz"
    _rewrite(good, p, drop=("rng",))
    cases["missing entry"] = (p, "missing entries \\['rng'\\]")
    p = tmp_path / "badjson.npz"
    _rewrite(good, p, replace={"config": np.array("{not json")})
    cases["bad json"] = (p, "'config' is not valid JSON")
    name = next(n for n, *_ in run.model.named_parameters() if n.endswith("wq"))
    p = tmp_path / "moment.npz"
    _rewrite(good, p, replace={"adam_m." + name: np.zeros(3, np.float32)})
    cases["misshapen moment"] = (p, f"adam_m.{name} is float32 \\(3,\\)")
    p = tmp_path / "nomoment.npz"
    _rewrite(good, p, drop=("adam_v." + name,))
    cases["missing moment"] = (p, "moments do not match")
    cases["no file"] = (tmp_path / "nothing.npz", "no such checkpoint")
    return cases


CASES = ["text file renamed", "truncated", "zip without our keys", "plain zip",
         "future version", "missing entry", "bad json", "misshapen moment", "missing moment",
         "no file"]


@pytest.mark.parametrize("case", CASES)
def test_bad_file_gives_one_line_naming_the_problem(run, tmp_path, case):
    path, pattern = _bad_files(run, tmp_path)[case]
    with pytest.raises(CheckpointError, match=pattern) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message


def test_weights_that_do_not_fit_the_config_are_refused(run, tmp_path):
    good, bad = tmp_path / "good.npz", tmp_path / "bad.npz"
    run.save(good)
    name = next(n for n, *_ in run.model.named_parameters() if n.endswith("wq"))
    _rewrite(good, bad, drop=("adam_m." + name, "adam_v." + name),
             replace={"param." + name: np.zeros((8, 8), np.float32),
                      "adam_m." + name: np.zeros((8, 8), np.float32),
                      "adam_v." + name: np.zeros((8, 8), np.float32)})
    load_checkpoint(bad)  # consistent in itself ...
    with pytest.raises(CheckpointError, match="do not match the model") as info:
        rebuild_run(read_run(bad))  # ... but not with the model its config describes
    assert "\n" not in str(info.value)
    config = dict(load_checkpoint(good).config, width=24)
    other = tmp_path / "other.npz"
    _rewrite(good, other, replace={"config": np.array(json.dumps(config))})
    with pytest.raises(CheckpointError, match="does not match the model|do not match"):
        rebuild_run(read_run(other))
    assert rebuild_run(read_run(good)).trainer.step_count == 3


def test_save_checkpoint_takes_any_model(tmp_path):
    """The low-level writer is not tied to a Run: a model and an optimizer are enough."""
    from numpy_transformer.optim import AdamW
    from numpy_transformer.train import Trainer

    model = DecoderLM(TransformerConfig(vocab=7, width=8, heads=2, layers=1, ffn_width=8,
                                        max_len=5))
    opt = AdamW(lr=1e-2)
    x = np.arange(10).reshape(2, 5) % 7
    Trainer(model, opt, lambda s: 1e-2).step(Batch((x,), x))
    save_checkpoint(tmp_path / "m.npz", step=1, model=model, optimizer=opt, rng={},
                    config={}, options={}, tokenizer=None)
    c = load_checkpoint(tmp_path / "m.npz")
    assert c.optimizer["kind"] == "AdamW" and c.tokenizer is None
    assert set(c.params) == {n for n, *_ in model.named_parameters()}

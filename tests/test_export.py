"""safetensors files and Hugging Face refusals, without torch: weights, optimiser state,
metadata, the RoPE row order, the ``export`` command, and the one-line install hints."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from _run_helpers import TINY, one_line_error, run_cli, small_text

safetensors_numpy = pytest.importorskip("safetensors.numpy",
                                        reason="the exchange format needs safetensors")

from numpy_transformer import cli, interop  # noqa: E402
from numpy_transformer.data import CharTokenizer  # noqa: E402
from numpy_transformer.export import (  # noqa: E402
    export_run,
    hf_family,
    load_optimizer,
    load_safetensors,
    optimizer_of,
    rope_half_order,
    save_optimizer,
    save_safetensors,
)
from numpy_transformer.functional import rope_forward, rope_tables  # noqa: E402
from numpy_transformer.nn import (  # noqa: E402
    DecoderLM,
    EncoderClassifier,
    EncoderDecoder,
    TransformerConfig,
)
from numpy_transformer.optim import Adam, AdamW  # noqa: E402
from numpy_transformer.runs.stored import model_from_checkpoint  # noqa: E402

V, B, T = 11, 2, 6


def config(**overrides) -> TransformerConfig:
    fields = dict(vocab=V, width=8, heads=2, layers=2, ffn_width=12, max_len=8, num_classes=3,
                  backend="numpy")
    return TransformerConfig(**{**fields, **overrides})


def tokens(seed=0, t=T):
    return np.random.default_rng(seed).integers(0, V, (B, t))


def run_model(model):
    if isinstance(model, EncoderDecoder):
        return model(tokens(1, 5), tokens())
    return model(tokens())


# ----------------------------------------------------------------------------- weights
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("cls, opts", [
    (DecoderLM, dict(tie_embeddings=True, positions="learned")),
    (DecoderLM, dict(bias=False, positions="rope", activation="swiglu", norm="rmsnorm")),
    (EncoderClassifier, dict(norm_first=False)),
    (EncoderDecoder, dict(positions="alibi")),
])
def test_weights_round_trip(tmp_path, cls, opts, dtype):
    model = cls(config(dtype=dtype, seed=3, **opts))
    tok = CharTokenizer("abcdefghijk", replacement="a")
    path = tmp_path / "model.safetensors"
    save_safetensors(path, model, tok, info={"step": 7})
    stored = safetensors_numpy.load_file(str(path))
    expected = interop.to_torch_state_dict(model)  # the twin's names and layouts
    assert list(stored) == sorted(expected) and all(
        np.array_equal(stored[k], expected[k]) and stored[k].dtype == dtype for k in expected)
    back = load_safetensors(path, backend="numpy")
    assert type(back.model) is cls and back.model.config == model.config
    assert back.info == {"step": 7} and back.tokenizer.to_dict() == tok.to_dict()
    np.testing.assert_array_equal(run_model(back.model), run_model(model))


def test_file_without_tokenizer_and_another_backend(tmp_path):
    model = DecoderLM(config())
    save_safetensors(tmp_path / "m.safetensors", model)
    back = load_safetensors(tmp_path / "m.safetensors", backend="numba")
    assert back.tokenizer is None and back.info == {} and back.model.config.backend == "numba"


def test_bad_files(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        load_safetensors(tmp_path / "missing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{junk}")
    with pytest.raises(ValueError, match="junk.safetensors: not a safetensors file"):
        load_safetensors(tmp_path / "junk.safetensors")
    foreign = tmp_path / "foreign.safetensors"
    safetensors_numpy.save_file({"w": np.zeros(3)}, str(foreign))
    with pytest.raises(ValueError, match="not a numpy_transformer weights file"):
        load_safetensors(foreign)
    with pytest.raises(ValueError, match="not a numpy_transformer optimiser file"):
        load_optimizer(foreign, DecoderLM(config()))
    # our metadata over weights that do not fit the config
    path = tmp_path / "m.safetensors"
    save_safetensors(path, DecoderLM(config()))
    meta = {"format": "numpy_transformer", "model": "DecoderLM",
            "config": json.dumps({**json.loads(_metadata(path)["config"]), "width": 10})}
    safetensors_numpy.save_file(safetensors_numpy.load_file(str(path)), str(path), meta)
    with pytest.raises(ValueError, match="m.safetensors: holds 1,267 weights, but the DecoderLM "
                                         "of its config has 1,735"):
        load_safetensors(path)
    with pytest.raises(ValueError, match="takes a whole model"):
        save_safetensors(path, DecoderLM(config()).decoder)


def _metadata(path):
    from safetensors import safe_open

    with safe_open(str(path), framework="np") as f:
        return f.metadata()


# ----------------------------------------------------------------------------- optimiser
def _train(model, opt, steps, seed):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        model.zero_grad()
        logits = model(tokens(int(rng.integers(1000))))
        model.backward(rng.standard_normal(logits.shape) / logits.size)
        opt.step({n: p for n, p, _ in model.named_parameters()},
                 {n: g for n, _, g in model.named_parameters()})


@pytest.mark.parametrize("kind", [Adam, AdamW])
def test_optimizer_round_trip_continues_the_run(tmp_path, kind):
    """Saved after 3 steps and loaded into a copy of the model, the optimiser's next 2 updates
    are the original's, bit for bit; the decay rule (matrices only) survives as a set."""
    model = DecoderLM(config(positions="rope"))
    opt = kind(lr=1e-2, betas=(0.8, 0.99), eps=1e-7, weight_decay=0.1, backend="numpy")
    _train(model, opt, 3, seed=0)
    save_optimizer(tmp_path / "opt.safetensors", opt, model)
    copy = DecoderLM(config(positions="rope"))
    copy.load_state_dict(model.state_dict())
    back = load_optimizer(tmp_path / "opt.safetensors", copy, backend="numpy")
    assert type(back) is kind and back.t == 3 and back.betas == (0.8, 0.99)
    assert back.decay == {n for n, p, _ in model.named_parameters() if p.ndim >= 2}
    _train(model, opt, 2, seed=1)
    _train(copy, back, 2, seed=1)
    for (name, p, _), (_, q, _) in zip(model.named_parameters(), copy.named_parameters(),
                                       strict=True):
        np.testing.assert_array_equal(q, p, err_msg=name)


def test_fresh_optimizer_round_trip(tmp_path):
    model = DecoderLM(config())
    save_optimizer(tmp_path / "opt.safetensors", Adam(lr=3e-4, backend="numpy"), model)
    back = load_optimizer(tmp_path / "opt.safetensors", model)
    assert back.t == 0 and back.m == {} and back.lr == 3e-4


# ----------------------------------------------------------------------------- Hugging Face
def test_a_config_of_neither_family_is_refused_in_one_line():
    model = DecoderLM(config(positions="sinusoidal", activation="relu", embed_scale=True))
    with pytest.raises(ValueError) as info:
        hf_family(model)
    message = str(info.value)
    assert "\n" not in message
    assert "GPT-2 needs positions='learned' (has 'sinusoidal')" in message
    assert "embed_scale=False (has True)" in message
    assert "tie_embeddings=True (has False)" in message
    assert "LLaMA needs positions='rope'" in message and "bias=False (has True)" in message
    assert "norm_first" not in message  # pre-LN: fits both
    with pytest.raises(ValueError, match="takes a DecoderLM, got EncoderClassifier"):
        hf_family(EncoderClassifier(config()))
    assert hf_family(DecoderLM(config(positions="learned", activation="gelu_tanh",
                                      tie_embeddings=True))) == "gpt2"
    assert hf_family(DecoderLM(config(positions="rope", activation="swiglu", norm="rmsnorm",
                                      bias=False))) == "llama"


def test_rope_half_order_turns_interleaved_pairs_into_halves():
    """Rotating pairs (2i, 2i+1) then reordering the features equals reordering then rotating
    (i, i + D/2) as LLaMA in transformers does; the attention scores are unchanged."""
    h, d, t = 2, 6, 5
    order = rope_half_order(h, d)
    assert sorted(order) == list(range(h * d))
    np.testing.assert_array_equal(order[:d], [0, 2, 4, 1, 3, 5])
    np.testing.assert_array_equal(order[d:], d + order[:d])
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 1, h, t, d))
    cos, sin = rope_tables(t, d)
    within = order[:d]

    def rotate_half(x):  # LLaMA's: x * cos + rotate_half(x) * sin, angles repeated twice
        c, s = np.concatenate([cos, cos], -1), np.concatenate([sin, sin], -1)
        return x * c + np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1) * s

    for x in (q, k):
        np.testing.assert_allclose(rope_forward(x, cos, sin)[..., within],
                                   rotate_half(x[..., within]), rtol=1e-13, atol=1e-13)
    scores = rope_forward(q, cos, sin) @ rope_forward(k, cos, sin).swapaxes(-1, -2)
    theirs = rotate_half(q[..., within]) @ rotate_half(k[..., within]).swapaxes(-1, -2)
    np.testing.assert_allclose(theirs, scores, rtol=1e-12, atol=1e-12)
    # negative control: without the reordering, the two rotations differ
    assert np.abs(rope_forward(q, cos, sin) - rotate_half(q)).max() > 0.1


# ----------------------------------------------------------------------------- the command
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    code, _, err = run_cli(["train", *TINY, "--text", small_text(tmp), "--steps", "4",
                            "--eval-every", "0", "--save-every", "0", "--optimizer", "adamw",
                            "--weight-decay", "0.05", "--out", tmp / "run", "--quiet"])
    assert code == 0, err
    return tmp / "run"


def test_export_command_writes_what_the_checkpoint_holds(tiny_run, tmp_path):
    code, out, err = run_cli(["export", tiny_run, "--out", tmp_path / "st"])
    assert code == 0, err
    assert "model.safetensors" in out and "optimizer.safetensors" in out
    model, tokenizer, ckpt = model_from_checkpoint(tiny_run / "checkpoint.npz")
    back = load_safetensors(tmp_path / "st" / "model.safetensors")
    assert back.info == {"step": ckpt.step, "options": ckpt.options}
    assert back.tokenizer.to_dict() == tokenizer.to_dict()
    ids = tokenizer.encode("def f(x):")[None]
    np.testing.assert_array_equal(back.model(ids), model(ids))
    opt = load_optimizer(tmp_path / "st" / "optimizer.safetensors", back.model)
    original = optimizer_of(ckpt)
    assert type(opt) is type(original) is AdamW and opt.t == original.t == ckpt.step
    for name in original.m:
        np.testing.assert_array_equal(opt.m[name], original.m[name], err_msg=name)
        np.testing.assert_array_equal(opt.v[name], original.v[name], err_msg=name)
    # the default folder is RUN_DIR/FORMAT
    code, _, err = run_cli(["export", tiny_run])
    assert code == 0, err
    assert (tiny_run / "safetensors" / "model.safetensors").is_file()


def test_export_command_refuses_in_one_line(tiny_run, tmp_path):
    code, _, err = run_cli(["export", tiny_run, "--format", "hf", "--out", tmp_path / "hf"])
    assert code == 2 and one_line_error(err), err
    assert "fits no Hugging Face family" in err and "embed_scale=False (has True)" in err
    assert not (tmp_path / "hf").exists()
    code, _, err = run_cli(["export", tmp_path / "nothing"])
    assert code == 2 and one_line_error(err), err
    code, _, err = run_cli(["export", tiny_run, "--format", "onnx"])
    assert code == 2 and one_line_error(err), err


def test_export_never_replaces_a_file_it_did_not_write(tiny_run, tmp_path):
    for fmt, name in (("safetensors", "model.safetensors"), ("hf", "config.json")):
        theirs = tmp_path / fmt
        theirs.mkdir()
        (theirs / name).write_bytes(b"another model's file")
        code, _, err = run_cli(["export", tiny_run, "--format", fmt, "--out", theirs])
        assert code == 2 and one_line_error(err) and name in err and "--force" in err, err
        assert (theirs / name).read_bytes() == b"another model's file"
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left
        if fmt == "safetensors":
            code, out, err = run_cli(["export", tiny_run, "--out", theirs, "--force"])
            assert code == 0, err
            assert load_safetensors(theirs / name).info["step"] == 4


@pytest.mark.parametrize("out, message", [("", "--out ''"), ("file", "a file, not a folder")])
def test_export_refuses_an_out_that_is_no_folder(tiny_run, tmp_path, out, message):
    if out:
        out = tmp_path / out
        out.write_text("mine")
    code, _, err = run_cli(["export", tiny_run, "--out", out])
    assert code == 2 and one_line_error(err) and message in err, err


def test_import_of_an_export_is_the_run_it_came_from(tiny_run, tmp_path):
    """export then import: the run folder that comes back holds the same weights bit for bit,
    at step 0 with the run's text; sample and train --resume take it. A folder that is no
    export, and a text with characters the model's vocabulary lacks, are refused in one
    line."""
    assert run_cli(["export", tiny_run, "--out", tmp_path / "st"])[0] == 0
    text = small_text(tiny_run.parent)
    code, out, err = run_cli(["import", tmp_path / "st", "--out", tmp_path / "back", "--text",
                              text])
    assert code == 0 and "numpy-transformer sample" in out, err
    original, _, _ = model_from_checkpoint(tiny_run / "checkpoint.npz")
    back, _, ckpt = model_from_checkpoint(tmp_path / "back")
    assert ckpt.step == 0 and not ckpt.meta["finished"]
    weights = dict(back.state_dict())
    for name, a in original.state_dict().items():
        np.testing.assert_array_equal(weights.pop(name), a, err_msg=name)
    assert not weights
    assert run_cli(["sample", tmp_path / "back", "--length", "4"])[0] == 0
    assert run_cli(["train", "--resume", tmp_path / "back", "--steps", "2", "--quiet"])[0] == 0
    other = tmp_path / "other.txt"
    other.write_text("xyz \u2603" * 200)  # a snowman: no character of the model's
    for argv, message in ((["import", tmp_path / "st", "--out", tmp_path / "x", "--text", other],
                           "1 character(s) outside the tokenizer's vocabulary"),
                          (["import", tmp_path / "nothing", "--out", tmp_path / "y"],
                           "no such file or folder"),
                          (["import", tmp_path, "--out", tmp_path / "y"],
                           "neither a run folder"),
                          (["import", tmp_path / "st", "--out", tmp_path / "back", "--text",
                            text], "or pass --force")):
        code, _, err = run_cli(argv)
        assert code == 2 and one_line_error(err) and message in err, err


def test_export_help_has_an_example(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["export", "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert "examples:" in text and "numpy-transformer export runs/char-lm" in text


def test_export_run_rejects_an_unknown_format(tmp_path):
    with pytest.raises(ValueError, match="format must be one of"):
        export_run(tmp_path, "onnx", DecoderLM(config()), None)


# ----------------------------------------------------------------------------- without them
@pytest.mark.parametrize("blocked, code, hint", [
    ("torch", "from numpy_transformer.torch_twins import to_torch",
     'numpy_transformer.torch_twins needs PyTorch, which is not installed: '
     'pip install "numpy_transformer[torch]"'),
    ("safetensors", "from numpy_transformer.export import save_safetensors\n"
                    "from numpy_transformer.nn import DecoderLM, TransformerConfig\n"
                    "cfg = TransformerConfig(5, 4, 1, 1, 4, 4, backend='numpy')\n"
                    "save_safetensors('x', DecoderLM(cfg))",
     'the safetensors export needs the safetensors package, which is not installed: '
     'pip install "numpy_transformer[hf]"'),
])
def test_a_missing_optional_package_is_one_line(blocked, code, hint):
    """Importing the packages works without torch or safetensors; using them says what to
    install, in one line."""
    block = f"import sys; sys.modules[{blocked!r}] = None\n"
    ok = subprocess.run([sys.executable, "-c", block + "import numpy_transformer.torch_twins, "
                         "numpy_transformer.export"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    failed = subprocess.run([sys.executable, "-c", block + code], capture_output=True,
                            text=True)
    assert failed.returncode == 1
    assert failed.stderr.strip().splitlines()[-1] == f"ImportError: {hint}"

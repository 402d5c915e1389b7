"""Hugging Face export: ours, the twin and the ``transformers`` model compute the same logits,
for GPT-2's and LLaMA's shapes, with every detail that could differ checked by a negative
control (RoPE's pairing, the norm epsilons, the GELU variant, the tied head); the tokenizer
and ``pipeline``; a model changed in ``transformers`` comes back."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the Hugging Face checks need PyTorch")
transformers = pytest.importorskip("transformers", reason="the Hugging Face checks need "
                                   "transformers")
pytest.importorskip("safetensors", reason="the Hugging Face export needs safetensors")

from numpy_transformer.data import CharTokenizer  # noqa: E402
from numpy_transformer.export import load_hf, save_hf, to_hf_state  # noqa: E402
from numpy_transformer.generate import generate  # noqa: E402
from numpy_transformer.nn import DecoderLM, TransformerConfig  # noqa: E402
from numpy_transformer.torch_twins import to_torch  # noqa: E402

TEXT = "def add(x, y):\n    return x + y\n"
TOKENIZER = CharTokenizer(TEXT)
SHAPES = {
    "gpt2": dict(positions="learned", activation="gelu_tanh", tie_embeddings=True),
    "llama": dict(positions="rope", norm="rmsnorm", activation="swiglu", bias=False,
                  tie_embeddings=True),
    "llama-untied": dict(positions="rope", norm="rmsnorm", activation="swiglu", bias=False,
                         tie_embeddings=False),
    # grouped-query attention: 4 query heads read 2 kv heads (num_key_value_heads=2)
    "llama-gqa": dict(positions="rope", norm="rmsnorm", activation="swiglu", bias=False,
                      tie_embeddings=False, heads=4, kv_heads=2),
}
CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM",
           "llama-untied": "LlamaForCausalLM", "llama-gqa": "LlamaForCausalLM"}


def make_model(shape: str, dtype: str = "float32", scale: float = 1.0) -> DecoderLM:
    """A 2-layer model of the shape, gains and shifts moved off their init; ``scale`` shrinks
    the embeddings so that the norms' epsilon dominates their variance."""
    cfg = TransformerConfig(**{**dict(vocab=TOKENIZER.vocab_size, width=16, heads=2, layers=2,
                                      ffn_width=24, max_len=24, dtype=dtype, backend="numpy",
                                      seed=5), **SHAPES[shape]})
    model = DecoderLM(cfg)
    r = np.random.default_rng(0)
    for name, p, _ in model.named_parameters():
        if p.ndim == 1:
            p += p.dtype.type(0.3) * r.standard_normal(p.shape).astype(p.dtype)
        if "embed" in name:
            p *= p.dtype.type(scale)
    return model


def tokens():
    return TOKENIZER.encode(TEXT[:20])[None].repeat(2, 0)


def hf_logits(directory, ids, **config_changes) -> np.ndarray:
    if config_changes:
        path = directory / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config_changes}))
    model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    with torch.no_grad():
        return model(torch.from_numpy(ids)).logits.numpy()


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("float64", 1e-12)])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("scale", [1.0, 1e-4], ids=["unit", "tiny-activations"])
def test_ours_the_twin_and_transformers_agree(tmp_path, shape, dtype, tol, scale):
    """float64 as well where transformers computes in it: LlamaRMSNorm normalises in float32,
    so a float64 LLaMA agrees to float32 precision there. With tiny embeddings (variance
    about 1e-10) the norms' output is set by the epsilon: a wrong one would show."""
    if dtype == "float64" and shape.startswith("llama"):
        tol = 1e-6
    model = make_model(shape, dtype, scale)
    assert save_hf(tmp_path, model, TOKENIZER) == shape.split("-")[0]
    ids = tokens()
    ours = model(ids)
    with torch.no_grad():
        twin = to_torch(model)(torch.from_numpy(ids)).numpy()
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(hf_model).__name__ == CLASSES[shape]
    assert next(hf_model.parameters()).dtype == getattr(torch, dtype)
    with torch.no_grad():
        theirs = hf_model(torch.from_numpy(ids)).logits.numpy()
    assert rel(twin, ours) <= tol, ("twin", rel(twin, ours))
    assert rel(theirs, ours) <= tol, ("transformers", rel(theirs, ours))


@pytest.mark.parametrize("shape, dtype, tol, scale, change", [
    # exact GELU instead of the tanh one: about 1e-4 apart, far beyond float64's agreement
    ("gpt2", "float64", 1e-12, 1.0, dict(activation_function="gelu")),
    ("gpt2", "float32", 1e-5, 1e-4, dict(layer_norm_epsilon=1e-6)),
    ("llama", "float32", 1e-5, 1e-4, dict(rms_norm_eps=1e-6)),
])
def test_negative_controls_the_config_details_matter(tmp_path, shape, dtype, tol, scale,
                                                     change):
    """Each detail the export writes moves the logits by at least a hundred times the
    tolerance when set otherwise, so the agreement above is evidence that it is right (tiny
    embeddings make the epsilons visible)."""
    model = make_model(shape, dtype, scale)
    save_hf(tmp_path, model, TOKENIZER)
    ids = tokens()
    assert rel(hf_logits(tmp_path, ids), model(ids)) <= tol
    assert rel(hf_logits(tmp_path, ids, **change), model(ids)) > 100 * tol


def test_negative_control_rope_rows_unpermuted(tmp_path):
    """LLaMA's q and k rows are written in "rotate half" order; in our interleaved order the
    logits differ."""
    model = make_model("llama")
    save_hf(tmp_path, model, TOKENIZER)
    from safetensors.numpy import load_file, save_file

    state = load_file(str(tmp_path / "model.safetensors"))
    params = {n: p for n, p, _ in model.named_parameters()}
    q = state["model.layers.0.self_attn.q_proj.weight"]
    assert not np.array_equal(q, params["decoder.blocks.0.attn.wq"].T)  # permuted rows
    assert sorted(map(tuple, q)) == sorted(map(tuple, params["decoder.blocks.0.attn.wq"].T))
    for i in range(2):
        for p in "qk":
            state[f"model.layers.{i}.self_attn.{p}_proj.weight"] = np.ascontiguousarray(
                params[f"decoder.blocks.{i}.attn.w{p}"].T)
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    assert rel(hf_logits(tmp_path, tokens()), model(tokens())) > 1e-3


@pytest.mark.parametrize("shape", ["gpt2", "llama"])
def test_the_tied_head_is_the_token_table(tmp_path, shape):
    model = make_model(shape)
    assert model.config.tie_embeddings
    save_hf(tmp_path, model, TOKENIZER)
    assert "lm_head.weight" not in to_hf_state(model, shape)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert hf_model.get_output_embeddings().weight is hf_model.get_input_embeddings().weight


@pytest.mark.parametrize("shape", ["gpt2", "llama"])
def test_pipeline_generates_our_greedy_text(tmp_path, shape):
    model = make_model(shape)
    save_hf(tmp_path, model, TOKENIZER)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    prompt = "def add"
    assert tok(prompt)["input_ids"] == TOKENIZER.encode(prompt).tolist()
    assert tok.decode(TOKENIZER.encode(TEXT)) == TEXT  # newlines and spaces survive
    generator = transformers.pipeline("text-generation", model=str(tmp_path))
    text = generator(prompt, max_new_tokens=12, do_sample=False)[0]["generated_text"]
    ours = TOKENIZER.decode(generate(model, TOKENIZER.encode(prompt), 12, None, greedy=True))
    assert text == ours and len(text) == len(prompt) + 12


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_model_trained_in_transformers_comes_back(tmp_path, shape):
    model = make_model(shape)
    save_hf(tmp_path / "export", model, TOKENIZER)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "export")
    opt = torch.optim.AdamW(hf_model.parameters(), lr=1e-2)
    ids = torch.from_numpy(tokens())
    for _ in range(2):  # fine-tune in transformers
        opt.zero_grad()
        hf_model(ids, labels=ids).loss.backward()
        opt.step()
    hf_model.save_pretrained(tmp_path / "tuned")
    back = load_hf(tmp_path / "export", backend="numpy")  # the tokenizer lives here
    tuned = load_hf(tmp_path / "tuned", backend="numpy")
    assert back.tokenizer.to_dict() == TOKENIZER.to_dict() and tuned.tokenizer is None
    np.testing.assert_array_equal(back.model(tokens()), model(tokens()))
    with torch.no_grad():
        theirs = hf_model.eval()(ids).logits.numpy()
    assert rel(tuned.model(tokens()), theirs) <= 1e-5
    assert rel(model(tokens()), theirs) > 1e-3  # it did change


@pytest.mark.parametrize("shape, change", [("gpt2", dict(layer_norm_epsilon=1e-6)),
                                           ("llama", dict(rms_norm_eps=1e-6))])
def test_a_checkpoint_with_an_epsilon_of_its_own_imports_with_it(tmp_path, shape, change):
    """LLaMA's usual 1e-6 (and a GPT-2 given one): the import takes the checkpoint's epsilon
    into ``norm_eps`` and gives transformers' logits; tiny embeddings make the epsilon set the
    norms' output, so keeping ours instead would be 100 times the tolerance off (the
    negative control)."""
    model = make_model(shape, "float32", scale=1e-4)
    save_hf(tmp_path, model, TOKENIZER)
    assert load_hf(tmp_path, backend="numpy").model.config.norm_eps is None  # our default
    theirs = hf_logits(tmp_path, tokens(), **change)
    back = load_hf(tmp_path, backend="numpy").model
    assert back.config.norm_eps == 1e-6 and not back.training
    assert all(m.eps == 1e-6 for _, m in back.named_modules() if hasattr(m, "eps"))
    assert rel(back(tokens()), theirs) <= 1e-5
    assert rel(model(tokens()), theirs) > 1e-3


def test_import_refuses_what_we_do_not_have(tmp_path):
    model = make_model("llama")
    save_hf(tmp_path, model, TOKENIZER)
    path = tmp_path / "config.json"
    original = json.loads(path.read_text())
    for change, message in (
            (dict(num_key_value_heads=3), "kv_heads=3 does not divide heads=2"),
            (dict(hidden_act="gelu"), "hidden_act='gelu' (ours: 'silu')"),
            (dict(rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}),
             "rope_parameters=")):
        path.write_text(json.dumps({**original, **change}))
        with pytest.raises(ValueError, match="^" + str(tmp_path)) as info:
            load_hf(tmp_path)
        assert message in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ValueError, match="not a Hugging Face model directory"):
        load_hf(tmp_path / "nothing")


# The command-line flags of each family: the road out without writing Python
CLI_FLAGS = {"gpt2": ["--positions", "learned", "--activation", "gelu_tanh",
                      "--tie-embeddings", "--no-embed-scale"],
             "llama": ["--positions", "rope", "--norm", "rmsnorm", "--activation", "swiglu",
                       "--no-bias", "--no-embed-scale"]}
CLI_FLAGS["llama-gqa"] = [*CLI_FLAGS["llama"], "--heads", "4", "--kv-heads", "2"]
KV_HEADS = {"gpt2": None, "llama": 2, "llama-gqa": 2}  # num_key_value_heads written


@pytest.mark.parametrize("shape", list(CLI_FLAGS))
def test_a_command_line_run_exports_to_transformers(tmp_path, shape, capsys):
    from numpy_transformer import cli
    from numpy_transformer.runs.stored import model_from_checkpoint

    text = tmp_path / "text.txt"
    text.write_text(TEXT * 40, encoding="utf-8")
    run = tmp_path / "run"
    assert cli.main(["train", "--width", "16", "--heads", "2", "--layers", "1", "--ffn-width",
                     "24", "--context", "16", "--batch", "4", "--steps", "3", *CLI_FLAGS[shape],
                     "--text", str(text), "--out", str(run), "--quiet"]) == 0
    assert cli.main(["export", str(run), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert written.get("num_key_value_heads") == KV_HEADS[shape]
    ours, tokenizer, _ = model_from_checkpoint(run / "checkpoint.npz")
    ids = tokenizer.encode(TEXT[:12])[None]
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert type(theirs).__name__ == CLASSES[shape]
    assert rel(hf_logits(tmp_path / "hf", ids), ours.forward(ids)) < 1e-5


def test_a_command_line_run_of_neither_shape_is_refused(tmp_path, capsys):
    from numpy_transformer import cli

    text = tmp_path / "text.txt"
    text.write_text(TEXT * 40, encoding="utf-8")
    run = tmp_path / "run"
    assert cli.main(["train", *CLI_FLAGS["llama"][:-2], "--width", "16", "--heads", "2",
                     "--layers", "1", "--ffn-width", "24", "--context", "16", "--batch", "4",
                     "--steps", "2", "--text", str(text), "--out", str(run), "--quiet"]) == 0
    capsys.readouterr()
    assert cli.main(["export", str(run), "--format", "hf", "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert "bias=False (has True)" in err and "embed_scale=False (has True)" in err, err
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("shape", list(CLI_FLAGS))
def test_the_round_trip_through_transformers_at_the_command_line(tmp_path, shape, capsys):
    """train, export --format hf, fine-tune in transformers, import, and the run folder that
    comes back computes transformers' logits; sample, export and train --resume take it, and
    the weights it resumes from are the fine-tuned ones."""
    import shutil

    from numpy_transformer import cli, load_run

    text = tmp_path / "text.txt"
    text.write_text(TEXT * 40, encoding="utf-8")
    run, hf_dir, tuned = tmp_path / "run", tmp_path / "hf", tmp_path / "tuned"
    assert cli.main(["train", "--width", "16", "--heads", "2", "--layers", "1", "--ffn-width",
                     "24", "--context", "16", "--batch", "4", "--steps", "3", *CLI_FLAGS[shape],
                     "--text", str(text), "--out", str(run), "--quiet"]) == 0
    assert cli.main(["export", str(run), "--format", "hf", "--out", str(hf_dir)]) == 0
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir)
    ids = torch.from_numpy(load_run(run).tokenizer.encode(TEXT[:16])[None])  # one window
    opt = torch.optim.AdamW(hf_model.parameters(), lr=1e-2)
    for _ in range(2):  # fine-tune in transformers
        opt.zero_grad()
        hf_model(ids, labels=ids).loss.backward()
        opt.step()
    hf_model.save_pretrained(tuned)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hf_dir / name, tuned / name)
    capsys.readouterr()
    assert cli.main(["import", str(tuned), "--out", str(tmp_path / "back"), "--text",
                     str(text)]) == 0, capsys.readouterr().err
    back = load_run(tmp_path / "back")
    assert back.config.kv_heads == (2 if shape == "llama-gqa" else None)  # grouped-query back
    with torch.no_grad():
        theirs = hf_model.eval()(ids).logits.numpy()
    assert rel(back.model(ids.numpy()), theirs) <= 1e-5
    assert rel(load_run(run).model(ids.numpy()), theirs) > 1e-3  # it was tuned
    for argv in (["sample", str(tmp_path / "back"), "--length", "5"],
                 ["export", str(tmp_path / "back"), "--format", "hf"],
                 ["train", "--resume", str(tmp_path / "back"), "--steps", "2", "--quiet"]):
        assert cli.main(argv) == 0, (argv, capsys.readouterr().err)
    # refusals, one line each: a text whose characters are not the model's, no tokenizer
    (tuned / "tokenizer.json").unlink()
    for argv, message in (
            (["import", str(hf_dir), "--out", str(tmp_path / "x")],
             "the embedded corpus has 83 character(s) outside the tokenizer's vocabulary"),
            (["import", str(tuned), "--out", str(tmp_path / "y"), "--text", str(text)],
             "without a tokenizer")):
        capsys.readouterr()
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err

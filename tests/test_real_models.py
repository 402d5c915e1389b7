"""Real models as Hugging Face ships them: a GPT-2 with its stock dropouts and a LLaMA with
grouped-query attention and an untied head padded past its tokenizer's ids, each made here by
``transformers`` and ``tokenizers`` at test size (nothing is downloaded), with a byte-level BPE
learned in the test.

Each goes through what a user does with one: its logits and tokens against ``transformers``'
(a tokenizer whose ids were shuffled is the negative control), ``import``, ``sample``,
``eval``, ``train --resume``, ``train --init-from`` at a shorter context,
``examples/study_gradient.py``, and a finite-difference check of the imported model's gradient
on a few coordinates. Every bad folder gets one line and exit 2, and leaves no run folder.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _run_helpers import one_line_error, run_cli

torch = pytest.importorskip("torch", reason="making a transformers model needs PyTorch")
transformers = pytest.importorskip("transformers", reason="the real models need transformers")
tokenizers = pytest.importorskip("tokenizers", reason="a byte-level BPE needs tokenizers")
pytest.importorskip("safetensors", reason="the weights are a safetensors file")

from numpy_transformer.bpe import tokenizer_from_dict  # noqa: E402
from numpy_transformer.checkpoint import load_checkpoint  # noqa: E402
from numpy_transformer.corpus import load_corpus  # noqa: E402
from numpy_transformer.data import CharTokenizer  # noqa: E402
from numpy_transformer.export import load_hf, save_hf  # noqa: E402
from numpy_transformer.functional import cross_entropy_backward, cross_entropy_forward  # noqa: E402
from numpy_transformer.gradcheck import numeric_grad  # noqa: E402
from numpy_transformer.nn import DecoderLM, TransformerConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEXT = load_corpus()[:40_000]
# Logits in float32 agree within this many units of the largest one's last place: rounding
# alone, summed over two layers of width 32, stays below a few hundred float32 epsilons.
LOGIT_BOUND = 256 * float(np.finfo(np.float32).eps)


def learned_bpe(vocab: int = 360):
    """GPT-2's scheme: byte-level pre-tokenizer and decoder, ``<|endoftext|>`` id 0."""
    tk = tokenizers
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    tok.train_from_iterator([TEXT], tk.trainers.BpeTrainer(
        vocab_size=vocab, initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"], show_progress=False))
    return tok


def gpt2(vocab: int):
    """Stock GPT-2 but for the sizes: dropouts 0.1 (resid, embd, attn), LayerNorm 1e-5, tied."""
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=4, n_positions=64, vocab_size=vocab, bos_token_id=0,
        eos_token_id=0))


def llama(vocab: int):
    """Stock LLaMA but for the sizes: 4 query heads reading 2 kv heads, an untied head with 8
    rows more than the tokenizer has ids (a vocabulary padded to a multiple)."""
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, vocab_size=vocab + 8,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0))


MODELS = {"gpt2": gpt2, "llama": llama}


def save_folder(folder: Path, model, tok) -> Path:
    model.save_pretrained(folder)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=list(MODELS))
def hf_folder(request, tmp_path_factory) -> Path:
    """The family's folder as ``save_pretrained`` writes it, and ``text.txt`` beside it."""
    root = tmp_path_factory.mktemp(request.param)
    torch.manual_seed(0)
    tok = learned_bpe()
    (root / "text.txt").write_text(TEXT, encoding="utf-8")
    return save_folder(root / "model", MODELS[request.param](tok.get_vocab_size()), tok)


def logits_agree(mine: np.ndarray, theirs: np.ndarray) -> bool:
    return bool(np.abs(mine - theirs).max() <= LOGIT_BOUND * np.abs(theirs).max())


def their_logits(folder: Path, text: str) -> tuple[np.ndarray, np.ndarray]:
    """``transformers``' own tokens of ``text`` (64 at most) and its logits for them."""
    ids = transformers.AutoTokenizer.from_pretrained(folder)(
        text, add_special_tokens=False)["input_ids"][:64]
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return np.array(ids), model(torch.tensor([ids])).logits.numpy()


def test_tokens_and_logits_agree_with_transformers(hf_folder):
    text = TEXT[1000:1400]
    ids, theirs = their_logits(hf_folder, text)
    ours = load_hf(hf_folder)
    mine_ids = ours.tokenizer.encode(text)
    assert mine_ids[:64].tolist() == ids.tolist()  # the same ids: the folder's own tokenizer
    assert ours.tokenizer.decode(mine_ids) == text
    assert logits_agree(ours.model.forward(mine_ids[None, :64]), theirs)


def test_negative_control_a_tokenizer_with_shuffled_ids_fails_the_comparison(hf_folder,
                                                                            tmp_path):
    shuffled = tmp_path / "shuffled"
    shutil.copytree(hf_folder, shuffled)
    spec = json.loads((shuffled / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]  # token -> id; the merges name tokens, not ids
    order = np.random.default_rng(0).permutation(len(vocab))
    spec["model"]["vocab"] = {token: int(order[i]) for token, i in vocab.items()}
    spec["added_tokens"] = []  # <|endoftext|> takes whatever id its token now has
    (shuffled / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    text = TEXT[1000:1400]
    _, theirs = their_logits(hf_folder, text)
    ours = load_hf(shuffled)
    assert not logits_agree(ours.model.forward(ours.tokenizer.encode(text)[None, :64]), theirs)


def test_every_command_takes_the_folder(hf_folder, tmp_path):
    text, run = hf_folder.parent / "text.txt", tmp_path / "run"
    code, out, err = run_cli(["import", hf_folder, "--out", run, "--text", text])
    assert code == 0, err
    ckpt = load_checkpoint(run / "checkpoint.npz")
    assert ckpt.step == 0 and ckpt.options["tokenizer"] == "bpe"
    kept = tokenizer_from_dict(ckpt.tokenizer).encode(TEXT[:500])  # ids unchanged
    assert kept.tolist() == load_hf(hf_folder).tokenizer.encode(TEXT[:500]).tolist()
    if hf_folder.parent.name.startswith("gpt2"):  # GPT-2's dropouts come along
        assert ckpt.config["dropout"] == ckpt.config["attn_dropout"] == pytest.approx(0.1)
    for source in (run, hf_folder):  # a run folder, or the transformers folder itself
        code, out, err = run_cli(["sample", source, "--prompt", "def f", "--length", "8"])
        assert code == 0 and out.startswith("def f"), err
    code, out, err = run_cli(["eval", run])
    assert code == 0 and f"the held-out 10% of {text}" in out, err
    code, out, err = run_cli(["eval", hf_folder, "--text", text])
    assert code == 0 and "bits per character" in out, err
    code, _, err = run_cli(["eval", hf_folder])
    assert code == 2 and one_line_error(err) and "--text" in err
    code, out, err = run_cli(["train", "--resume", run, "--steps", "2", "--quiet"])
    assert code == 0 and "tokenized by the tokenizer of the model it started from" in out, err
    assert load_checkpoint(run / "checkpoint.npz").step == 2
    short = tmp_path / "short"
    code, _, err = run_cli(["train", "--init-from", hf_folder, "--context", "16", "--steps", "2",
                            "--batch", "2", "--text", text, "--out", short, "--quiet"])
    assert code == 0, err
    started = load_checkpoint(short / "checkpoint.npz")
    assert started.config["max_len"] == 16
    source = load_hf(hf_folder).model.state_dict()
    positions = "decoder.embed.positions.table"
    if positions in source:  # learned positions keep their first rows (after 2 steps: near)
        np.testing.assert_allclose(started.params[positions], source[positions][:16], atol=0.05)
    done = subprocess.run([sys.executable, ROOT / "examples" / "study_gradient.py", run,
                           "--batch", "2", "--context", "16"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and "(ok)" in done.stdout, done.stderr[-2000:]


def test_the_imported_models_gradient_by_finite_differences(hf_folder):
    """A few coordinates of the tensors a reader would look at, in float64 on the NumPy
    references, without dropout (the gradient of a deterministic function)."""
    stored = load_hf(hf_folder).model
    config = dataclasses.replace(stored.config, backend="numpy", dtype="float64", dropout=0.0,
                                 attn_dropout=0.0)
    model = DecoderLM(config)
    model.load_state_dict(stored.state_dict())
    ids = load_hf(hf_folder).tokenizer.encode(TEXT[:200])[:17]
    x, y = ids[None, :-1], ids[None, 1:]

    def loss() -> float:
        return cross_entropy_forward(model.forward(x), y)[0]

    model.zero_grad()
    _, cache = cross_entropy_forward(model.forward(x), y)
    model.backward(cross_entropy_backward(1.0, cache))
    params = {name: (p, g) for name, p, g in model.named_parameters()}
    rng = np.random.default_rng(0)
    h = 1e-6
    # central differences in float64 err by about eps |L| / h from rounding (the truncation,
    # h^2 times a third derivative, is far below it): the bound, ten times over; a wrong
    # gradient errs by the gradient's own size
    noise = 10 * np.finfo(np.float64).eps * abs(loss()) / h
    for name in ("decoder.blocks.0.attn.wq", "decoder.blocks.1.attn.wk",
                 "decoder.blocks.1.ffn.up.w", "decoder.final_norm.w"):
        p, g = params[name]
        entries = rng.choice(p.size, 4, replace=False)
        numeric = numeric_grad(loss, p, h=h, entries=entries)
        analytic = g.reshape(-1)[entries]
        assert np.abs(numeric - analytic).max() <= noise + 1e-6 * np.abs(analytic).max(), name
        assert np.abs(analytic).max() > 100 * noise, name  # the check can tell them apart


def _refused(argv: list, message: str, out: Path) -> None:
    code, _, err = run_cli(argv)
    assert code == 2 and one_line_error(err) and message in err, err
    assert not out.exists()  # no half-written run folder


def test_bad_folders_are_refused_in_one_line(hf_folder, tmp_path):
    out = tmp_path / "run"
    broken = tmp_path / "broken"

    def variant(edit_config=None, tokenizer=None) -> Path:
        shutil.rmtree(broken, ignore_errors=True)
        shutil.copytree(hf_folder, broken)
        if edit_config:
            path = broken / "config.json"
            path.write_text(json.dumps({**json.loads(path.read_text()), **edit_config}))
        if tokenizer is not None:
            (broken / "tokenizer.json").write_text(tokenizer.to_str(), encoding="utf-8")
        return broken

    _refused(["import", variant({"model_type": "bert"}), "--out", out], "bert", out)
    ffn = "n_inner" if "gpt2" in hf_folder.parent.name else "intermediate_size"
    _refused(["import", variant({ffn: 48}), "--out", out], "misshapen", out)  # config vs weights
    _refused(["import", variant(tokenizer=learned_bpe(600)), "--out", out],
             "more than the model's", out)
    word_piece = tokenizers.Tokenizer(tokenizers.models.WordPiece({"[UNK]": 0, "a": 1},
                                                                   unk_token="[UNK]"))
    _refused(["import", variant(tokenizer=word_piece), "--out", out],
             "not byte-level BPE or characters", out)
    if "gpt2" in hf_folder.parent.name:  # learned positions: 64 rows
        _refused(["import", hf_folder, "--out", out, "--context", "65"],
                 "longer than its learned position table of 64 rows", out)


def test_a_text_a_character_model_cannot_encode_is_refused(tmp_path):
    """The other kind of tokenizer a folder may hold: characters (``export --format hf`` of a
    character run). Its run must be able to encode the text it trains on."""
    tok = CharTokenizer("abc def\n")
    config = TransformerConfig(vocab=tok.vocab_size, width=16, heads=2, layers=1, ffn_width=32,
                               max_len=16, positions="learned", activation="gelu_tanh",
                               tie_embeddings=True, embed_scale=False, dropout=0.1)
    save_hf(tmp_path / "chars", DecoderLM(config), tok)
    snowmen = tmp_path / "snow.txt"
    snowmen.write_text("abc \u2603 def\n" * 300, encoding="utf-8")
    _refused(["import", tmp_path / "chars", "--out", tmp_path / "run", "--text", snowmen],
             "1 character(s) outside the tokenizer's vocabulary", tmp_path / "run")
    fine = tmp_path / "fine.txt"
    fine.write_text("abc def\n" * 300, encoding="utf-8")
    code, _, err = run_cli(["import", tmp_path / "chars", "--out", tmp_path / "run", "--text",
                            fine])
    assert code == 0, err

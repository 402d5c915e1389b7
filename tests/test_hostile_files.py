"""The safetensors readers given crafted files: a ``ValueError`` naming the file and the
problem, never a foreign exception, never an allocation the file does not back.

Each case takes a good file written by ``save_safetensors`` / ``save_optimizer`` and breaks
one thing; the good file itself loads (the control).
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

safetensors_numpy = pytest.importorskip("safetensors.numpy",
                                        reason="needs safetensors (the hf extra)")

from numpy_transformer.data import CharTokenizer  # noqa: E402
from numpy_transformer.export import (  # noqa: E402
    load_optimizer,
    load_safetensors,
    save_optimizer,
    save_safetensors,
)
from numpy_transformer.nn import DecoderLM, TransformerConfig  # noqa: E402
from numpy_transformer.optim import Adam  # noqa: E402

V = 7
TOKENIZER = CharTokenizer("abcdefg")


def _model() -> DecoderLM:
    return DecoderLM(TransformerConfig(vocab=V, width=8, heads=2, layers=1, ffn_width=12,
                                       max_len=8, backend="numpy"))


def _read(path):
    from safetensors import safe_open

    with safe_open(str(path), framework="np") as f:
        return safetensors_numpy.load_file(str(path)), f.metadata()


def _rewrite(path, tensors=None, **meta):
    """The file at ``path`` again, with some tensors or metadata entries replaced."""
    old_tensors, old_meta = _read(path)
    safetensors_numpy.save_file({**old_tensors, **(tensors or {})}, str(path),
                                metadata={**old_meta, **meta})


@pytest.fixture
def weights(tmp_path):
    path = tmp_path / "model.safetensors"
    save_safetensors(path, _model(), TOKENIZER)
    assert load_safetensors(path).model.config.vocab == V  # the control: a good file loads
    return path


def _raw(path, header_length: int, header: bytes, data: bytes = b"") -> None:
    path.write_bytes(struct.pack("<Q", header_length) + header + data)


@pytest.mark.parametrize("case", ["length past the end", "length of a terabyte", "not JSON",
                                  "offsets past the end", "empty"])
def test_a_broken_header_is_refused_naming_the_file(case, tmp_path):
    path = tmp_path / "x.safetensors"
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    if case == "length past the end":
        _raw(path, 10_000, header, bytes(16))
    elif case == "length of a terabyte":
        _raw(path, 2**40, header, bytes(16))
    elif case == "not JSON":
        _raw(path, 6, b"{junk}")
    elif case == "offsets past the end":
        _raw(path, len(header), header, bytes(8))  # 8 of the 16 bytes it declares
    else:
        path.write_bytes(b"")
    with pytest.raises(ValueError, match="x.safetensors: not a safetensors file"):
        load_safetensors(path)


@pytest.mark.parametrize("entry, value, message", [
    ("config", "{not json", "metadata entry 'config' is not valid JSON"),
    ("config", "[" * 100_000 + "]" * 100_000, "metadata entry 'config' is not valid JSON"),
    ("config", "[1, 2]", "metadata entry 'config' must be a JSON object, got list"),
    ("config", json.dumps({"vocab": V}), "missing"),
    ("tokenizer", "\"abc\"", "metadata entry 'tokenizer' must be a JSON object, got str"),
    ("tokenizer", json.dumps({"chars": "abc", "replacement": None}),
     "the tokenizer has 3 characters, the model's vocabulary 7"),
    ("info", "7", "metadata entry 'info' must be a JSON object, got int"),
])
def test_bad_metadata_is_refused(weights, entry, value, message):
    _rewrite(weights, **{entry: value})
    with pytest.raises(ValueError, match=f"model.safetensors: .*{message}"):
        load_safetensors(weights)


def test_a_config_the_file_cannot_back_is_refused_before_the_model_is_built(weights):
    # a few kilobytes whose config asks for a million layers: refused from the header's sizes
    config = json.loads(_read(weights)[1]["config"])
    _rewrite(weights, config=json.dumps({**config, "layers": 10**6}))
    with pytest.raises(ValueError, match="holds .* weights, but the DecoderLM of its config "
                                         "has|cannot fit"):
        load_safetensors(weights)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_weights_are_refused_naming_the_tensor(weights, bad):
    tensors, _ = _read(weights)
    name = sorted(tensors)[0]
    broken = tensors[name].copy()
    broken.flat[1] = bad
    _rewrite(weights, {name: broken})
    with pytest.raises(ValueError, match=f"tensor {name} holds NaN or infinite values"):
        load_safetensors(weights)


def test_bfloat16_weights_are_refused_in_one_line(weights):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    tensors, meta = _read(weights)
    save_file({k: torch.from_numpy(a).to(torch.bfloat16) for k, a in tensors.items()},
              str(weights), metadata=meta)
    with pytest.raises(ValueError, match="bfloat16 weights; .* convert them first"):
        load_safetensors(weights)


@pytest.fixture
def moments(tmp_path):
    model, opt = _model(), Adam(lr=1e-2, backend="numpy")
    params = {n: p for n, p, _ in model.named_parameters()}
    opt.step(params, {n: np.full_like(p, 0.1) for n, p in params.items()})
    path = tmp_path / "optimizer.safetensors"
    save_optimizer(path, opt, model)
    assert load_optimizer(path, model, backend="numpy").t == 1  # the control
    return path, model


@pytest.mark.parametrize("case", ["negative", "nan"])
def test_bad_moments_are_refused(moments, case):
    path, model = moments
    tensors, _ = _read(path)
    name = next(k for k in sorted(tensors) if k.startswith("exp_avg_sq."))
    broken = tensors[name].copy()
    broken.flat[0] = -1.0 if case == "negative" else np.nan
    _rewrite(path, {name: broken})
    message = "second moments below zero" if case == "negative" else "holds NaN"
    with pytest.raises(ValueError, match=f"optimizer.safetensors: .*{message}"):
        load_optimizer(path, model, backend="numpy")


@pytest.mark.parametrize("entry, value", [("decayed", "{}"), ("decayed", "[7]"), ("t", "x"),
                                          ("lr", "[]")])
def test_bad_optimiser_metadata_is_refused(moments, entry, value):
    path, model = moments
    _rewrite(path, **{entry: value})
    with pytest.raises(ValueError, match="optimizer.safetensors: "):
        load_optimizer(path, model, backend="numpy")


@pytest.fixture
def hf_dir(tmp_path):
    pytest.importorskip("transformers")
    from numpy_transformer.export import save_hf

    gpt = DecoderLM(TransformerConfig(vocab=V, width=8, heads=2, layers=1, ffn_width=12,
                                      max_len=8, positions="learned", activation="gelu_tanh",
                                      tie_embeddings=True, backend="numpy"))
    save_hf(tmp_path / "gpt", gpt, TOKENIZER)
    return tmp_path / "gpt"


def test_an_imported_model_is_in_eval_mode(hf_dir):
    from numpy_transformer.export import load_hf

    model = load_hf(hf_dir, backend="numpy").model
    assert not model.training and not any(m.training for _, m in model.named_modules())


@pytest.mark.parametrize("case", ["not JSON", "a million layers", "bfloat16"])
def test_a_hostile_hf_directory_is_refused_naming_it(hf_dir, case):
    from numpy_transformer.export import load_hf

    config = hf_dir / "config.json"
    if case == "not JSON":
        config.write_text("{not json", encoding="utf-8")
        message = "config.json: not a transformers config"
    elif case == "a million layers":
        config.write_text(json.dumps({**json.loads(config.read_text()), "n_layer": 10**6}))
        message = "holds .* numbers, fewer than the .* weights|cannot fit"
    else:
        torch = pytest.importorskip("torch")
        from safetensors.torch import save_file

        weights = hf_dir / "model.safetensors"
        tensors, meta = _read(weights)
        save_file({k: torch.from_numpy(a).to(torch.bfloat16) for k, a in tensors.items()},
                  str(weights), metadata=meta)
        message = "bfloat16 weights"
    with pytest.raises(ValueError, match=message):
        load_hf(hf_dir, backend="numpy")

"""The safetensors readers given crafted files: a ``ValueError`` naming the file and the
problem, never a foreign exception, never an allocation the file does not back.

Each case takes a good file written by ``save_safetensors`` / ``save_optimizer`` and breaks
one thing; the good file itself loads (the control).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

safetensors_numpy = pytest.importorskip("safetensors.numpy",
                                        reason="needs safetensors (the hf extra)")

from numpy_transformer import interop  # noqa: E402
from numpy_transformer.data import CharTokenizer  # noqa: E402
from numpy_transformer.export import (  # noqa: E402
    load_optimizer,
    load_safetensors,
    save_optimizer,
    save_safetensors,
)
from numpy_transformer.nn import DecoderLM, TransformerConfig  # noqa: E402
from numpy_transformer.optim import Adam  # noqa: E402

# a long fault suite (hypothesis over hostile files): pytest -m slow (CI runs it too)
pytestmark = pytest.mark.slow

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
                                         "has|cannot fit|is too large"):
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


def test_half_precision_weights_are_read_as_float32(weights):
    """bfloat16 (as LLaMA checkpoints often are) and float16 come in as float32, each value
    exactly the one the half-precision number stands for (torch's own conversion); a file
    mixing float32 and float64 is still refused."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    tensors, meta = _read(weights)
    for half in (torch.bfloat16, torch.float16):
        stored = {k: torch.from_numpy(a).to(half) for k, a in tensors.items()}
        save_file(stored, str(weights), metadata=meta)
        model = load_safetensors(weights).model
        assert model.config.dtype == "float32"
        back = interop.to_torch_state_dict(model)
        for name, t in stored.items():
            np.testing.assert_array_equal(back[name], t.float().numpy(), err_msg=name)
    mixed = {k: a.astype(np.float32 if i == 0 else np.float64) for i, (k, a) in
             enumerate(tensors.items())}
    safetensors_numpy.save_file(mixed, str(weights), metadata=meta)
    with pytest.raises(ValueError, match=r"half precision .* got \['F32', 'F64'\]"):
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


HF_CONFIG_CASES = {  # entries of a GPT-2 config.json, and what the refusal says
    "a foreign model_type": ({"model_type": "bert"}, "model_type 'bert' is neither"),
    "zero heads": ({"n_head": 0}, "heads must be a positive integer, got 0"),
    "heads as a string": ({"n_head": "2"}, "not a transformers config .*expected int"),
    "a list for a width": ({"n_embd": [8]}, "not a transformers config .*expected int"),
    "a negative vocabulary": ({"vocab_size": -5}, "vocab must be a positive integer"),
}


@pytest.mark.parametrize("case", [*HF_CONFIG_CASES, "no config.json", "no weights"])
def test_an_hf_config_of_the_wrong_kind_is_refused_in_one_line(hf_dir, case):
    from numpy_transformer.export import load_hf

    config = hf_dir / "config.json"
    if case in HF_CONFIG_CASES:
        entries, message = HF_CONFIG_CASES[case]
        config.write_text(json.dumps({**json.loads(config.read_text()), **entries}))
    else:
        (config if case == "no config.json" else hf_dir / "model.safetensors").unlink()
        message = "not a Hugging Face model directory with config.json and model.safetensors"
    with pytest.raises(ValueError, match=message) as refused:
        load_hf(hf_dir, backend="numpy")
    assert str(hf_dir) in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("case", ["not JSON", "a million layers", "integers"])
def test_a_hostile_hf_directory_is_refused_naming_it(hf_dir, case):
    from numpy_transformer.export import load_hf

    config = hf_dir / "config.json"
    if case == "not JSON":
        config.write_text("{not json", encoding="utf-8")
        message = "config.json: not a transformers config"
    elif case == "a million layers":
        config.write_text(json.dumps({**json.loads(config.read_text()), "n_layer": 10**6}))
        message = "holds .* numbers, fewer than the .* weights|cannot fit|is too large"
    else:  # weights that are no floats at all
        weights = hf_dir / "model.safetensors"
        tensors, meta = _read(weights)
        safetensors_numpy.save_file({k: a.astype(np.int32) for k, a in tensors.items()},
                                    str(weights), metadata=meta)
        message = r"must be all float32 or half precision .* got \['I32'\]"
    with pytest.raises(ValueError, match=message):
        load_hf(hf_dir, backend="numpy")


# ------------------------------------------------------------------ any mutation of a file
def _good_files(folder) -> dict[str, bytes]:
    """The bytes of a good weights file, a good optimiser file and a good HF config."""
    model, opt = _model(), Adam(lr=1e-2, backend="numpy")
    params = {n: p for n, p, _ in model.named_parameters()}
    opt.step(params, {n: np.full_like(p, 0.1) for n, p in params.items()})
    save_safetensors(folder / "model.safetensors", model, TOKENIZER)
    save_optimizer(folder / "optimizer.safetensors", opt, model)
    return {name: (folder / name).read_bytes()
            for name in ("model.safetensors", "optimizer.safetensors")}


@st.composite
def mutations(draw, size: int, header: int):
    """Up to four edits of a file of ``size`` bytes whose header ends at ``header``: bytes
    overwritten (in the header half the time), a cut, or bytes inserted."""
    edits = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["overwrite", "overwrite", "cut", "insert"]))
        where = draw(st.one_of(st.integers(0, header - 1), st.integers(0, size - 1)))
        edits.append((kind, where, draw(st.binary(min_size=1, max_size=8))))
    return edits


def _mutated(data: bytes, edits) -> bytes:
    for kind, where, chunk in edits:
        where = min(where, len(data))
        if kind == "overwrite":
            data = data[:where] + chunk + data[where + len(chunk):]
        elif kind == "cut":
            data = data[:where]
        else:
            data = data[:where] + chunk + data[where:]
    return data


@pytest.fixture(scope="module")
def good_files(tmp_path_factory):
    return _good_files(tmp_path_factory.mktemp("good"))


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), which=st.sampled_from(["model.safetensors", "optimizer.safetensors"]))
def test_any_mutation_loads_whole_and_finite_or_is_refused_naming_the_file(good_files,
                                                                          tmp_path, data,
                                                                          which):
    """Byte by byte: whatever the edit, the reader returns a model (or optimiser) whose every
    number is finite and fits, or raises ValueError naming the file; never another exception,
    never a MemoryError."""
    good = good_files[which]
    header = 8 + struct.unpack("<Q", good[:8])[0]
    path = tmp_path / which
    path.write_bytes(_mutated(good, data.draw(mutations(len(good), header))))
    _loads_finite_or_is_refused(path, which)


def _loads_finite_or_is_refused(path, which: str) -> None:
    try:
        if which == "model.safetensors":
            model = load_safetensors(path, backend="numpy").model
            arrays = [p for _, p, _ in model.named_parameters()]
        else:
            opt = load_optimizer(path, _model(), backend="numpy")
            arrays = [*opt.m.values(), *opt.v.values()]
            assert all((v >= 0).all() for v in opt.v.values())
    except ValueError as e:
        assert str(path) in str(e) or which in str(e), e
        return
    assert arrays and all(np.isfinite(a).all() for a in arrays)


def test_the_mutation_property_catches_a_foreign_exception_and_a_nan(good_files, tmp_path,
                                                                      monkeypatch):
    """Negative controls of the property's check: a reader that raises KeyError for a broken
    file, or returns a NaN weight, fails it."""
    path = tmp_path / "model.safetensors"
    path.write_bytes(good_files["model.safetensors"])
    _loads_finite_or_is_refused(path, "model.safetensors")  # the good file passes
    real = load_safetensors

    def nan_weights(path, backend=None):
        loaded = real(path, backend)
        next(iter(loaded.model.named_parameters()))[1][...] = np.nan
        return loaded

    for broken, error in ((lambda *a, **k: {}["a reader's bug"], KeyError),
                          (nan_weights, AssertionError)):
        monkeypatch.setitem(globals(), "load_safetensors", broken)
        with pytest.raises(error):
            _loads_finite_or_is_refused(path, "model.safetensors")
    assert _mutated(b"abcdef", [("overwrite", 1, b"XY"), ("cut", 5, b"?"),
                                ("insert", 0, b"!")]) == b"!aXYde"


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_mutation_of_an_hf_config_loads_or_is_refused(hf_dir, tmp_path, data):
    """The same for the ``config.json`` of a Hugging Face folder, mutated byte by byte (each
    example in a fresh copy of the folder)."""
    import shutil
    import tempfile

    from numpy_transformer.export import load_hf

    with tempfile.TemporaryDirectory(dir=tmp_path) as tmp:
        folder = Path(shutil.copytree(hf_dir, Path(tmp) / "hf"))
        good = (hf_dir / "config.json").read_bytes()
        config = folder / "config.json"
        config.write_bytes(_mutated(good, data.draw(mutations(len(good), len(good)))))
        try:
            model = load_hf(folder, backend="numpy").model
        except ValueError as e:
            assert str(folder) in str(e), e
            return
        assert all(np.isfinite(p).all() for _, p, _ in model.named_parameters())

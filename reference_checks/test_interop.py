"""Weight exchange: export, import, and the twin computing our logits from our weights."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from numpy_transformer import interop, nn  # noqa: E402
from numpy_transformer import torch_twins as twins  # noqa: E402
from reference_checks.compare import assert_close  # noqa: E402
from reference_checks.test_modules import VARIANTS, model_inputs  # noqa: E402

FAMILIES = ["EncoderClassifier", "DecoderLM", "EncoderDecoder"]


def make(family, variant, dtype="float64", seed=1):
    opts = {"heads": 2, **VARIANTS[variant]}
    if family == "EncoderClassifier":
        opts.pop("tie_embeddings", None)
        opts["num_classes"] = 4
    cfg = nn.TransformerConfig(vocab=13, width=8, layers=2, ffn_width=12, max_len=9,
                               dtype=dtype, seed=seed, **opts)
    return getattr(nn, family)(cfg)


def torch_inputs(args, kwargs):
    return [torch.from_numpy(a) for a in args], {k: torch.from_numpy(v) for k, v in kwargs.items()}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_gives_identical_logits(family, variant):
    source, fresh = make(family, variant, seed=1), make(family, variant, seed=2)
    args, kwargs = model_inputs(family)
    state = interop.to_torch_state_dict(source)
    interop.from_torch_state_dict(fresh, state)
    np.testing.assert_array_equal(fresh(*args, **kwargs), source(*args, **kwargs))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("family", FAMILIES)
def test_export_into_twin_gives_our_logits(family, variant, dtype):
    model = make(family, variant, dtype)
    state = interop.to_torch_state_dict(model)
    twin = twins.build_twin(model).to(twins.TORCH_DTYPES[np.dtype(dtype)])
    assert list(state) == list(twin.state_dict()), "names or order differ from the twin's"
    twin.load_state_dict({k: torch.from_numpy(a) for k, a in state.items()}, strict=True)
    args, kwargs = model_inputs(family)
    targs, tkwargs = torch_inputs(args, kwargs)
    with torch.no_grad():
        theirs = twin(*targs, **tkwargs).numpy()
    assert_close("interop", f"{family} {variant} logits", model(*args, **kwargs), theirs, dtype)


@pytest.mark.parametrize("family", FAMILIES)
def test_import_torch_tensors_after_torch_training(family):
    """Train the twin one step in torch, import its tensors: ours computes the twin's logits."""
    model = make(family, "preLN-rmsnorm-swiglu-rope-tied-scaled" if family != "EncoderClassifier"
                 else "postLN-rmsnorm-relu-learned")
    twin = twins.to_torch(model)
    args, kwargs = model_inputs(family)
    targs, tkwargs = torch_inputs(args, kwargs)
    opt = torch.optim.AdamW(twin.parameters(), lr=1e-2)
    twin(*targs, **tkwargs).square().mean().backward()
    opt.step()
    interop.from_torch_state_dict(model, twin.state_dict())  # torch tensors, not arrays
    with torch.no_grad():
        theirs = twin(*targs, **tkwargs).numpy()
    assert_close("interop", f"{family} after a torch step", model(*args, **kwargs), theirs,
                 np.float64)


def test_names_follow_the_documented_table():
    model = make("EncoderDecoder", "postLN-rmsnorm-relu-learned")
    names = interop.torch_names(model)
    assert names["decoder.blocks.0.cross_attn.wq"] == ("decoder.blocks.0.cross_attn.q_proj.weight",
                                                       True)
    assert names["decoder.blocks.0.cross_attn.bo"] == ("decoder.blocks.0.cross_attn.out_proj.bias",
                                                       False)
    assert names["encoder.embed.tokens.table"] == ("encoder.embed.tokens.weight", False)
    assert names["encoder.embed.positions.table"] == ("encoder.embed.positions.weight", False)
    assert names["head.w"] == ("head.weight", True)
    state = interop.to_torch_state_dict(model)
    assert state["head.weight"].shape == (13, 8)  # (V, C): torch's (out, in)
    assert state["head.weight"].flags.c_contiguous


def test_mismatches_raise_value_error_naming_the_key():
    model = make("DecoderLM", "preLN-layernorm-gelu-sinusoidal")
    state = interop.to_torch_state_dict(model)
    before = model.state_dict()
    with pytest.raises(ValueError, match="missing keys.*head.bias"):
        interop.from_torch_state_dict(model, {k: v for k, v in state.items() if k != "head.bias"})
    with pytest.raises(ValueError, match="unexpected keys.*head.extra"):
        interop.from_torch_state_dict(model, {**state, "head.extra": np.zeros(1)})
    bad = dict(state)
    bad["head.weight"] = bad["head.weight"].T  # our layout instead of torch's
    with pytest.raises(ValueError, match="head.w"):
        interop.from_torch_state_dict(model, bad)
    for name, p in model.state_dict().items():
        np.testing.assert_array_equal(p, before[name])  # nothing was copied


def test_interop_does_not_import_torch():
    code = ("import sys, numpy_transformer.interop; "
            "assert 'torch' not in sys.modules, 'interop imported torch'")
    subprocess.run([sys.executable, "-c", code], check=True)

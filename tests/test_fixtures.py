"""Our ops, models and optimisers against PyTorch's numbers, without PyTorch.

The files in ``tests/fixtures`` were written by ``python -m reference_checks.make_fixtures``
with torch autograd (float64): inputs, a random upstream gradient, the output and every
gradient. They are loaded with ``allow_pickle=False``: plain arrays only.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from numpy_transformer import functional as fn
from numpy_transformer import interop, nn
from numpy_transformer.backend import get_backend
from numpy_transformer.optim import Adam, AdamW, clip_grad_norm

FIXTURES = Path(__file__).parent / "fixtures"
TOL = 1e-10


def load(name: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / f"{name}.npz", allow_pickle=False) as data:
        return dict(data)


def rel_err(ours, ref) -> float:
    ours, ref = np.asarray(ours, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    assert ours.shape == ref.shape, f"shape {ours.shape} != fixture's {ref.shape}"
    scale = max(np.abs(ours).max(initial=0.0), np.abs(ref).max(initial=0.0))
    return 0.0 if scale == 0 else float(np.abs(ours - ref).max() / scale)


def assert_close(label: str, ours, ref, tol: float = TOL, scale: float | None = None) -> None:
    err = rel_err(ours, ref) if scale is None else float(np.abs(ours - ref).max() / scale)
    assert err <= tol, f"{label}: relative error {err:.2e} against PyTorch exceeds {tol:.0e}"


# ----------------------------------------------------------------------------- ops
def _elementwise(name):
    forward, backward = getattr(fn, name + "_forward"), getattr(fn, name + "_backward")
    return lambda i, c: forward(i["x"]), lambda g, cache: (backward(g, cache),)


def _sdpa(backend):
    ops = get_backend(backend)
    forward, backward = ops.sdpa_forward, ops.sdpa_backward
    return (lambda i, c: forward(i["q"], i["k"], i["v"], mask=c.get("mask"), bias=c.get("bias")),
            backward)


# case -> (forward(inputs, consts) -> (out, cache), backward(g, cache) -> grads in input order)
OURS = {
    "linear": (lambda i, c: fn.linear_forward(i["x"], i["w"], i["b"]), fn.linear_backward),
    **{name: _elementwise(name) for name in ("relu", "gelu", "gelu_tanh", "silu", "softmax")},
    "swiglu": (lambda i, c: fn.swiglu_forward(i["gate"], i["up"]), fn.swiglu_backward),
    "layer_norm": (lambda i, c: fn.layer_norm_forward(i["x"], i["w"], i["b"]),
                   fn.layer_norm_backward),
    "rms_norm": (lambda i, c: fn.rms_norm_forward(i["x"], i["w"]), fn.rms_norm_backward),
    "embedding": (lambda i, c: fn.embedding_forward(c["ids"], i["table"]),
                  lambda g, cache: (fn.embedding_backward(g, cache),)),
    "cross_entropy": (lambda i, c: fn.cross_entropy_forward(i["logits"], c["targets"]),
                      lambda g, cache: (fn.cross_entropy_backward(float(g), cache),)),
    "rope": (lambda i, c: (fn.rope_forward(i["x"], c["cos"], c["sin"]), (c["cos"], c["sin"])),
             lambda g, cache: (fn.rope_backward(g, *cache),)),
}
SDPA_CASES = ["sdpa_causal", "sdpa_masked_dead_row", "sdpa_alibi"]


def _split(data: dict, case: str):
    """The case's differentiable inputs, constants and torch gradients, by name."""
    def pick(part):
        return {k.split(".", 2)[2]: v for k, v in data.items() if k.startswith(f"{case}.{part}.")}
    return pick("in"), pick("const"), pick("grad")


@pytest.mark.parametrize("case", list(OURS) + [f"{c}:{b}" for c in SDPA_CASES
                                               for b in ("numpy", "numba")])
def test_op_against_torch_fixture(case):
    data = load("ops")
    case, _, backend = case.partition(":")
    forward, backward = _sdpa(backend) if backend else OURS[case]
    inputs, consts, grads = _split(data, case)
    out, cache = forward(inputs, consts)
    assert_close(f"{case} out", out, data[f"{case}.out"])
    ours = backward(data[f"{case}.g"], cache)
    for name, d in zip(inputs, ours, strict=True):
        assert_close(f"{case} d{name}", d, grads[name])


# ----------------------------------------------------------------------------- models
@pytest.mark.parametrize("name", ["decoder_lm", "encoder_decoder", "encoder_classifier"])
def test_model_against_torch_fixture(name):
    data = load(name)
    config = nn.TransformerConfig(**json.loads(str(data["config"])))
    family = {"decoder_lm": nn.DecoderLM, "encoder_decoder": nn.EncoderDecoder,
              "encoder_classifier": nn.EncoderClassifier}[name]
    model = family(config)
    interop.from_torch_state_dict(model, {k[len("param."):]: v for k, v in data.items()
                                          if k.startswith("param.")})
    inputs = [v for k, v in data.items() if k.startswith("input.")]
    assert_close(f"{name} logits", model(*inputs), data["logits"])
    model.zero_grad()
    model.backward(data["g"])
    names = interop.torch_names(model)
    grads = {n: g for n, _, g in model.named_parameters()}
    torch_grads = {n: (data[f"grad.{t}"].T if tr else data[f"grad.{t}"])
                   for n, (t, tr) in names.items()}
    scale = max(np.abs(g).max() for g in torch_grads.values())
    for n, g in grads.items():
        # an attention key bias has true gradient 0 (softmax ignores a per-row shift): both
        # sides are rounding noise, measured against the model's gradient scale
        zero = n.endswith("attn.bk")
        assert_close(f"{name} d{n}", g, torch_grads[n], scale=scale if zero else None)


# ----------------------------------------------------------------------------- the LSTM
@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_lstm_against_torch_fixture(backend):
    """One ``torch.nn.LSTM`` layer with an initial state and gradients into the final one."""
    data = load("lstm")
    ops = get_backend(backend)
    names = ("x", "h0", "c0", "w_ih", "w_hh", "b")
    out, (h_t, c_t), cache = ops.lstm_forward(*(data[f"in.{n}"] for n in names))
    for label, ours in (("out", out), ("h_T", h_t), ("c_T", c_t)):
        assert_close(f"lstm {label}", ours, data[label])
    grads = ops.lstm_backward(data["g.out"], data["g.h_T"], data["g.c_T"], cache)
    for name, d in zip(names, grads, strict=True):
        assert_close(f"lstm d{name} ({backend})", d, data[f"grad.{name}"])


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_lstm_lm_against_torch_fixture(backend):
    data = load("lstm_lm")
    config = nn.LSTMConfig(**{**json.loads(str(data["config"])), "backend": backend})
    model = nn.LSTMLM(config)
    interop.from_torch_state_dict(model, {k[len("param."):]: v for k, v in data.items()
                                          if k.startswith("param.")})
    assert_close("lstm_lm logits", model(data["input.tokens"]), data["logits"])
    model.zero_grad()
    model.backward(data["g"])
    grads = {n: g for n, _, g in model.named_parameters()}
    for n, (t, transposed) in interop.torch_names(model).items():
        theirs = data[f"grad.{t}"]
        assert_close(f"lstm_lm d{n} ({backend})", grads[n], theirs.T if transposed else theirs)


# ----------------------------------------------------------------------------- optimisers
@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_optimiser_against_torch_fixture(name):
    data = load("optim")
    opts = json.loads(str(data[f"{name}.options"]))
    # torch's AdamW fixture decays "w" only (param groups); ours does by default (matrices)
    opt = Adam(**opts) if name == "adam" else AdamW(**opts)
    params = {n: data[f"{name}.start.{n}"].copy() for n in ("w", "b")}
    step = 1
    while f"{name}.step{step}.grad.w" in data:
        grads = {n: data[f"{name}.step{step}.grad.{n}"].copy() for n in params}
        clip_grad_norm(grads, 1.0)
        opt.step(params, grads)
        for n, p in params.items():
            assert_close(f"{name} step {step} {n}", p, data[f"{name}.step{step}.param.{n}"],
                         tol=1e-12)
        step += 1
    assert step > 1, "the fixture holds no optimiser step"

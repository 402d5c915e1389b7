"""The shipped twins as users get them: to_torch / from_torch, Adam's state both ways (the
run continues where it stopped), and a safetensors export loaded by PyTorch alone."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the twins need PyTorch")

import torch.nn.functional as F  # noqa: E402

from numpy_transformer import nn  # noqa: E402
from numpy_transformer.functional import cross_entropy_backward, cross_entropy_forward  # noqa: E402
from numpy_transformer.optim import Adam, AdamW, clip_grad_norm  # noqa: E402
from numpy_transformer.torch_twins import (  # noqa: E402
    adam_from_torch,
    adam_to_torch,
    from_torch,
    to_torch,
    twin_class,
)

V, B, T = 13, 4, 7


def config(**overrides) -> nn.TransformerConfig:
    fields = dict(vocab=V, width=8, heads=2, layers=2, ffn_width=12, max_len=9, num_classes=5,
                  backend="numpy", seed=2)
    return nn.TransformerConfig(**{**fields, **overrides})


def batch(seed):
    r = np.random.default_rng(seed)
    return r.integers(0, V, (B, T)), r.integers(0, V, (B, T))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("family, opts", [
    ("DecoderLM", dict(tie_embeddings=True, bias=False, positions="rope")),
    ("EncoderClassifier", dict(norm="rmsnorm", activation="swiglu")),
    ("EncoderDecoder", dict(positions="learned", norm_first=False)),
])
def test_to_torch_and_back(family, opts, dtype):
    model = getattr(nn, family)(config(dtype=dtype, **opts))
    twin = to_torch(model)
    assert isinstance(twin, twin_class(family)) and twin.config == model.config
    assert next(twin.parameters()).dtype == getattr(torch, dtype)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(1.5)  # "trained" in PyTorch
    back = from_torch(twin)
    assert type(back) is type(model) and back.config == model.config
    for name, p, _ in model.named_parameters():
        ours = back.state_dict()[name]
        np.testing.assert_array_equal(ours, p * p.dtype.type(1.5), err_msg=name)


def test_from_torch_picks_the_twins_dtype_and_refuses_a_layer():
    twin = to_torch(nn.DecoderLM(config())).to(torch.float32)
    assert from_torch(twin, backend="numba").config.dtype == "float32"
    assert from_torch(twin, backend="numba").config.backend == "numba"
    with pytest.raises(ValueError, match="from_torch takes a model twin"):
        from_torch(to_torch(nn.LayerNorm(4)))
    with pytest.raises(ValueError, match="must all be float32 or all float64"):
        from_torch(twin.to(torch.float16))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_from_torch_refuses_non_finite_weights_naming_them(bad):
    twin = to_torch(nn.DecoderLM(config()))
    name, param = list(twin.named_parameters())[-1]
    with torch.no_grad():
        param.view(-1)[0] = bad
    with pytest.raises(ValueError, match=f"parameter {name} holds NaN or infinite"):
        from_torch(twin)


@pytest.mark.parametrize("moment, bad, message", [
    ("exp_avg", float("nan"), "first moment of .* holds NaN"),
    ("exp_avg_sq", float("inf"), "second moment of .* holds NaN or infinite"),
    ("exp_avg_sq", -1.0, "second moment of .* is below zero")])
def test_adam_from_torch_refuses_bad_moments_naming_them(moment, bad, message):
    model = nn.DecoderLM(config())
    twin = to_torch(model)
    opt = torch.optim.Adam(twin.parameters())
    for p in twin.parameters():
        opt.state[p] = {"step": torch.tensor(2.0), "exp_avg": torch.zeros_like(p),
                        "exp_avg_sq": torch.zeros_like(p)}
    assert adam_from_torch(opt, twin, model, backend="numpy").t == 2  # the control
    opt.state[next(twin.parameters())][moment].view(-1)[0] = bad
    with pytest.raises(ValueError, match=message):
        adam_from_torch(opt, twin, model, backend="numpy")


def _our_step(model, opt, tokens, targets, clip):
    model.zero_grad()
    loss, cache = cross_entropy_forward(model(tokens), targets)
    model.backward(cross_entropy_backward(1.0, cache))
    grads = {n: g for n, _, g in model.named_parameters()}
    clip_grad_norm(grads, clip)
    opt.step({n: p for n, p, _ in model.named_parameters()}, grads)
    return loss


def _torch_step(twin, opt, tokens, targets, clip):
    logits = twin(torch.from_numpy(tokens))
    loss = F.cross_entropy(logits.reshape(-1, V), torch.from_numpy(targets).reshape(-1))
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(twin.parameters(), clip)
    opt.step()
    return loss.item()


@pytest.mark.parametrize("kind, wd", [(Adam, 0.0), (AdamW, 0.1), (Adam, 0.01)])
def test_adam_state_continues_the_run_in_torch_and_back(kind, wd):
    """3 steps here, 3 in torch with our moved state, and the same 3 steps here without
    leaving: losses and weights agree (float64); then the state comes back and the next step
    here is the one torch would have made."""
    model = nn.DecoderLM(config(positions="learned"))
    opt = kind(lr=1e-2, betas=(0.85, 0.99), eps=1e-7, weight_decay=wd, backend="numpy")
    for s in range(3):
        _our_step(model, opt, *batch(s), clip=0.5)
    twin = to_torch(model)
    torch_opt = adam_to_torch(opt, model, twin)
    assert type(torch_opt) is (torch.optim.AdamW if kind is AdamW else torch.optim.Adam)
    decayed = [g for g in torch_opt.param_groups if g["weight_decay"] > 0]
    assert len(decayed) == (1 if wd else 0)  # matrices only: our default decay rule
    for s in range(3, 6):
        theirs = _torch_step(twin, torch_opt, *batch(s), clip=0.5)
        ours = _our_step(model, opt, *batch(s), clip=0.5)
        assert abs(theirs - ours) <= 1e-13 * abs(ours), (s, theirs, ours)
    back = from_torch(twin)
    for name, p, _ in model.named_parameters():  # atol: the key biases' gradient is rounding
        np.testing.assert_allclose(back.state_dict()[name], p, rtol=1e-10, atol=1e-12,
                                   err_msg=name)  # noise (exactly 0), which Adam scales up
    returned = adam_from_torch(torch_opt, twin, back, backend="numpy")
    assert type(returned) is kind and returned.t == opt.t == 6
    matrices = {n for n, p, _ in model.named_parameters() if p.ndim >= 2}
    assert returned.decay == (matrices if wd else set())
    for name in opt.m:
        np.testing.assert_allclose(returned.m[name], opt.m[name], rtol=1e-10, atol=1e-16)
        np.testing.assert_allclose(returned.v[name], opt.v[name], rtol=1e-10, atol=1e-20)
    next_theirs = _torch_step(twin, torch_opt, *batch(6), clip=0.5)
    next_ours = _our_step(back, returned, *batch(6), clip=0.5)
    assert abs(next_theirs - next_ours) <= 1e-13 * abs(next_ours)
    for name, p, _ in back.named_parameters():
        np.testing.assert_allclose(p, from_torch(twin).state_dict()[name], rtol=1e-10,
                                   atol=1e-12, err_msg=name)


def test_adam_from_torch_refuses_what_ours_cannot_hold():
    model = nn.DecoderLM(config())
    twin = to_torch(model)
    with pytest.raises(ValueError, match="takes torch.optim.Adam or AdamW, got SGD"):
        adam_from_torch(torch.optim.SGD(twin.parameters(), lr=0.1), twin, model)
    with pytest.raises(ValueError, match="amsgrad"):
        adam_from_torch(torch.optim.Adam(twin.parameters(), amsgrad=True), twin, model)
    params = list(twin.parameters())
    two_lrs = torch.optim.Adam([{"params": params[:2], "lr": 0.1}, {"params": params[2:]}])
    with pytest.raises(ValueError, match="differ in 'lr'"):
        adam_from_torch(two_lrs, twin, model)
    with pytest.raises(ValueError, match="in no group"):
        adam_from_torch(torch.optim.Adam(params[1:]), twin, model)
    everything = torch.optim.AdamW(twin.parameters())  # torch's default: decay every tensor
    assert adam_from_torch(everything, twin, model).decay == {
        n for n, _, _ in model.named_parameters()}
    assert adam_from_torch(everything, twin, model).t == 0  # no step yet: no state to carry

    def state(p, step):
        return {"step": torch.tensor(float(step)), "exp_avg": torch.zeros_like(p),
                "exp_avg_sq": torch.zeros_like(p)}

    partial = torch.optim.Adam(params)
    partial.state[params[0]] = state(params[0], 3)
    with pytest.raises(ValueError, match=r"step counts differ \(\[3\], or some have no state"):
        adam_from_torch(partial, twin, model)
    mixed = torch.optim.Adam(params)
    for i, p in enumerate(params):
        mixed.state[p] = state(p, 2 if i else 5)
    with pytest.raises(ValueError, match=r"step counts differ \(\[2, 5\]"):
        adam_from_torch(mixed, twin, model)
    for p in params:
        mixed.state[p] = state(p, 2)
    assert adam_from_torch(mixed, twin, model).t == 2


# Issue 43: what used to escape as a foreign exception, each with its control (the same call
# on the right arguments works), and a stub that raises KeyError shown to fail the check.
def _refused(call, *words):
    """``call()`` raises ValueError naming each of ``words`` (a KeyError, AttributeError or
    RuntimeError escapes and fails the test)."""
    with pytest.raises(ValueError) as caught:
        call()
    assert all(word in str(caught.value) for word in words), str(caught.value)


def test_the_refusal_check_catches_a_foreign_exception():
    with pytest.raises(KeyError):  # negative control: adam_from_torch's old KeyError
        _refused(lambda: {}["exp_avg"], "exp_avg")


def _lstm_model():
    return nn.LSTMLM(nn.LSTMConfig(vocab=V, hidden=4, max_len=T, backend="numpy"))


@pytest.mark.parametrize("case", ["meta device", "config None", "an LSTM config"])
def test_from_torch_refuses_a_twin_it_cannot_read(case):
    model = nn.DecoderLM(config())
    twin = to_torch(model)
    assert type(from_torch(twin)) is nn.DecoderLM  # the control
    if case == "meta device":
        _refused(lambda: from_torch(twin.to("meta")), "is on the meta device", "to_empty")
        return
    twin.config = None if case == "config None" else _lstm_model().config
    _refused(lambda: from_torch(twin), "config must be a TransformerConfig",
             type(twin.config).__name__)


def _stepped_torch_adam(twin, steps=1):
    opt = torch.optim.Adam(twin.parameters(), lr=1e-3)
    for _ in range(steps):
        opt.zero_grad()
        twin(torch.from_numpy(batch(0)[0])).square().mean().backward()
        opt.step()
    return opt


def test_adam_both_ways_refuse_the_twin_of_another_model():
    model, lstm = nn.DecoderLM(config()), _lstm_model()
    twin, lstm_twin = to_torch(model), to_torch(lstm)
    opt = _stepped_torch_adam(twin)
    assert adam_from_torch(opt, twin, model, backend="numpy").t == 1  # the control
    _refused(lambda: adam_from_torch(opt, twin, lstm, backend="numpy"),
             "has no parameter", "LSTMLM", "to_torch(model)")
    ours = adam_from_torch(opt, twin, model, backend="numpy")
    assert adam_to_torch(ours, model, twin).state  # the control
    _refused(lambda: adam_to_torch(ours, model, lstm_twin), "has no parameter", "DecoderLM")
    _refused(lambda: adam_to_torch(ours, lstm, lstm_twin),  # moments of the other model
             "not those of the LSTMLM's parameters")


@pytest.mark.parametrize("key", ["exp_avg", "exp_avg_sq", "step"])
def test_adam_from_torch_refuses_a_state_without_a_moment(key):
    model = nn.DecoderLM(config())
    twin = to_torch(model)
    opt = _stepped_torch_adam(twin)
    name, param = next(iter(twin.named_parameters()))
    del opt.state[param][key]
    _refused(lambda: adam_from_torch(opt, twin, model, backend="numpy"), name, repr(key))


def test_safetensors_export_loads_into_the_twin_with_pytorch_alone(tmp_path):
    st = pytest.importorskip("safetensors.torch", reason="the exchange format needs safetensors")
    from numpy_transformer.export import load_safetensors, save_safetensors

    model = nn.DecoderLM(config(dtype="float32", positions="rope", bias=False))
    save_safetensors(tmp_path / "m.safetensors", model)
    twin = twin_class("DecoderLM")(model.config).to(torch.float32)
    twin.load_state_dict(st.load_file(tmp_path / "m.safetensors"), strict=True)
    tokens = batch(0)[0]
    with torch.no_grad():
        theirs = twin(torch.from_numpy(tokens)).numpy()
    ours = model(tokens)
    assert np.abs(theirs - ours).max() <= 1e-5 * np.abs(ours).max()
    from safetensors import safe_open

    with safe_open(tmp_path / "m.safetensors", "pt") as f:
        metadata = f.metadata()
    st.save_file(twin.state_dict(), tmp_path / "back.safetensors", metadata=metadata)
    np.testing.assert_array_equal(load_safetensors(tmp_path / "back.safetensors").model(tokens),
                                  ours)

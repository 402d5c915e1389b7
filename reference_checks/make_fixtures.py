"""Write the golden fixtures: PyTorch's numbers for our ops, models and optimisers.

``tests/test_fixtures.py`` checks our code against these files without torch, so a user who
never installs PyTorch still compares every gradient with PyTorch's. Everything is float64 and
tiny (the whole folder is a few tens of kilobytes). Run from the repository root after
changing a twin or an input, and commit the result::

    python -m reference_checks.make_fixtures            # or name some: ... lstm lstm_lm

File layout (``np.savez_compressed``, no pickled objects, so ``allow_pickle=False`` loads it):

* ``ops.npz``: per case ``<case>.in.<name>`` (differentiable inputs), ``<case>.const.<name>``
  (masks, tables, ids), ``<case>.g`` (the random upstream gradient), ``<case>.out``, and
  ``<case>.grad.<name>`` for every input, all computed by torch autograd.
* ``<family>.npz``: ``config`` (JSON of the ``TransformerConfig``), ``param.<torch name>``
  (the weights in the twin's names and layouts, see ``numpy_transformer.interop``),
  ``input.<name>``, ``g``, ``logits`` and ``grad.<torch name>``.
* ``lstm.npz``: one ``torch.nn.LSTM`` layer: ``in.<name>`` (x, h0, c0, and the weights in
  our layout: ``w_ih`` (C, 4H), ``w_hh`` (H, 4H), ``b`` = bias_ih + bias_hh), ``g.<output>``
  for out, h_T and c_T, the outputs, and ``grad.<name>`` (``grad.b`` is each bias's gradient).
  ``lstm_lm.npz`` is an ``LSTMLM`` laid out as the ``<family>.npz`` files.
* ``optim.npz``: per optimiser ``<opt>.options`` (JSON), ``<opt>.start.<p>``,
  ``<opt>.step<k>.grad.<p>`` and ``<opt>.step<k>.param.<p>`` after torch's clip + step.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch

from numpy_transformer import functional as fn
from numpy_transformer import nn, torch_twins
from numpy_transformer.torch_twins import ops as twins

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures"


def _rng(seed):
    return np.random.default_rng(seed)


def _autograd(twin_fn, inputs: dict, consts: dict, g: np.ndarray | None, seed: int):
    """Run ``twin_fn(*inputs, *consts)`` in torch; return (out, g, grads by name)."""
    t_in = {n: twins.tensor_of(a, requires_grad=True) for n, a in inputs.items()}
    t_const = [twins.tensor_of(c) if isinstance(c, np.ndarray) else c for c in consts.values()]
    out = twin_fn(*t_in.values(), *t_const)
    if g is None:
        g = _rng(seed).standard_normal(tuple(out.shape))
    (out * twins.tensor_of(g)).sum().backward()
    return out.detach().numpy(), g, {n: t.grad.numpy() for n, t in t_in.items()}


def op_cases() -> dict:
    """name -> (twin function, float inputs, constants); the test knows our side of each."""
    r = _rng(0)
    x = r.standard_normal((2, 3, 6))
    b, h, t, d = 2, 2, 4, 4
    q, k, v = (r.standard_normal((b, h, t, d)) for _ in range(3))
    dead = r.random((b, 1, t, t)) < 0.6
    dead[..., 0] = True
    dead[1, 0, 2, :] = False  # a query that may attend nothing
    cos, sin = fn.rope_tables(t, d)
    ids = np.array([[1, 4, 1, 0], [4, 4, 2, 1]])
    targets = r.integers(0, 6, (2, 3))
    targets[0, 1] = -100
    return {
        "linear": (twins.linear, {"x": x, "w": r.standard_normal((6, 5)),
                                  "b": r.standard_normal(5)}, {}),
        "relu": (twins.relu, {"x": x}, {}),
        "gelu": (twins.gelu, {"x": 2 * x}, {}),
        "gelu_tanh": (twins.gelu_tanh, {"x": 2 * x}, {}),
        "silu": (twins.silu, {"x": 2 * x}, {}),
        "swiglu": (twins.swiglu, {"gate": x, "up": r.standard_normal(x.shape)}, {}),
        "softmax": (twins.softmax, {"x": 3 * x}, {}),
        "layer_norm": (twins.layer_norm, {"x": x + 1, "w": r.standard_normal(6),
                                          "b": r.standard_normal(6)}, {}),
        "rms_norm": (twins.rms_norm, {"x": x + 1, "w": r.standard_normal(6)}, {}),
        "embedding": (lambda table, ids: twins.embedding(ids, table),
                      {"table": r.standard_normal((6, 3))}, {"ids": ids}),
        "cross_entropy": (twins.cross_entropy, {"logits": 2 * x}, {"targets": targets}),
        "rope": (twins.rope, {"x": q}, {"cos": cos, "sin": sin}),
        "sdpa_causal": (twins.sdpa, {"q": q, "k": k, "v": v}, {"mask": fn.causal_mask(t)}),
        "sdpa_masked_dead_row": (twins.sdpa, {"q": q, "k": k, "v": v}, {"mask": dead}),
        "sdpa_alibi": (lambda q, k, v, mask, bias: twins.sdpa(q, k, v, mask, bias),
                       {"q": q, "k": k, "v": v},
                       {"mask": fn.causal_mask(t), "bias": fn.alibi_bias(h, t, t)}),
    }


def write_ops(out: dict) -> None:
    for i, (case, (twin_fn, inputs, consts)) in enumerate(op_cases().items()):
        g = np.array(0.7) if case == "cross_entropy" else None  # a scalar loss
        result, g, grads = _autograd(twin_fn, inputs, consts, g, seed=100 + i)
        out[f"{case}.out"], out[f"{case}.g"] = result, g
        for n, a in inputs.items():
            out[f"{case}.in.{n}"], out[f"{case}.grad.{n}"] = a, grads[n]
        for n, c in consts.items():
            out[f"{case}.const.{n}"] = c


MODELS = {
    "decoder_lm": ("DecoderLM", dict(norm="rmsnorm", activation="swiglu", positions="rope",
                                     tie_embeddings=True, embed_scale=True)),
    "encoder_decoder": ("EncoderDecoder", dict(norm_first=False, activation="gelu_tanh",
                                               positions="alibi")),
    "encoder_classifier": ("EncoderClassifier", dict(norm_first=False, activation="relu",
                                                     positions="learned", num_classes=4)),
    "lstm_lm": ("LSTMLM", dict(embed=6, hidden=5, layers=2)),
}


def write_lstm(out: dict) -> None:
    """One LSTM layer against ``torch.nn.LSTM``: inputs in our layout (``w_ih`` (C, 4H), ``b``
    the sum of torch's two biases), random gradients for the output and both final states."""
    r = _rng(6)
    b, t, c, h = 3, 6, 4, 5
    lstm = torch.nn.LSTM(c, h, batch_first=True).double()
    with torch.no_grad():
        for p in lstm.parameters():
            p.copy_(torch.from_numpy(0.5 * r.standard_normal(tuple(p.shape))))
    x, h0, c0 = (twins.to_torch(r.standard_normal(s), requires_grad=True)
                 for s in ((b, t, c), (1, b, h), (1, b, h)))
    y, (h_t, c_t) = lstm(x, (h0, c0))
    gs = [r.standard_normal(tuple(a.shape)) for a in (y, h_t, c_t)]
    sum((a * twins.to_torch(g)).sum() for a, g in zip((y, h_t, c_t), gs, strict=True)).backward()
    weights = {"w_ih": lstm.weight_ih_l0.T, "w_hh": lstm.weight_hh_l0.T,
               "b": lstm.bias_ih_l0 + lstm.bias_hh_l0}
    for name, a in {"x": x, "h0": h0[0], "c0": c0[0], **weights}.items():
        out[f"in.{name}"] = a.detach().numpy().copy()
    grads = {"x": x.grad, "h0": h0.grad[0], "c0": c0.grad[0], "w_ih": lstm.weight_ih_l0.grad.T,
             "w_hh": lstm.weight_hh_l0.grad.T, "b": lstm.bias_ih_l0.grad}
    for name, a in grads.items():
        out[f"grad.{name}"] = a.numpy().copy()
    for name, a, g in zip(("out", "h_T", "c_T"), (y, h_t[0], c_t[0]), gs, strict=True):
        out[name], out[f"g.{name}"] = a.detach().numpy(), g.reshape(a.shape)


def write_model(family: str, options: dict) -> dict:
    if family == "LSTMLM":
        cfg = nn.LSTMConfig(vocab=13, max_len=9, seed=1, **options)
    else:
        cfg = nn.TransformerConfig(vocab=13, width=8, heads=2, layers=2, ffn_width=12,
                                   max_len=9, seed=1, **options)
    model = getattr(nn, family)(cfg)
    r = _rng(3)
    for _, p, _ in model.named_parameters():  # move gains and biases away from 1 and 0
        if p.ndim == 1:
            p += 0.3 * r.standard_normal(p.shape)
    twin = torch_twins.tensor_of(model)
    r = _rng(4)
    if family == "EncoderClassifier":
        inputs = {"tokens": r.integers(0, 13, (2, 5)), "lengths": np.array([5, 3])}
    elif family in ("DecoderLM", "LSTMLM"):
        inputs = {"tokens": r.integers(0, 13, (2, 5))}
    else:
        inputs = {"src": r.integers(0, 13, (2, 6)), "tgt": r.integers(0, 13, (2, 5)),
                  "src_lengths": np.array([4, 6])}
    logits = twin(*(torch.from_numpy(a) for a in inputs.values()))
    g = r.standard_normal(tuple(logits.shape))
    (logits * twins.tensor_of(g)).sum().backward()
    out = {"config": np.array(json.dumps(dataclasses.asdict(cfg))),
           "logits": logits.detach().numpy(), "g": g}
    out.update({f"input.{n}": a for n, a in inputs.items()})
    for name, p in twin.named_parameters():
        out[f"param.{name}"] = p.detach().numpy()
        out[f"grad.{name}"] = p.grad.numpy()
    return out


OPTIMISERS = {
    "adam": ("Adam", {"lr": 1e-2}, [["w", "b"]], {}),
    "adamw": ("AdamW", {"lr": 1e-2, "weight_decay": 0.1}, [["w"], ["b"]],
              {"b": {"weight_decay": 0.0}}),  # torch groups as our default rule: matrices only
}


def write_optim(out: dict, steps: int = 4) -> None:
    for key, (cls, opts, groups, group_opts) in OPTIMISERS.items():
        r = _rng(5)
        start = {"w": r.standard_normal((4, 3)), "b": r.standard_normal(3)}
        params = {n: twins.tensor_of(a, requires_grad=True) for n, a in start.items()}
        opt = getattr(torch.optim, cls)(
            [{"params": [params[n] for n in names], **group_opts.get(names[0], {})}
             for names in groups], **opts)
        out[f"{key}.options"] = np.array(json.dumps(opts))
        for n, a in start.items():
            out[f"{key}.start.{n}"] = a
        for k in range(1, steps + 1):
            for n, p in params.items():
                g = r.standard_normal(p.shape) * 0.8
                out[f"{key}.step{k}.grad.{n}"] = g
                p.grad = twins.tensor_of(g)
            torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
            opt.step()
            for n, p in params.items():
                out[f"{key}.step{k}.param.{n}"] = p.detach().numpy().copy()


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="write only these files (default: all), "
                        "e.g. lstm lstm_lm")
    names = parser.parse_args(argv).names
    OUT.mkdir(parents=True, exist_ok=True)
    ops, optim, lstm = {}, {}, {}
    write_ops(ops)
    write_optim(optim)
    write_lstm(lstm)
    files = {"ops": ops, "optim": optim, "lstm": lstm}
    for name, (family, options) in MODELS.items():
        files[name] = write_model(family, options)
    unknown = sorted(set(names) - set(files))
    if unknown:
        parser.error(f"no fixture called {unknown}; choose from {sorted(files)}")
    for name, arrays in files.items():
        if names and name not in names:
            continue
        path = OUT / f"{name}.npz"
        np.savez_compressed(path, **arrays)
        print(f"{path.relative_to(OUT.parents[1])}: {len(arrays)} arrays, "
              f"{path.stat().st_size / 1024:.1f} KiB")


if __name__ == "__main__":
    main()

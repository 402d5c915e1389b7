"""Our pieces against the PyTorch functions and modules people know by name:
``F.scaled_dot_product_attention``, ``nn.MultiheadAttention``, ``nn.LayerNorm``,
``nn.RMSNorm``, ``F.gelu``, ``F.cross_entropy``, ``torch.optim.Adam`` / ``AdamW`` with
``clip_grad_norm_``. Every gradient is compared, with a random upstream gradient."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch.nn.attention.bias import causal_lower_right  # noqa: E402

from numpy_transformer import config, nn  # noqa: E402
from numpy_transformer import functional as fn  # noqa: E402
from numpy_transformer.optim import Adam, AdamW, clip_grad_norm  # noqa: E402
from numpy_transformer.torch_twins import tensor_of  # noqa: E402
from reference_checks.compare import assert_close, rel_err  # noqa: E402

DTYPES = [getattr(np, name) for name in config.DTYPES]


def randn(shape, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ----------------------------------------------------------------------------- sdpa
def _sdpa_both(q, k, v, dtype, ours_mask=None, **torch_kwargs):
    """Ours and F.scaled_dot_product_attention on the same q, k, v and a random G."""
    out, cache = fn.sdpa_forward(q, k, v, mask=ours_mask)
    g = randn(out.shape, dtype, seed=9)
    dq, dk, dv = fn.sdpa_backward(g, cache)
    tq, tk, tv = (tensor_of(a, requires_grad=True) for a in (q, k, v))
    tout = F.scaled_dot_product_attention(tq, tk, tv, **torch_kwargs)
    (tout * tensor_of(g)).sum().backward()
    return (out, dq, dk, dv), (tout.detach().numpy(), tq.grad.numpy(), tk.grad.numpy(),
                               tv.grad.numpy())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["no mask", "is_causal", "causal_lower_right", "bool mask",
                                  "float bias"])
def test_sdpa_vs_torch(case, dtype):
    b, h, t_q, t_k, d = 2, 3, 5, 5, 4
    if case == "causal_lower_right":
        t_q = 3  # fewer queries than keys: the queries are the LAST positions
    q, k, v = randn((b, h, t_q, d), dtype, 1), randn((b, h, t_k, d), dtype, 2), \
        randn((b, h, t_k, d), dtype, 3)
    if case == "no mask":
        ours, theirs = _sdpa_both(q, k, v, dtype)
    elif case == "is_causal":
        ours, theirs = _sdpa_both(q, k, v, dtype, fn.causal_mask(t_q), is_causal=True)
    elif case == "causal_lower_right":
        # our causal_mask(t_q, t_k) aligns the diagonal bottom-right (cached decoding);
        # torch's is_causal=True aligns it top-left; torch's causal_lower_right is ours.
        ours, theirs = _sdpa_both(q, k, v, dtype, fn.causal_mask(t_q, t_k),
                                  attn_mask=causal_lower_right(t_q, t_k))
    elif case == "bool mask":
        mask = np.random.default_rng(4).random((b, 1, t_q, t_k)) < 0.5
        mask[..., 0] = True  # every query sees something (see the next test otherwise)
        ours, theirs = _sdpa_both(q, k, v, dtype, mask, attn_mask=torch.from_numpy(mask))
    else:  # an additive float bias is torch's float attn_mask; ours takes it as `bias`
        bias = fn.alibi_bias(h, t_q, t_k, dtype=dtype)
        out, cache = fn.sdpa_forward(q, k, v, bias=bias)
        g = randn(out.shape, dtype, seed=9)
        ours = (out, *fn.sdpa_backward(g, cache))
        tq, tk, tv = (tensor_of(a, requires_grad=True) for a in (q, k, v))
        tout = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=tensor_of(bias))
        (tout * tensor_of(g)).sum().backward()
        theirs = (tout.detach().numpy(), tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy())
    for name, a, t in zip(("out", "dq", "dk", "dv"), ours, theirs, strict=True):
        assert_close("F.sdpa", f"{case}: {name}", a, t, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sdpa_fully_masked_rows(dtype):
    """A query that may attend nothing: ours gives a zero output and zero gradient.

    PyTorch returned NaN for such rows for years (softmax of all -inf); torch 2.13 on the CPU
    returns zeros as well, on both the flash and the math backend. The test accepts either,
    checks the other rows, and our zeros, and compares gradients whenever torch's are finite.
    """
    b, h, t, d = 2, 2, 4, 3
    q, k, v = (randn((b, h, t, d), dtype, s) for s in (1, 2, 3))
    mask = np.random.default_rng(5).random((b, 1, t, t)) < 0.6
    mask[..., 0] = True
    mask[0, 0, 1, :] = False  # query 1 of sequence 0 sees no key
    mask[1, 0, 3, :] = False
    dead = ~mask.any(-1)  # (B, 1, T)
    ours, theirs = _sdpa_both(q, k, v, dtype, mask, attn_mask=torch.from_numpy(mask))
    dead_rows = np.broadcast_to(dead[..., None], ours[0].shape)
    assert (ours[0][dead_rows] == 0).all(), "a fully masked row must give zeros"
    torch_dead = theirs[0][dead_rows]
    assert np.isnan(torch_dead).all() or (torch_dead == 0).all()
    assert_close("F.sdpa", "fully masked: live rows", np.where(dead_rows, 0, ours[0]),
                 np.where(dead_rows, 0, theirs[0]), dtype)
    dq_dead = np.broadcast_to(dead[..., None], ours[1].shape)
    assert (ours[1][dq_dead] == 0).all(), "a fully masked query gets zero gradient"
    if all(np.isfinite(t).all() for t in theirs[1:]):
        for name, a, t in zip(("dq", "dk", "dv"), ours[1:], theirs[1:], strict=True):
            assert_close("F.sdpa", f"fully masked: {name}", a, t, dtype)


# ----------------------------------------------------------------------------- MHA
def torch_mha_from(attn: nn.MultiHeadAttention) -> torch.nn.MultiheadAttention:
    """``nn.MultiheadAttention`` holding our weights: it fuses q, k, v into one (3C, C)
    ``in_proj_weight`` = cat(wq^T, wk^T, wv^T), and stores ``out_proj`` as (C_out, C_in)."""
    p = attn.params
    dtype = torch.float64 if p["wq"].dtype == np.float64 else torch.float32
    mha = torch.nn.MultiheadAttention(attn.width, attn.heads, batch_first=True, dtype=dtype)
    with torch.no_grad():
        mha.in_proj_weight.copy_(tensor_of(np.concatenate([p["wq"].T, p["wk"].T, p["wv"].T])))
        mha.in_proj_bias.copy_(tensor_of(np.concatenate([p["bq"], p["bk"], p["bv"]])))
        mha.out_proj.weight.copy_(tensor_of(p["wo"].T))
        mha.out_proj.bias.copy_(tensor_of(p["bo"]))
    return mha


def _mha_grads_in_our_names(mha, c):
    w, b = mha.in_proj_weight.grad.numpy(), mha.in_proj_bias.grad.numpy()
    return {"wq": w[:c].T, "wk": w[c:2 * c].T, "wv": w[2 * c:].T, "bq": b[:c], "bk": b[c:2 * c],
            "bv": b[2 * c:], "wo": mha.out_proj.weight.grad.numpy().T,
            "bo": mha.out_proj.bias.grad.numpy()}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
def test_multihead_attention_vs_torch(cross, dtype):
    """Ours against nn.MultiheadAttention with masks written in TORCH's convention
    (True = masked out) and converted to ours (True = may attend) by from_torch_ignore_mask."""
    b, t_q, c, h = 2, 4, 8, 2
    t_k = 6 if cross else t_q
    attn = nn.MultiHeadAttention(c, h, dtype=dtype, rng=np.random.default_rng(0), backend="numpy")
    mha = torch_mha_from(attn)
    x = randn((b, t_q, c), dtype, 1)
    ctx = randn((b, t_k, c), dtype, 2) if cross else None
    # torch's convention: True = ignore this key
    torch_attn_mask = np.triu(np.ones((t_q, t_k), dtype=bool), k=1 + t_k - t_q)  # future keys
    torch_padding = np.arange(t_k)[None, :] >= np.array([t_k, t_k - 2])[:, None]  # (B, T_k)
    ours_mask = fn.combine_masks(fn.from_torch_ignore_mask(torch_attn_mask),
                                 fn.from_torch_ignore_mask(torch_padding)[:, None, None, :])
    out = attn(x, ctx, mask=ours_mask)
    g = randn(out.shape, dtype, 9)
    attn.zero_grad()
    dins = attn.backward(g)
    tx = tensor_of(x, requires_grad=True)
    tctx = tensor_of(ctx, requires_grad=True) if cross else tx
    tout, _ = mha(tx, tctx, tctx, attn_mask=torch.from_numpy(torch_attn_mask),
                  key_padding_mask=torch.from_numpy(torch_padding), need_weights=False)
    (tout * tensor_of(g)).sum().backward()
    assert_close("nn.MultiheadAttention", "out", out, tout.detach().numpy(), dtype)
    if cross:
        assert_close("nn.MultiheadAttention", "dx", dins[0], tx.grad.numpy(), dtype)
        assert_close("nn.MultiheadAttention", "dcontext", dins[1], tctx.grad.numpy(), dtype)
    else:
        assert_close("nn.MultiheadAttention", "dx", dins, tx.grad.numpy(), dtype)
    theirs = _mha_grads_in_our_names(mha, c)
    scale = max(np.abs(t).max() for t in theirs.values())
    for name, grad in attn.grads.items():
        assert_close("nn.MultiheadAttention", "d" + name, grad, theirs[name], dtype,
                     scale=scale if name == "bk" else None)  # bk: true gradient 0


def test_mask_conventions_are_opposite():
    """The same boolean array means opposite things to nn.MultiheadAttention and to us:
    passed unconverted it gives a different answer, converted it gives torch's."""
    b, t, c, h = 1, 5, 8, 2
    attn = nn.MultiHeadAttention(c, h, rng=np.random.default_rng(0), backend="numpy")
    mha = torch_mha_from(attn)
    x = randn((b, t, c), np.float64)
    torch_mask = np.triu(np.ones((t, t), dtype=bool), k=1)  # torch: True = masked OUT
    tout, _ = mha(tensor_of(x), tensor_of(x), tensor_of(x), attn_mask=torch.from_numpy(torch_mask),
                  need_weights=False)
    tout = tout.detach().numpy()
    converted = fn.from_torch_ignore_mask(torch_mask)  # ours: True = may attend
    assert (converted == fn.causal_mask(t)).all()
    assert rel_err(attn(x, mask=converted), tout) < 1e-12
    assert rel_err(attn(x, mask=torch_mask), tout) > 1e-2  # unconverted: wrong keys attended


# ----------------------------------------------------------------------------- norms
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["LayerNorm", "RMSNorm"])
def test_norm_vs_torch_module(kind, dtype):
    c = 10
    ours = nn.LayerNorm(c, dtype=dtype, backend="numpy") if kind == "LayerNorm" else \
        nn.RMSNorm(c, dtype=dtype, backend="numpy")
    tdtype = torch.float64 if dtype == np.float64 else torch.float32
    theirs = torch.nn.LayerNorm(c, dtype=tdtype) if kind == "LayerNorm" else \
        torch.nn.RMSNorm(c, dtype=tdtype)  # eps=None: finfo(dtype).eps, as ours
    for name, p in ours.params.items():
        p[...] = randn(p.shape, dtype, seed=len(name))
    with torch.no_grad():
        theirs.weight.copy_(tensor_of(ours.params["w"]))
        if kind == "LayerNorm":
            theirs.bias.copy_(tensor_of(ours.params["b"]))
    x = randn((3, 4, c), dtype, 1) * 3 + 2
    g = randn((3, 4, c), dtype, 2)
    out = ours(x)
    dx = ours.backward(g)
    tx = tensor_of(x, requires_grad=True)
    tout = theirs(tx)
    (tout * tensor_of(g)).sum().backward()
    assert_close(f"nn.{kind}", "out", out, tout.detach().numpy(), dtype)
    assert_close(f"nn.{kind}", "dx", dx, tx.grad.numpy(), dtype)
    assert_close(f"nn.{kind}", "dw", ours.grads["w"], theirs.weight.grad.numpy(), dtype)
    if kind == "LayerNorm":
        assert_close(f"nn.{kind}", "db", ours.grads["b"], theirs.bias.grad.numpy(), dtype)


# ----------------------------------------------------------------------------- GELU
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_vs_torch(approximate, dtype):
    forward, backward = ((fn.gelu_forward, fn.gelu_backward) if approximate == "none"
                         else (fn.gelu_tanh_forward, fn.gelu_tanh_backward))
    x = randn((1000,), dtype) * 4
    g = randn((1000,), dtype, 1)
    out, cache = forward(x)
    tx = tensor_of(x, requires_grad=True)
    tout = F.gelu(tx, approximate=approximate)
    (tout * tensor_of(g)).sum().backward()
    assert_close("F.gelu", f"{approximate}: out", out, tout.detach().numpy(), dtype)
    assert_close("F.gelu", f"{approximate}: dx", backward(g, cache), tx.grad.numpy(), dtype)
    # negative control: each GELU matches its own torch twin, not the other one (they
    # differ by up to ~5e-4, far beyond either tolerance)
    other = "tanh" if approximate == "none" else "none"
    assert np.abs(out - F.gelu(tensor_of(x), approximate=other).numpy()).max() > 1e-4


# ----------------------------------------------------------------------------- loss
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ignore_index", [-100, 3])
def test_cross_entropy_vs_torch(ignore_index, dtype):
    rng = np.random.default_rng(0)
    logits = randn((3, 6, 9), dtype) * 3
    targets = rng.integers(0, 9, (3, 6))
    targets[rng.random((3, 6)) < 0.3] = ignore_index
    loss, cache = fn.cross_entropy_forward(logits, targets, ignore_index=ignore_index)
    tl = tensor_of(logits, requires_grad=True)
    tloss = F.cross_entropy(tl.reshape(-1, 9), torch.from_numpy(targets).reshape(-1),
                            ignore_index=ignore_index)
    (tloss * 1.7).backward()
    assert_close("F.cross_entropy", "loss", loss, tloss.item(), dtype)
    assert_close("F.cross_entropy", "dlogits", fn.cross_entropy_backward(1.7, cache),
                 tl.grad.numpy(), dtype)


# ----------------------------------------------------------------------------- optimisers
def _opt_problem(dtype):
    rng = np.random.default_rng(0)
    params = {"w1": rng.standard_normal((6, 5)), "b1": rng.standard_normal(5),
              "w2": rng.standard_normal((5, 3)), "gain": 1 + rng.standard_normal(3)}
    grads = [{n: rng.standard_normal(p.shape) * rng.uniform(0.05, 1.5) for n, p in params.items()}
             for _ in range(20)]  # some steps are clipped (global norm > 1), some are not
    return ({n: p.astype(dtype) for n, p in params.items()},
            [{n: g.astype(dtype) for n, g in gs.items()} for gs in grads])


OPTIMISERS = {
    # name: (ours, torch param groups as lists of names with their options, torch class)
    "Adam": (lambda: Adam(lr=1e-2), [(["w1", "b1", "w2", "gain"], {})], "Adam"),
    "Adam L2 on all": (lambda: Adam(lr=1e-2, weight_decay=0.1, decay=lambda n, p: True),
                       [(["w1", "b1", "w2", "gain"], {"weight_decay": 0.1})], "Adam"),
    "AdamW default rule": (lambda: AdamW(lr=1e-2, weight_decay=0.1),  # matrices only
                           [(["w1", "w2"], {"weight_decay": 0.1}),
                            (["b1", "gain"], {"weight_decay": 0.0})], "AdamW"),
    "AdamW by names": (lambda: AdamW(lr=1e-2, weight_decay=0.3, decay={"w1", "b1"},
                                     backend="numpy"),
                       [(["w1", "b1"], {"weight_decay": 0.3}),
                        (["w2", "gain"], {"weight_decay": 0.0})], "AdamW"),
    "AdamW on all": (lambda: AdamW(lr=1e-2, weight_decay=0.1, decay=lambda n, p: True),
                     [(["w1", "b1", "w2", "gain"], {"weight_decay": 0.1})], "AdamW"),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(OPTIMISERS))
def test_optimiser_vs_torch(name, dtype):
    """20 steps of clip_grad_norm + update on both sides, from the same start, same gradients.

    Our AdamW decays matrices only by default; torch decays every parameter of a group, so
    the decay rule on our side and the param groups on torch's must say the same thing."""
    make_ours, groups, torch_class = OPTIMISERS[name]
    params, grad_steps = _opt_problem(dtype)
    tparams = {n: tensor_of(p, requires_grad=True) for n, p in params.items()}
    ours = make_ours()
    theirs = getattr(torch.optim, torch_class)(
        [{"params": [tparams[n] for n in names], **opts} for names, opts in groups],
        lr=1e-2, weight_decay=0.0)
    for step, grads in enumerate(grad_steps, start=1):
        for n, g in grads.items():
            tparams[n].grad = tensor_of(g)
        norm = clip_grad_norm(grads, 1.0)
        tnorm = torch.nn.utils.clip_grad_norm_(list(tparams.values()), 1.0)
        assert_close("clip_grad_norm_", f"{name}: step {step} global norm", norm,
                     tnorm.item(), dtype)
        ours.step(params, grads)
        theirs.step()
        for n, p in params.items():
            assert_close("optim", f"{name}: step {step} {n}", p, tparams[n].detach().numpy(),
                         dtype, tol=1e-6 if dtype == np.float32 else 1e-12)

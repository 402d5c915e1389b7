"""Every functional forward/backward pair against torch autograd, float32 and float64."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from numpy_transformer import config  # noqa: E402
from numpy_transformer import functional as fn  # noqa: E402
from numpy_transformer.backend import get_backend  # noqa: E402
from numpy_transformer.torch_twins import ops as twins  # noqa: E402
from reference_checks.compare import assert_close  # noqa: E402

DTYPES = [getattr(np, name) for name in config.DTYPES]


def randn(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def check_op(family, ours_fwd, ours_bwd, twin_fn, inputs, dtype, *, consts=(), seed=1):
    """``out, cache = ours_fwd(*inputs, *consts)``; backward of a random G; compare out and
    the gradient of every input (by its name in ``inputs``) with the twin's autograd."""
    names, arrays = list(inputs), list(inputs.values())
    out, cache = ours_fwd(*arrays, *consts)
    g = randn(np.random.default_rng(seed), np.shape(out), dtype)
    grads = ours_bwd(g, cache)
    grads = (grads,) if isinstance(grads, np.ndarray) else tuple(grads)
    targs = [twins.tensor_of(a, requires_grad=True) for a in arrays]
    tconsts = [twins.tensor_of(c) if isinstance(c, np.ndarray) else c for c in consts]
    tout = twin_fn(*targs, *tconsts)
    (tout * twins.tensor_of(g)).sum().backward()
    assert_close(family, "out", out, tout.detach().numpy(), dtype)
    for name, d, t in zip(names, grads, targs, strict=False):
        if d is not None:
            assert_close(family, "d" + name, d, t.grad.numpy(), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
def test_linear(dtype, bias):
    rng = np.random.default_rng(0)
    inputs = {"x": randn(rng, (2, 3, 5), dtype), "w": randn(rng, (5, 4), dtype)}
    if bias:
        inputs["b"] = randn(rng, (4,), dtype)
    check_op("ops", fn.linear_forward, fn.linear_backward, twins.linear, inputs, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", config.ELEMENTWISE_ACTIVATIONS)
def test_activation(dtype, name):
    x = randn(np.random.default_rng(0), (3, 4, 6), dtype) * 3
    check_op("ops", getattr(fn, name + "_forward"), getattr(fn, name + "_backward"),
             getattr(twins, name), {"x": x}, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu(dtype):
    rng = np.random.default_rng(0)
    inputs = {"gate": randn(rng, (2, 3, 6), dtype), "up": randn(rng, (2, 3, 6), dtype)}
    check_op("ops", fn.swiglu_forward, fn.swiglu_backward, twins.swiglu, inputs, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_and_log_softmax(dtype):
    x = randn(np.random.default_rng(0), (2, 3, 7), dtype) * 4
    check_op("ops", fn.softmax_forward, fn.softmax_backward, twins.softmax, {"x": x}, dtype)
    assert_close("ops", "log_softmax", fn.log_softmax(x), twins.log_softmax(twins.tensor_of(x)),
                 dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm(dtype):
    rng = np.random.default_rng(0)
    inputs = {"x": randn(rng, (2, 3, 8), dtype) * 2 + 1, "w": randn(rng, (8,), dtype),
              "b": randn(rng, (8,), dtype)}
    check_op("ops", fn.layer_norm_forward, fn.layer_norm_backward, twins.layer_norm, inputs,
             dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm(dtype):
    rng = np.random.default_rng(0)
    inputs = {"x": randn(rng, (2, 3, 8), dtype) * 2 + 1, "w": randn(rng, (8,), dtype)}
    check_op("ops", fn.rms_norm_forward, fn.rms_norm_backward, twins.rms_norm, inputs, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding(dtype):
    rng = np.random.default_rng(0)
    ids = np.array([[1, 4, 1, 0], [4, 4, 2, 1]])  # repeats must accumulate
    table = randn(rng, (6, 5), dtype)
    out, cache = fn.embedding_forward(ids, table)
    g = randn(rng, out.shape, dtype)
    t = twins.tensor_of(table, requires_grad=True)
    tout = twins.embedding(torch.from_numpy(ids), t)
    (tout * twins.tensor_of(g)).sum().backward()
    assert_close("ops", "out", out, tout.detach().numpy(), dtype)
    assert_close("ops", "dtable", fn.embedding_backward(g, cache), t.grad.numpy(), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy(dtype):
    rng = np.random.default_rng(0)
    logits = randn(rng, (2, 5, 7), dtype) * 3
    targets = rng.integers(0, 7, (2, 5))
    targets[0, 1] = targets[1, 4] = -100  # ignored
    mask = np.ones((2, 5), dtype=bool)
    mask[1, 0] = False  # and one masked out
    loss, cache = fn.cross_entropy_forward(logits, targets, mask=mask)
    dloss = 0.7  # a random upstream gradient for the scalar
    t = twins.tensor_of(logits, requires_grad=True)
    tloss = twins.cross_entropy(t, torch.from_numpy(targets), mask=torch.from_numpy(mask))
    (tloss * dloss).backward()
    assert_close("ops", "loss", loss, tloss.item(), dtype)
    assert_close("ops", "dlogits", fn.cross_entropy_backward(dloss, cache), t.grad.numpy(),
                 dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope(dtype):
    rng = np.random.default_rng(0)
    x = randn(rng, (2, 2, 5, 6), dtype)
    cos, sin = fn.rope_tables(5, 6, dtype=dtype)
    tcos, tsin = twins.rope_tables(5, 6, dtype=twins.TORCH_DTYPES[np.dtype(dtype)])
    assert_close("ops", "rope cos", cos, tcos.numpy(), dtype)
    assert_close("ops", "rope sin", sin, tsin.numpy(), dtype)
    check_op("ops", lambda x, c, s: (fn.rope_forward(x, c, s), (c, s)),
             lambda g, cache: fn.rope_backward(g, *cache), twins.rope, {"x": x}, dtype,
             consts=(cos, sin))


@pytest.mark.parametrize("dtype", DTYPES)
def test_position_tables(dtype):
    tdtype = twins.TORCH_DTYPES[np.dtype(dtype)]
    assert_close("ops", "sinusoidal table", fn.sinusoidal_table(9, 8, dtype=dtype),
                 twins.sinusoidal_table(9, 8, tdtype).numpy(), dtype)
    for heads in (1, 4, 6):
        assert_close("ops", f"alibi bias H={heads}", fn.alibi_bias(heads, 3, 5, dtype=dtype),
                     twins.alibi_bias(heads, 3, 5, tdtype).numpy(), dtype)


def _masks(rng, b, h, t_q, t_k):
    random = rng.random((b, 1, t_q, t_k)) < 0.6
    random[..., 0] = True  # every row sees at least key 0
    return {"none": None, "causal": fn.causal_mask(t_q, t_k), "random": random,
            "padding": fn.key_padding_mask(np.array([t_k, 2]), t_k)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "random", "padding", "alibi",
                                       "fully_masked_row"])
def test_sdpa(dtype, backend, mask_kind):
    """Both backends against the twin, whose fully masked rows follow our zero convention."""
    rng = np.random.default_rng(0)
    b, h, t_q, t_k, d = 2, 3, 4, 5, 6
    q, k, v = (randn(rng, (b, h, t, d), dtype) for t in (t_q, t_k, t_k))
    bias = None
    if mask_kind == "alibi":
        mask, bias = fn.causal_mask(t_q, t_k), fn.alibi_bias(h, t_q, t_k, dtype=dtype)
    elif mask_kind == "fully_masked_row":
        mask = _masks(rng, b, h, t_q, t_k)["random"]
        mask[1, 0, 2, :] = False  # query 2 of sequence 1 may attend nothing
    else:
        mask = _masks(rng, b, h, t_q, t_k)[mask_kind]
    ops = get_backend(backend)
    forward, backward = ops.sdpa_forward, ops.sdpa_backward
    check_op(f"attention ({backend})", forward, backward, twins.sdpa,
             {"q": q, "k": k, "v": v}, dtype, consts=(mask, bias))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "random", "padding"])
def test_grouped_query_sdpa(dtype, backend, mask_kind):
    """6 query heads read 3 kv heads: both backends against torch's own grouped-query
    attention, ``F.scaled_dot_product_attention(..., enable_gqa=True)`` (same mask
    convention, True = may attend; no fully masked row, where torch gives NaN)."""
    rng = np.random.default_rng(2)
    b, h, h_kv, t_q, t_k, d = 2, 6, 3, 4, 5, 6
    q = randn(rng, (b, h, t_q, d), dtype)
    k, v = (randn(rng, (b, h_kv, t_k, d), dtype) for _ in range(2))
    mask = _masks(rng, b, h, t_q, t_k)[mask_kind]
    ops = get_backend(backend)

    def theirs(q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                enable_gqa=True)

    check_op(f"grouped-query attention ({backend})", ops.sdpa_forward, ops.sdpa_backward,
             theirs, {"q": q, "k": k, "v": v}, dtype, consts=(mask,))

"""The Numba kernels of the training step against their NumPy references.

Each kernel in ``kernels/norms.py``, ``kernels/softmax.py``, ``kernels/activations.py`` and
``kernels/embedding.py`` has the contract of a readable function in ``functional/`` (the
embeddings' one pass: a composition in ``functional/embedding.py``). Here both run on the same
inputs with a random upstream gradient, forward and backward, in float64 (agreement to 1e-12
relative) and float32 (1e-5); then whole models built with ``backend="numba"`` pass the
finite-difference check and equal their ``backend="numpy"`` twins.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import pytest
from _nn_helpers import assert_gradcheck

from numpy_transformer import config
from numpy_transformer.functional import activations as ref_act
from numpy_transformer.functional import embedding as ref_emb
from numpy_transformer.functional import norms as ref_norms
from numpy_transformer.functional import softmax as ref_softmax
from numpy_transformer.gradcheck import check_module, check_op
from numpy_transformer.kernels import activations as fast_act
from numpy_transformer.kernels import embedding as fast_emb
from numpy_transformer.kernels import norms as fast_norms
from numpy_transformer.kernels import softmax as fast_softmax
from numpy_transformer.nn import DecoderLM, EncoderClassifier, TransformerConfig
from numpy_transformer.train import Batch, Trainer

TOL = {np.float64: 1e-12, np.float32: 1e-5}
DTYPES = [getattr(np, name) for name in config.DTYPES]
SHAPES = [(3, 5, 7), (4, 84), (2, 130, 16)]  # 130 rows: more than one block of 64 rows


def rel_err(a, b) -> float:
    """max |a - b| / max |b|: the worst entry error on the scale of the reference."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def assert_close(name, fast, ref, dtype):
    assert np.asarray(fast).dtype == np.asarray(ref).dtype, f"{name}: dtype"
    err = rel_err(fast, ref)
    assert err <= TOL[dtype], f"{name}: relative error {err:.3g} > {TOL[dtype]}"


# ------------------------------------------------------------------------------- norms
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_layer_norm_matches_reference(shape, dtype):
    rng = np.random.default_rng(0)
    x = (3.0 + 2.0 * rng.standard_normal(shape)).astype(dtype)  # an offset mean to remove
    w, b = (rng.standard_normal(shape[-1]).astype(dtype) for _ in range(2))
    g = rng.standard_normal(shape).astype(dtype)
    out_r, cache_r = ref_norms.layer_norm_forward(x, w, b)
    out_f, cache_f = fast_norms.layer_norm_forward(x, w, b)
    assert type(cache_f) is type(cache_r)
    assert_close("out", out_f, out_r, dtype)
    for field in cache_r._fields:
        assert_close(f"cache.{field}", getattr(cache_f, field), getattr(cache_r, field), dtype)
    for name, gf, gr in zip(("dx", "dw", "db"), fast_norms.layer_norm_backward(g, cache_f),
                            ref_norms.layer_norm_backward(g, cache_r), strict=True):
        assert_close(name, gf, gr, dtype)


@pytest.mark.parametrize("eps", [None, 1e-6])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm_matches_reference(shape, dtype, eps):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(dtype)
    w = rng.standard_normal(shape[-1]).astype(dtype)
    g = rng.standard_normal(shape).astype(dtype)
    out_r, cache_r = ref_norms.rms_norm_forward(x, w, eps)
    out_f, cache_f = fast_norms.rms_norm_forward(x, w, eps)
    assert type(cache_f) is type(cache_r)
    assert_close("out", out_f, out_r, dtype)
    for field in cache_r._fields:
        assert_close(f"cache.{field}", getattr(cache_f, field), getattr(cache_r, field), dtype)
    for name, gf, gr in zip(("dx", "dw"), fast_norms.rms_norm_backward(g, cache_f),
                            ref_norms.rms_norm_backward(g, cache_r), strict=True):
        assert_close(name, gf, gr, dtype)


def test_norm_kernels_take_non_contiguous_input_and_reject_bad_input():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 8, 5)).transpose(1, 0, 2)  # (8, 6, 5), not C-contiguous
    w, b = np.ones(5), np.zeros(5)
    np.testing.assert_allclose(fast_norms.layer_norm_forward(x, w, b)[0],
                               ref_norms.layer_norm_forward(x, w, b)[0], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="last dimension"):
        fast_norms.layer_norm_forward(x, np.ones(4), np.zeros(4))
    with pytest.raises(ValueError, match="float"):
        fast_norms.rms_norm_forward(np.ones((2, 5), dtype=int), w)


def test_norm_parameter_gradients_do_not_depend_on_the_thread_count():
    rng = np.random.default_rng(3)
    x, g = rng.standard_normal((2, 300, 24)), rng.standard_normal((2, 300, 24))
    w, b = rng.standard_normal(24), rng.standard_normal(24)
    before = numba.get_num_threads()
    results = []
    try:
        for n in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(n)
            _, cache = fast_norms.layer_norm_forward(x, w, b)
            results.append(fast_norms.layer_norm_backward(g, cache))
    finally:
        numba.set_num_threads(before)
    for grads in results[1:]:
        for a, c in zip(grads, results[0], strict=True):
            np.testing.assert_array_equal(a, c)  # bit for bit


# ------------------------------------------------------------------------------- softmax CE
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("masked", [False, True])
def test_cross_entropy_matches_reference(dtype, masked):
    rng = np.random.default_rng(4)
    logits = (4.0 * rng.standard_normal((3, 7, 11))).astype(dtype)
    targets = rng.integers(0, 11, (3, 7))
    targets[0, 2] = -100  # ignored
    mask = rng.random((3, 7)) < 0.7 if masked else None
    loss_r, cache_r = ref_softmax.cross_entropy_forward(logits, targets, mask=mask)
    loss_f, cache_f = fast_softmax.cross_entropy_forward(logits, targets, mask=mask)
    assert type(cache_f) is type(cache_r)
    assert abs(loss_f - loss_r) <= TOL[dtype] * abs(loss_r)
    assert_close("probs", cache_f.probs, cache_r.probs, dtype)
    np.testing.assert_array_equal(cache_f.targets, cache_r.targets)
    assert_close("weight", cache_f.weight, cache_r.weight, dtype)
    assert cache_f.shape == cache_r.shape
    assert_close("dlogits", fast_softmax.cross_entropy_backward(0.7, cache_f),
                 ref_softmax.cross_entropy_backward(0.7, cache_r), dtype)


def test_cross_entropy_kernel_raises_as_the_reference():
    logits = np.zeros((2, 3, 5))
    for targets, mask, match in ((np.full((2, 3), -100), None, "no counted"),
                                 (np.full((2, 3), 5), None, "outside"),
                                 (np.zeros((2, 3)), None, "integer"),
                                 (np.zeros((2, 4), dtype=int), None, "do not match"),
                                 (np.zeros((2, 3), dtype=int), np.ones(3, bool), "mask")):
        for module in (ref_softmax, fast_softmax):
            with pytest.raises(ValueError, match=match):
                module.cross_entropy_forward(logits, targets, mask=mask)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_kernel_gives_nan_for_a_nan_logit(dtype):
    # a NaN anywhere in a row, not only at the target, makes the loss and that row's
    # gradient NaN, as in the reference (the kernel once counted it as a probability of 0)
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((4, 9)).astype(dtype)
    logits[1, 5] = np.nan
    targets = np.array([0, 1, 2, 3])
    with np.errstate(invalid="ignore"):
        loss_r, cache_r = ref_softmax.cross_entropy_forward(logits, targets)
        dlogits_r = ref_softmax.cross_entropy_backward(1.0, cache_r)
    loss, cache = fast_softmax.cross_entropy_forward(logits, targets)
    assert math.isnan(loss) and math.isnan(loss_r)
    np.testing.assert_array_equal(np.isnan(fast_softmax.cross_entropy_backward(1.0, cache)),
                                  np.isnan(dlogits_r))


def test_cross_entropy_kernel_is_stable_for_huge_logits():
    logits = np.array([[1e4, 0.0, -1e4], [-1e4, -1e4, -1e4]])
    loss, cache = fast_softmax.cross_entropy_forward(logits, np.array([0, 2]))
    loss_r, cache_r = ref_softmax.cross_entropy_forward(logits, np.array([0, 2]))
    assert np.isfinite(loss) and abs(loss - loss_r) <= 1e-12 * abs(loss_r)
    np.testing.assert_allclose(cache.probs, cache_r.probs, rtol=1e-12, atol=1e-300)


# ------------------------------------------------------------------------------- activations
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["relu", "gelu", "gelu_tanh"])
def test_activation_matches_reference(name, dtype):
    rng = np.random.default_rng(5)
    x = (3.0 * rng.standard_normal((4, 9, 13))).astype(dtype)
    x[0, 0, :3] = 0.0  # ReLU's kink: subgradient 0, as the reference
    g = rng.standard_normal(x.shape).astype(dtype)
    out_r, cache_r = getattr(ref_act, name + "_forward")(x)
    out_f, cache_f = getattr(fast_act, name + "_forward")(x)
    assert_close("out", out_f, out_r, dtype)
    assert_close("dx", getattr(fast_act, name + "_backward")(g, cache_f),
                 getattr(ref_act, name + "_backward")(g, cache_r), dtype)


@pytest.mark.parametrize("name", ["gelu", "gelu_tanh"])
def test_gelu_kernels_pass_the_finite_difference_check(name):
    x = 2.0 * np.random.default_rng(7).standard_normal((4, 9, 13))  # float64
    forward, backward = (getattr(fast_act, f"{name}_{part}") for part in ("forward", "backward"))
    assert check_op(forward, backward, {"x": x}).ok(1e-6)


def test_float32_erf_approximation_is_within_a_few_units_in_the_last_place():
    x = np.linspace(-9.0, 9.0, 40001).astype(np.float32)
    exact = np.array([math.erf(float(v)) for v in x])
    assert np.abs(fast_act.erf_f32(x) - exact).max() <= 8 * np.finfo(np.float32).eps


def test_relu_kernel_propagates_nan_as_the_reference():
    x = np.array([np.nan, -1.0, 2.0])
    np.testing.assert_array_equal(fast_act.relu_forward(x)[0], ref_act.relu_forward(x)[0])
    dout = np.array([1.0, np.nan, 3.0])
    np.testing.assert_array_equal(fast_act.relu_backward(dout, x), ref_act.relu_backward(dout, x))


# ------------------------------------------------------------------------------- embedding
@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_backward_is_the_reference_bit_for_bit(dtype):
    rng = np.random.default_rng(6)
    table = rng.standard_normal((7, 5)).astype(dtype)
    ids = rng.integers(0, 4, (6, 9))  # many repeats, ids 4..6 never used
    _, cache = ref_emb.embedding_forward(ids, table)
    dout = rng.standard_normal((6, 9, 5)).astype(dtype)
    fast, ref = fast_emb.embedding_backward(dout, cache), ref_emb.embedding_backward(dout, cache)
    assert fast.dtype == ref.dtype
    np.testing.assert_array_equal(fast, ref)  # same additions in the same order


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale, positions", [(1.0, False), (2.8284271247461903, True),
                                              (1.0, True)])
def test_embeddings_forward_is_the_three_passes_bit_for_bit(dtype, scale, positions):
    """lookup, ``* scale``, ``+ PE[:T]`` as NumPy does them one after the other, and the table
    gradient of ``dout * scale``: the same numbers to the last bit."""
    rng = np.random.default_rng(7)
    table = rng.standard_normal((7, 5)).astype(dtype)
    ids = rng.integers(0, 7, (6, 9))
    rows = rng.standard_normal((9, 5)).astype(dtype) if positions else None
    want, cache_r = ref_emb.embedding_forward(ids, table)
    want = want * scale
    if positions:
        want = want + rows
    got, cache = fast_emb.embeddings_forward(ids, table, scale, rows)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)
    composed, _ = ref_emb.embeddings_forward(ids, table, scale, rows)  # the reference
    np.testing.assert_array_equal(composed, want)
    dout = rng.standard_normal((6, 9, 5)).astype(dtype)
    want_grad = ref_emb.embedding_backward(dout * scale, cache_r)
    np.testing.assert_array_equal(fast_emb.embeddings_backward(dout, cache, scale), want_grad)
    np.testing.assert_array_equal(ref_emb.embeddings_backward(dout, cache_r, scale), want_grad)


def test_embeddings_forward_rejects_bad_input():
    table = np.zeros((7, 5))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        fast_emb.embeddings_forward(np.array([[0, 7]]), table)
    with pytest.raises(ValueError, match="shape"):
        fast_emb.embeddings_forward(np.array([0, 1]), table)
    with pytest.raises(ValueError, match="positions"):
        fast_emb.embeddings_forward(np.array([[0, 1]]), table, 1.0, np.zeros((3, 5)))
    with pytest.raises(ValueError, match="positions"):
        fast_emb.embeddings_forward(np.array([[0, 1]]), table, 1.0, np.zeros((2, 5), np.float32))


# ------------------------------------------------------------------------------- models
def _configs():
    base = dict(vocab=11, width=8, heads=2, layers=2, ffn_width=12, max_len=6)
    return {
        "decoder relu sinusoidal": (DecoderLM, dict(base, activation="relu", embed_scale=True)),
        "decoder gelu learned": (DecoderLM, dict(base, activation="gelu", positions="learned")),
        "decoder rmsnorm post-LN": (DecoderLM, dict(base, norm="rmsnorm", norm_first=False)),
        "decoder tied gelu_tanh": (DecoderLM, dict(base, activation="gelu_tanh",
                                                   tie_embeddings=True)),
        "encoder gelu learned": (EncoderClassifier, dict(base, activation="gelu",
                                                         positions="learned", num_classes=5)),
    }


@pytest.mark.parametrize("name", list(_configs()))
def test_numba_model_equals_numpy_model(name):
    cls, options = _configs()[name]
    rng = np.random.default_rng(8)
    x = rng.integers(0, 11, (3, 6))
    y = rng.integers(0, options.get("num_classes", 11), (3, 6))
    results = {}
    for backend in ("numpy", "numba"):
        model = cls(TransformerConfig(**options, backend=backend))
        trainer = Trainer(model, optimizer=None, lr_schedule=None)
        loss = trainer.loss_and_grads(Batch((x,), y))
        results[backend] = (loss, model.forward(x),
                            {n: g.copy() for n, _, g in model.named_parameters()})
    (loss_n, logits_n, grads_n), (loss_f, logits_f, grads_f) = results["numpy"], results["numba"]
    assert abs(loss_f - loss_n) <= 1e-12 * abs(loss_n)
    assert rel_err(logits_f, logits_n) <= 1e-12
    for n in grads_n:  # floor 1e-3: the key biases' true gradient is 0 (rounding noise)
        scale = max(np.abs(grads_n[n]).max(), 1e-3)
        assert np.abs(grads_f[n] - grads_n[n]).max() <= 1e-12 * scale, n


@pytest.mark.parametrize("name", ["decoder relu sinusoidal", "decoder gelu learned",
                                  "encoder gelu learned"])
def test_numba_model_passes_gradcheck(name):
    cls, options = _configs()[name]
    model = cls(TransformerConfig(**options, backend="numba"))
    tokens = np.random.default_rng(9).integers(0, 11, (2, 6))
    assert_gradcheck(check_module(model, {"tokens": tokens}), model)


def test_unknown_backend_is_rejected():
    from numpy_transformer.nn.layers import LayerNorm

    with pytest.raises(ValueError, match="backend"):
        LayerNorm(4, backend="cuda")

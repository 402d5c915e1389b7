"""``kernels/head_loss.py`` (the output head and its loss by blocks of rows) against
``functional/head_loss.py``, and the models' ``loss_and_backward`` that training calls.

The kernel goes through the rows in blocks of ``_BLOCK_ROWS`` and the columns in blocks of
``_BLOCK_COLUMNS``, so the shapes here have several of each and ragged last ones; the upstream
gradient ``dloss`` is random, the dtypes float64 (1e-12) and float32 (1e-5).
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from _kernel_helpers import TOL, assert_gradients_match, multi_thread, rel_err
from _nn_helpers import FAMILIES, small_family

from numpy_transformer.functional import head_loss as ref
from numpy_transformer.functional.head_loss import LinearCrossEntropyCache
from numpy_transformer.functional.softmax import cross_entropy_backward, cross_entropy_forward
from numpy_transformer.kernels import head_loss as fast
from numpy_transformer.nn import DecoderLM, TransformerConfig

WIDE = fast._WIDE_COLUMNS + 37  # a vocabulary for the blocked kernel, its last block ragged


def _problem(n, c, v, dtype, tied, seed=0):
    """x (2, n/2, c), w (c, v) (a tied table's transpose if ``tied``), b, targets with ignored
    and masked-out positions, and the mask."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, n // 2, c)).astype(dtype)
    w = (rng.standard_normal((v, c)).T if tied else rng.standard_normal((c, v)))
    w = (0.3 * w).astype(dtype)  # logits of order 1-2: softmaxes neither flat nor one-hot
    b = rng.standard_normal(v).astype(dtype)
    targets = rng.integers(0, v, size=(2, n // 2))
    targets[0, :3] = -100
    mask = rng.random((2, n // 2)) > 0.1
    return x, w, b, targets, mask


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n", [2 * fast._BLOCK_ROWS + 38, 10])  # three blocks of rows; one
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_the_kernel_matches_the_reference(dtype, n, tied, bias):
    x, w, b, targets, mask = _problem(n, 24, WIDE, dtype, tied)
    b = b if bias else None
    dloss = float(np.random.default_rng(5).uniform(0.5, 2.0))
    loss_r, cache_r = ref.linear_cross_entropy_forward(x, w, b, targets, mask=mask)
    loss_f, cache_f = fast.linear_cross_entropy_forward(x, w, b, targets, mask=mask)
    assert isinstance(cache_f, fast.HeadLossKernelCache)
    assert abs(loss_f - loss_r) <= TOL[dtype] * abs(loss_r)
    grads_r = ref.linear_cross_entropy_backward(dloss, cache_r)
    grads_f = fast.linear_cross_entropy_backward(dloss, cache_f)
    assert_gradients_match(grads_f, grads_r, dtype)
    # dw comes in the weight's layout: a tied table's gradient (dw^T) is C-contiguous
    assert (grads_f[1].T if tied else grads_f[1]).flags.c_contiguous


def test_a_narrow_vocabulary_composes_the_two_kernels():
    x, w, b, targets, mask = _problem(300, 8, 50, np.float64, False)
    loss_r, cache_r = ref.linear_cross_entropy_forward(x, w, b, targets, mask=mask)
    loss_f, cache_f = fast.linear_cross_entropy_forward(x, w, b, targets, mask=mask)
    assert isinstance(cache_f, LinearCrossEntropyCache)  # the reference's cache
    assert abs(loss_f - loss_r) <= 1e-12 * loss_r
    for got, want in zip(fast.linear_cross_entropy_backward(0.7, cache_f),
                         ref.linear_cross_entropy_backward(0.7, cache_r), strict=True):
        assert rel_err(got, want) <= 1e-12


def test_the_backward_hands_the_gradients_over_once():
    x, w, b, targets, _ = _problem(20, 8, WIDE, np.float64, False)
    _, cache = fast.linear_cross_entropy_forward(x, w, b, targets)
    fast.linear_cross_entropy_backward(1.0, cache)
    with pytest.raises(ValueError, match="run the forward again"):
        fast.linear_cross_entropy_backward(1.0, cache)


def test_the_gradients_do_not_depend_on_the_inputs_written_after_the_forward():
    x, w, b, targets, mask = _problem(40, 8, WIDE, np.float32, True)
    want = ref.linear_cross_entropy_backward(
        1.0, ref.linear_cross_entropy_forward(x, w, b, targets, mask=mask)[1])
    _, cache = fast.linear_cross_entropy_forward(x, w, b, targets, mask=mask)
    for a in (x, w, b, targets, mask):  # the caller reuses every input's memory
        a[...] = 0
    for got, expected in zip(fast.linear_cross_entropy_backward(1.0, cache), want, strict=True):
        assert rel_err(got, expected) <= TOL[np.float32]


@pytest.mark.parametrize("bad, match", [(np.zeros((2, 10), dtype=int) + WIDE, "outside"),
                                        (np.full((2, 10), -100), "no counted target")])
def test_bad_targets_are_refused_as_by_the_reference(bad, match):
    x, w, b, _, _ = _problem(20, 8, WIDE, np.float64, False)
    for op in (ref, fast):
        with pytest.raises(ValueError, match=match):
            op.linear_cross_entropy_forward(x, w, b, bad)


@multi_thread
def test_the_same_bits_on_any_thread_count():
    x, w, b, targets, mask = _problem(2 * fast._BLOCK_ROWS + 38, 24, WIDE, np.float32, True)
    before, results = numba.get_num_threads(), []
    try:
        for threads in (1, 2):
            numba.set_num_threads(threads)
            loss, cache = fast.linear_cross_entropy_forward(x, w, b, targets, mask=mask)
            grads = fast.linear_cross_entropy_backward(1.0, cache)
            results.append((loss, *(g.tobytes() for g in grads)))
    finally:
        numba.set_num_threads(before)
    assert results[0] == results[1]


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("tied", [True, False])
def test_loss_and_backward_equals_forward_loss_backward(backend, tied):
    """The fused call that training makes against the model's forward, the loss and the
    model's backward, on a vocabulary wide enough for the blocked kernel."""
    model = DecoderLM(TransformerConfig(vocab=WIDE, width=16, heads=2, layers=1, ffn_width=32,
                                        max_len=16, tie_embeddings=tied, backend=backend))
    rng = np.random.default_rng(2)
    ids = rng.integers(0, WIDE, size=(3, 17))
    mask = rng.random((3, 16)) > 0.2
    loss, cache = cross_entropy_forward(model.forward(ids[:, :-1]), ids[:, 1:], mask=mask)
    model.zero_grad()
    model.backward(cross_entropy_backward(1.0, cache))
    want = {name: g.copy() for name, _, g in model.named_parameters()}
    model.zero_grad()
    fused = model.loss_and_backward(ids[:, :-1], targets=ids[:, 1:], mask=mask)
    assert abs(fused - loss) <= 1e-12 * loss
    # on the scale of all the gradients: the key bias's is zero but for rounding
    scale = max(float(np.abs(g).max()) for g in want.values())
    for name, _, g in model.named_parameters():
        assert np.abs(g - want[name]).max() <= 1e-12 * scale, name


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_s_loss_and_backward_equals_forward_loss_backward(family, backend):
    model, inputs, targets, mask = small_family(family, backend)
    loss, cache = cross_entropy_forward(model.forward(*inputs), targets, mask=mask)
    model.zero_grad()
    model.backward(cross_entropy_backward(1.0, cache))
    want = {name: g.copy() for name, _, g in model.named_parameters()}
    model.zero_grad()
    fused = model.loss_and_backward(*inputs, targets=targets, mask=mask)
    assert abs(fused - loss) <= 1e-12 * loss
    scale = max(float(np.abs(g).max()) for g in want.values())
    for name, _, g in model.named_parameters():
        assert np.abs(g - want[name]).max() <= 1e-12 * scale, name


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_a_head_takes_one_loss_backward_per_loss_forward(backend):
    model = DecoderLM(TransformerConfig(vocab=WIDE, width=16, heads=2, layers=1, ffn_width=32,
                                        max_len=16, tie_embeddings=True, backend=backend))
    with pytest.raises(ValueError, match=r"TiedOutput.loss_backward needs a loss_forward"):
        model.head.loss_backward()
    ids = np.random.default_rng(3).integers(0, WIDE, size=(2, 9))
    model.head.loss_forward(model.decoder(ids[:, :-1]), ids[:, 1:])
    model.head.loss_backward(0.5)
    with pytest.raises(ValueError, match="needs a loss_forward first"):
        model.head.loss_backward(0.5)

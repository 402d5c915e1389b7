"""The fused Numba attention kernel against the NumPy reference, for every kind of mask.

The reference (``functional/attention.py``) is checked by finite differences in
``tests/test_attention.py``; here the kernel must reproduce its output and all three gradients
(float64 to 1e-12, float32 to 1e-5, relative to the largest entry), give exact zeros where the
contract promises them, recognise the masks it can skip, and reject bad input with the same
``ValueError`` as the reference. The first test to run compiles the kernels (tens of seconds
with an empty Numba cache, well under a second from the cache).
"""

import numpy as np
import pytest
from _kernel_helpers import from_python

from numpy_transformer.functional import attention as ref
from numpy_transformer.functional.activations import dropout_mask
from numpy_transformer.functional.linear import merge_heads
from numpy_transformer.functional.masks import causal_mask, combine_masks, key_padding_mask
from numpy_transformer.functional.positional import alibi_bias
from numpy_transformer.gradcheck import check_op
from numpy_transformer.kernels import _attention_kernels as compiled
from numpy_transformer.kernels import attention as ker
from numpy_transformer.kernels import special

TOL = {np.float64: 1e-12, np.float32: 1e-5}
B, H, D = 2, 3, 8
T = 2 * compiled._BLOCK_Q + 3  # three query blocks of the kernel, the last one holding 3 rows
# the helpers tested on their own (compiled code calls them: kernels/_jit.py's helper)
key_piece, first_row, full_keys, scores_t, keys_product, queries_product = map(from_python, (
    compiled._key_piece, compiled._first_row, compiled._full_keys, compiled._scores_t,
    compiled._keys_product, compiled._queries_product))
exp_shifted_f64, exp_shifted_f32 = map(from_python, (special._exp_shifted_f64,
                                                     special._exp_shifted_f32))


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| relative to the largest |b|."""
    return float(np.abs(a - b).max() / max(np.abs(b).max(), np.finfo(np.float64).tiny))


def make_case(kind: str, rng: np.random.Generator):
    """(t_q, t_k, mask, bias) for one named situation."""
    t_q, t_k, mask, bias = T, T, None, None
    if kind == "causal":
        mask = causal_mask(T)
    elif kind == "causal, fewer queries":  # the last t_q of t_k positions, as in decoding
        t_q, t_k = 70, T
        mask = causal_mask(t_q, t_k)
    elif kind == "padding":
        mask = key_padding_mask(np.array([T, 77]), T)
    elif kind == "causal+padding":
        mask = combine_masks(causal_mask(T), key_padding_mask(np.array([100, 3]), T))
    elif kind == "arbitrary":
        mask = rng.random((B, H, T, T)) < 0.4
        mask[1, 2, 5] = False  # a fully masked query row
        mask[0, :, :, 9] = False  # a key nobody may attend
    elif kind == "alibi":
        bias = alibi_bias(H, T, T)  # (1, H, T, T), broadcast over the batch
    elif kind == "alibi+causal":
        mask, bias = causal_mask(T), alibi_bias(H, T, T)
    elif kind == "cross, more queries":
        t_q, t_k = T, 45
    elif kind == "cross, more keys":
        t_q, t_k = 45, T
    elif kind != "none":
        raise ValueError(kind)
    return t_q, t_k, mask, bias


KINDS = ["none", "causal", "causal, fewer queries", "padding", "causal+padding", "arbitrary",
         "alibi", "alibi+causal", "cross, more queries", "cross, more keys"]


def run_both(t_q, t_k, mask, bias, dtype, rng, b=B, h=H, d=D, dropout=None, kv_heads=None):
    """Forward and backward of reference and kernel on the same inputs, random upstream G."""
    kv_heads = h if kv_heads is None else kv_heads
    q = rng.standard_normal((b, h, t_q, d)).astype(dtype)
    k = rng.standard_normal((b, kv_heads, t_k, d)).astype(dtype)
    v = rng.standard_normal((b, kv_heads, t_k, d)).astype(dtype)
    g = rng.standard_normal((b, h, t_q, d)).astype(dtype)
    if bias is not None:
        bias = bias.astype(dtype)
    if dropout is not None:
        dropout = dropout.astype(dtype)
    out_r, cache_r = ref.sdpa_forward(q, k, v, mask, bias, dropout=dropout)
    out_k, cache_k = ker.sdpa_forward(q, k, v, mask, bias, dropout=dropout)
    grads_r = ref.sdpa_backward(g, cache_r)
    grads_k = ker.sdpa_backward(g, cache_k)
    return (out_r, *grads_r), (out_k, *grads_k), cache_k


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", KINDS)
def test_kernel_matches_reference(kind, dtype):
    rng = np.random.default_rng(KINDS.index(kind))
    t_q, t_k, mask, bias = make_case(kind, rng)
    want, got, _ = run_both(t_q, t_k, mask, bias, dtype, rng)
    for name, w, g in zip(("out", "dq", "dk", "dv"), want, got, strict=True):
        assert g.dtype == dtype and g.shape == w.shape, f"{kind}: {name} {g.dtype} {g.shape}"
        assert np.isfinite(g).all(), f"{kind}: {name} not finite"
        err = rel_err(g, w)
        assert err <= TOL[dtype], f"{kind} {dtype.__name__}: {name} relative error {err:.2e}"


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", KINDS)
def test_kernel_with_dropout_matches_reference(kind, dtype):
    """Dropout of the weights, (4b), runs in the kernels: multipliers of every (query, key)."""
    rng = np.random.default_rng(20 + KINDS.index(kind))
    t_q, t_k, mask, bias = make_case(kind, rng)
    drop = dropout_mask((B, H, t_q, t_k), 0.25, rng, dtype)
    want, got, cache = run_both(t_q, t_k, mask, bias, dtype, rng, dropout=drop)
    assert cache.has_dropout
    for name, w, g in zip(("out", "dq", "dk", "dv"), want, got, strict=True):
        err = rel_err(g, w)
        assert err <= TOL[dtype], f"{kind} {dtype.__name__}: {name} relative error {err:.2e}"


@pytest.mark.parametrize("shape", [(1, 1, T, T), (B, 1, 1, T)])
def test_dropout_broadcast_and_grouped_query_heads(shape):
    """Multipliers broadcast like a mask; k and v with fewer heads (grouped-query attention)."""
    rng = np.random.default_rng(5)
    drop = dropout_mask(shape, 0.4, rng, np.float64)
    want, got, _ = run_both(T, T, causal_mask(T), None, np.float64, rng, h=4, dropout=drop,
                            kv_heads=2)
    for name, w, g in zip(("out", "dq", "dk", "dv"), want, got, strict=True):
        assert rel_err(g, w) <= TOL[np.float64], name


def test_a_backward_without_the_dropout_misses_the_kernels_gradients():
    """Negative control: the reference's gradients with the multipliers left out of the
    backward differ from the kernel's by far more than the tolerance."""
    rng = np.random.default_rng(6)
    drop = dropout_mask((B, H, T, T), 0.25, rng, np.float64)
    q, k, v, g = (rng.standard_normal((B, H, T, D)) for _ in range(4))
    _, cache_r = ref.sdpa_forward(q, k, v, causal_mask(T), dropout=drop)
    _, cache_k = ker.sdpa_forward(q, k, v, causal_mask(T), dropout=drop)
    wrong = ref.sdpa_backward(g, cache_r._replace(dropout=None))
    for name, w, got in zip(("dq", "dk", "dv"), wrong, ker.sdpa_backward(g, cache_k),
                            strict=True):
        assert rel_err(got, w) > 1e3 * TOL[np.float64], name


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", ["none", "causal", "cross, more keys"])
def test_wide_heads_multiply_in_pieces(kind, dtype):
    """At D = 64 the products along the keys run in pieces of 122 keys (OpenBLAS's small
    matrices), several per block here: the pieces must add up to the whole products."""
    assert key_piece(compiled._BLOCK_Q, 64) < T
    rng = np.random.default_rng(5)
    t_q, t_k, mask, bias = make_case(kind, rng)
    want, got, _ = run_both(t_q, t_k, mask, bias, dtype, rng, d=64)
    for name, w, g in zip(("out", "dq", "dk", "dv"), want, got, strict=True):
        err = rel_err(g, w)
        assert err <= TOL[dtype], f"{kind} {dtype.__name__}: {name} relative error {err:.2e}"


@pytest.mark.parametrize("causal", [False, True])
def test_products_in_pieces_match_numpy(causal):
    """The block products themselves. Without a mask: keys in several pieces of the
    small-matrix size and a short one. Causal, a late block of queries (i0 = 1024): the keys
    seen by all its queries in such pieces too, then the diagonal in pieces of
    ``_DIAG_KEYS``, each from the first query that sees it. Scores must be right where
    visible; the products over keys (added into their output) and queries must equal the whole
    ones when the hidden weights are zero."""
    rng = np.random.default_rng(6)
    i0, n, d, t = 1024, 128, 16, 1200
    k_hi = i0 + n if causal else t
    visible = np.arange(n)[None, :] >= np.array(
        [first_row(j, i0, n, t, t, causal) for j in range(k_hi)])[:, None]  # (k_hi, n)
    full = full_keys(k_hi, i0, t, t, causal)
    assert (full == k_hi) != causal and 2 * key_piece(d, n) < full
    a, b_t, x_q, x_k = (rng.standard_normal(s) for s in ((k_hi, d), (d, n), (n, d), (k_hi, d)))
    fn = ker.gemm_address(np.float64)
    scores = np.full((k_hi, n), np.nan)
    scores_t(a, b_t, scores, i0, n, t, t, causal, fn)
    assert rel_err(scores[visible], (a @ b_t)[visible]) <= 1e-13
    weights = np.where(visible, rng.standard_normal((k_hi, n)), 0.0)  # zero where hidden
    before = rng.standard_normal((k_hi, d))  # the keys' product adds into its output
    out = before.copy()
    keys_product(weights, x_q, out, i0, n, t, t, causal, fn)
    assert rel_err(out, before + weights @ x_q) <= 1e-13
    out = np.full((n, d), np.nan)
    queries_product(weights, x_k, out, i0, n, t, t, causal, fn)
    assert rel_err(out, weights.T @ x_k) <= 1e-13


def test_structured_masks_take_the_skipping_path():
    """Causal and padding masks must be recognised, else the kernel computes the hidden part."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, H, T, D))
    lengths = np.array([T, 77])
    cases = {
        "causal": (causal_mask(T), True, [T, T]),
        "causal (1,1,T,T)": (causal_mask(T)[None, None], True, [T, T]),
        "padding": (key_padding_mask(lengths, T), False, lengths),
        "causal+padding": (combine_masks(causal_mask(T), key_padding_mask(lengths, T)), True,
                           lengths),
    }
    for name, (mask, causal, kv_len) in cases.items():
        cache = ker.sdpa_forward(q, q, q, mask)[1]
        assert cache.causal == causal and not cache.has_mask, name
        assert cache.kv_len.tolist() == list(kv_len), name
    for name, mask in {"per-head mask": rng.random((1, H, T, T)) < 0.5,
                       "sliding window": np.tri(T, k=0, dtype=bool) & ~np.tri(T, k=-5, dtype=bool),
                       "non-prefix keys": np.arange(T) % 2 == 0}.items():
        cache = ker.sdpa_forward(q, q, q, mask)[1]
        assert cache.has_mask and not cache.causal, name


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_masked_positions_get_exact_zeros(dtype):
    rng = np.random.default_rng(1)
    _, _, mask, _ = make_case("arbitrary", rng)
    _, (out, dq, dk, dv), _ = run_both(T, T, mask, None, dtype, rng)
    # a query that may attend nothing: zero output, zero gradient, never NaN
    assert not out[1, 2, 5].any() and not dq[1, 2, 5].any()
    # a key nobody attends contributes nothing and receives no gradient
    assert not dk[0, :, 9].any() and not dv[0, :, 9].any()
    # a sequence whose keys are all padding: everything is exactly zero
    pad = key_padding_mask(np.array([T, 0]), T)
    _, (out, dq, dk, dv), _ = run_both(T, T, combine_masks(causal_mask(T), pad), None, dtype, rng)
    for name, x in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
        assert not x[1].any(), name
    # padded keys of the other sequence: zero dk, dv
    _, (out, dq, dk, dv), _ = run_both(T, T, key_padding_mask(np.array([50, T]), T), None,
                                       dtype, rng)
    assert not dk[0, :, 50:].any() and not dv[0, :, 50:].any()


@pytest.mark.parametrize("kind", ["none", "causal", "arbitrary"])
def test_backward_split_into_chunks(kind, monkeypatch):
    """With fewer (batch, head) pairs than threads, query blocks are shared out in chunks."""
    monkeypatch.setattr(ker.numba, "get_num_threads", lambda: 4)  # 3 chunks for B * H = 1
    rng = np.random.default_rng(2)
    t_q, t_k, mask, bias = make_case(kind, rng)
    if mask is not None:
        mask = mask[:1, :1]
    want, got, _ = run_both(t_q, t_k, mask, bias, np.float64, rng, b=1, h=1)
    for name, w, g in zip(("out", "dq", "dk", "dv"), want, got, strict=True):
        assert rel_err(g, w) <= TOL[np.float64], f"{kind}: {name}"


@pytest.mark.parametrize("kind", ["causal+padding", "alibi+causal", "arbitrary",
                                  "causal, dropout"])
def test_kernel_gradients_by_finite_differences(kind):
    """The kernel's backward differentiates the kernel's own forward (tiny float64 shapes;
    dropout's multipliers fixed, as a module draws them once per forward)."""
    rng = np.random.default_rng(3)
    t = 6
    mask = {"causal+padding": combine_masks(causal_mask(t), key_padding_mask(np.array([t, 4]), t)),
            "alibi+causal": causal_mask(t), "arbitrary": rng.random((2, 1, t, t)) < 0.6,
            "causal, dropout": causal_mask(t)}[kind]
    bias = alibi_bias(2, t, t) if kind == "alibi+causal" else None
    drop = dropout_mask((2, 2, t, t), 0.3, rng, np.float64) if "dropout" in kind else None
    q, k, v = (rng.standard_normal((2, 2, t, 4)) for _ in range(3))
    report = check_op(lambda q, k, v: ker.sdpa_forward(q, k, v, mask, bias, dropout=drop),
                      ker.sdpa_backward, {"q": q, "k": k, "v": v}, title=f"kernel sdpa, {kind}")
    assert report.ok(1e-6), str(report)


def test_non_contiguous_inputs():
    """Inputs that are views (as after splitting heads) give the same result."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((B, T, H, D))
    q = x.transpose(0, 2, 1, 3)  # (B, H, T, D), not contiguous
    out_r, _ = ref.sdpa_forward(q, q, q, causal_mask(T))
    out_k, _ = ker.sdpa_forward(q, q, q, causal_mask(T))
    assert rel_err(out_k, out_r) <= 1e-12


BAD_INPUTS = {
    "q not an array": lambda q, k, v: (q.tolist(), k, v, None, None),
    "q of ints": lambda q, k, v: (q.astype(int), k, v, None, None),
    "q of rank 3": lambda q, k, v: (q[0], k, v, None, None),
    "dtypes differ": lambda q, k, v: (q.astype(np.float32), k, v, None, None),
    "k, v shapes differ": lambda q, k, v: (q, k, v[:, :, :-1], None, None),
    "head widths differ": lambda q, k, v: (q[..., :-1], k, v, None, None),
    "mask not boolean": lambda q, k, v: (q, k, v, np.ones((4, 5)), None),
    "mask wrong shape": lambda q, k, v: (q, k, v, np.ones((5, 4), dtype=bool), None),
    "bias of ints": lambda q, k, v: (q, k, v, None, np.ones((4, 5), dtype=int)),
    "bias wrong shape": lambda q, k, v: (q, k, v, None, np.ones((2, 4, 5))),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_raises_like_reference(name):
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 3, 4, 8))
    k = v = rng.standard_normal((2, 3, 5, 8))
    args = BAD_INPUTS[name](q, k, v)
    with pytest.raises(ValueError) as want:
        ref.sdpa_forward(*args)
    with pytest.raises(ValueError) as got:
        ker.sdpa_forward(*args)
    assert str(got.value) == str(want.value)


def test_bad_upstream_gradient_raises():
    q = np.zeros((1, 1, 4, 8))
    _, cache = ker.sdpa_forward(q, q, q)
    with pytest.raises(ValueError, match="dout"):
        ker.sdpa_backward(np.zeros((1, 1, 5, 8)), cache)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_vectorised_exp_matches_numpy(dtype):
    """The hand-written exp is as accurate as np.exp, and exactly 0 for masked (-inf) scores."""
    x = np.concatenate([-np.geomspace(1e-8, 700 if dtype == np.float64 else 85, 4000),
                        [0.0, -np.inf]]).astype(dtype)
    shift = 0.25
    got = (x + dtype(shift)).astype(dtype)
    exp_shifted_f64(got, len(got), shift) if dtype == np.float64 \
        else exp_shifted_f32(got, len(got), shift)
    want = np.exp((x + dtype(shift)).astype(np.float64) - shift)
    assert got[-1] == 0.0
    ulp = np.finfo(dtype).eps
    assert (np.abs(got[:-1] - want[:-1]) <= 4 * ulp * want[:-1]).all()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_vectorised_exp_gives_nan_for_nan(dtype):
    """NaN in, NaN out, as np.exp: a NaN score must not count as a weight of 0."""
    x = np.array([-1.0, np.nan, -np.inf, -1e4], dtype=dtype)
    exp_shifted_f64(x, 4, 0.0) if dtype == np.float64 \
        else exp_shifted_f32(x, 4, 0.0)
    assert np.isnan(x[1]) and x[2] == 0.0 and x[3] == 0.0 and np.isfinite(x[0])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", ["none", "causal"])
def test_nan_spreads_as_in_the_reference(kind, dtype):
    """A NaN in a key and in a value: every output that attends to them is NaN, and nothing
    is NaN where the reference is finite. Without a mask the two NaN patterns are equal.
    Under a causal mask the reference also spreads the value's NaN to the queries before it
    (its product multiplies the masked weights, 0, by NaN), and the kernel to those of its
    query blocks that reach that key, so there only the inclusion is checked."""
    rng = np.random.default_rng(5)
    q, k, v, g = (rng.standard_normal((B, H, T, D)).astype(dtype) for _ in range(4))
    k[1, 2, 40, 3] = np.nan
    v[0, 1, 150, 0] = np.nan
    mask = causal_mask(T) if kind == "causal" else None
    with np.errstate(invalid="ignore"):
        out_r, cache_r = ref.sdpa_forward(q, k, v, mask=mask)
        grads_r = ref.sdpa_backward(g, cache_r)
    out_k, cache_k = ker.sdpa_forward(q, k, v, mask=mask)
    grads_k = ker.sdpa_backward(g, cache_k)
    k_first, v_first = (0, 0) if kind == "none" else (40, 150)  # first queries to see them
    assert np.isnan(out_k[1, 2, k_first:]).all()
    assert np.isnan(out_k[0, 1, v_first:, 0]).all()
    for got, want in zip((out_k, *grads_k), (out_r, *grads_r), strict=True):
        if kind == "none":
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        else:
            assert not (np.isnan(got) & ~np.isnan(want)).any()


def test_kernel_gradients_merge_heads_for_free():
    """The kernel's dq, dk, dv, like its output, are (B, H, T, D) views of memory laid out
    (B, T, H, D): merging their heads (what the attention module does next) is a reshape."""
    rng = np.random.default_rng(11)
    b, h, t, d = 2, 3, 70, 8
    q, k, v, g = (rng.standard_normal((b, h, t, d)) for _ in range(4))
    out, cache = ker.sdpa_forward(q, k, v, mask=causal_mask(t))
    want = ref.sdpa_backward(g, ref.sdpa_forward(q, k, v, mask=causal_mask(t))[1])
    for got, w in zip((out, *ker.sdpa_backward(g, cache)), (None, *want), strict=True):
        assert np.shares_memory(merge_heads(got), got)
        if w is not None:
            np.testing.assert_allclose(got, w, rtol=0, atol=1e-13)

"""Generation: the key/value cache equals recomputation, the window policy does what the
``numpy_transformer.generate`` docstring promises, and sampling keeps the right tokens."""

from __future__ import annotations

import numpy as np
import pytest

from numpy_transformer.config import POSITIONS
from numpy_transformer.generate import (
    WindowedDecoder,
    generate,
    generate_seq2seq,
    next_token_probs,
    sample_next,
)
from numpy_transformer.nn import (
    DecoderLM,
    EncoderDecoder,
    LearnedPositions,
    SinusoidalPositions,
    TransformerConfig,
)
from numpy_transformer.nn.decoding import KVCache, new_cache

TOL = {"float64": 1e-10, "float32": 1e-5}  # cached vs recomputed logits, max abs difference


def tiny_config(**overrides) -> TransformerConfig:
    options = dict(vocab=11, width=8, heads=2, layers=2, ffn_width=16, max_len=12, seed=3)
    options.update(overrides)
    return TransformerConfig(**options)


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())


# ---------------------------------------------------------------------- the cache


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("norm_first", [True, False])
def test_cached_logits_equal_full_forward(positions, dtype, norm_first):
    model = DecoderLM(tiny_config(positions=positions, dtype=dtype, norm_first=norm_first,
                                  dropout=0.1)).eval()
    ids = np.random.default_rng(0).integers(0, 11, (3, 12))  # fills max_len exactly
    full = model.forward(ids)  # (3, 12, V)
    cache = new_cache(model, 3)
    rows = [model.forward(ids[:, :5], cache=cache)]  # prefill the first 5 positions
    rows += [model.forward(ids[:, t:t + 1], cache=cache) for t in range(5, 12)]  # one by one
    cached = np.concatenate(rows, axis=1)
    assert cached.dtype == np.dtype(dtype)
    assert cache.length == 12
    assert max_diff(cached, full) <= TOL[dtype], f"{positions} {dtype}"


@pytest.mark.parametrize("positions", POSITIONS)
def test_negative_control_a_broken_cache_is_caught(positions):
    """The comparison above can fail: overwrite the last cached position (as an off-by-one in
    the cache bookkeeping would) and the logits leave the tolerance by far."""
    model = DecoderLM(tiny_config(positions=positions)).eval()
    ids = np.random.default_rng(6).integers(0, 11, (2, 8))
    cache = new_cache(model, 2)
    model.forward(ids[:, :7], cache=cache)
    for block in cache.blocks:
        block.attn.length -= 1  # the bug: the next token lands on position 6, not 7
    broken = model.forward(ids[:, 7:], cache=cache)[:, -1]
    assert max_diff(broken, model.forward(ids)[:, -1]) > 1e-3


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("positions", POSITIONS)
def test_cached_prefill_in_chunks(positions, backend):
    """Several new positions after cached ones: the causal mask of the last T_new queries
    (the prefill goes through the attention backend, so both are checked)."""
    if backend == "numba":
        pytest.importorskip("numba")
    model = DecoderLM(tiny_config(positions=positions, norm="rmsnorm", activation="swiglu",
                                  tie_embeddings=True, backend=backend)).eval()
    ids = np.random.default_rng(1).integers(0, 11, (2, 10))
    cache = new_cache(model, 2)
    chunks = [model.forward(ids[:, a:b], cache=cache) for a, b in ((0, 3), (3, 7), (7, 10))]
    assert max_diff(np.concatenate(chunks, axis=1), model.forward(ids)) <= 1e-10


def test_a_cached_forward_keeps_nothing_for_a_backward():
    """Decoding is inference only: after a forward with a cache, the attention refuses a
    backward instead of differentiating keys and values it took from the cache."""
    model = DecoderLM(tiny_config())
    model.forward(np.zeros((1, 4), dtype=int))  # training mode: a cache for the backward
    assert model.decoder.blocks[0].attn.cache is not None
    model.forward(np.zeros((1, 2), dtype=int), cache=new_cache(model, 1))
    assert model.decoder.blocks[0].attn.cache is None
    with pytest.raises(ValueError, match="forward"):
        model.decoder.blocks[0].attn.backward(np.zeros((1, 2, 8)))


def test_kv_cache_overflow_and_reset():
    cache = KVCache(batch=1, heads=2, capacity=3, head_width=4)
    k = np.ones((1, 2, 2, 4))
    keys, values = cache.append(k, 2 * k)
    assert keys.shape == (1, 2, 2, 4) and cache.length == 2
    np.testing.assert_array_equal(values, 2 * k)
    with pytest.raises(ValueError, match="2 of 3 positions"):
        cache.append(k, k)
    cache.reset()
    assert cache.length == 0 and cache.append(k, k)[0].shape[2] == 2


def test_new_cache_takes_only_models_that_decode():
    """A cache per self-attention for a DecoderLM, per cross-attention too for an
    EncoderDecoder; a classifier or an LSTM (whose state is its own) is refused."""
    from numpy_transformer.nn import LSTMLM, EncoderClassifier, LSTMConfig

    assert all(b.cross_attn is None for b in new_cache(DecoderLM(tiny_config()), 2).blocks)
    assert all(b.cross_attn is not None for b in new_cache(EncoderDecoder(tiny_config()), 2).blocks)
    for model in (EncoderClassifier(tiny_config(num_classes=3)),
                  LSTMLM(LSTMConfig(vocab=11, hidden=4, max_len=8))):
        with pytest.raises(ValueError, match="needs a DecoderLM or an EncoderDecoder, got"):
            new_cache(model, 1)
    with pytest.raises(ValueError, match="batch must be a positive integer"):
        new_cache(DecoderLM(tiny_config()), 0)


def test_cached_positions_beyond_max_len_raise():
    model = DecoderLM(tiny_config(max_len=4)).eval()
    cache = new_cache(model, 1)
    model.forward(np.zeros((1, 4), dtype=int), cache=cache)
    with pytest.raises(ValueError, match="outside the position table"):
        model.forward(np.zeros((1, 1), dtype=int), cache=cache)


@pytest.mark.parametrize("table", [SinusoidalPositions, LearnedPositions])
def test_positions_forward_at_offsets(table):
    module = table(6, 4)
    x = np.random.default_rng(0).standard_normal((2, 6, 4))
    np.testing.assert_array_equal(module.forward(x[:, 2:5], start=2), module.forward(x)[:, 2:5])
    with pytest.raises(ValueError, match="positions 4 .. 6"):
        module.forward(x[:, :3], start=4)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("norm_first", [True, False])
def test_encoder_decoder_cache_equals_full_forward(dtype, norm_first):
    model = EncoderDecoder(tiny_config(dtype=dtype, norm_first=norm_first)).eval()
    rng = np.random.default_rng(2)
    src, tgt = rng.integers(0, 11, (2, 7)), rng.integers(0, 11, (2, 9))
    src_lengths = np.array([7, 4])  # the second source is padded
    full = model.forward(src, tgt, src_lengths)
    cache = new_cache(model, 2)
    rows = [model.forward(src, tgt[:, :2], src_lengths, cache=cache)]  # encodes the source
    rows += [model.forward(src, tgt[:, t:t + 1], src_lengths, cache=cache)
             for t in range(2, 9)]
    assert max_diff(np.concatenate(rows, axis=1), full) <= TOL[dtype]


def test_generate_seq2seq_cached_equals_uncached():
    model = EncoderDecoder(tiny_config())
    src = np.random.default_rng(3).integers(0, 11, (2, 6))
    start = np.zeros((2, 1), dtype=int)
    runs = [generate_seq2seq(model, src, start, 8, np.random.default_rng(4), src_lengths=[6, 3],
                             use_cache=use_cache) for use_cache in (True, False)]
    np.testing.assert_array_equal(runs[0], runs[1])
    assert runs[0].shape == (2, 9) and model.training  # mode restored
    with pytest.raises(ValueError, match="exceed max_len=12"):
        generate_seq2seq(model, src, start, 12, None, greedy=True)


# ---------------------------------------------------------------------- the window policy


def expected_windows(prompt_len: int, steps: int, max_len: int, keep: int) -> list[int]:
    """The documented rule: L = min(T, max_len); then L + 1, or keep when L == max_len."""
    windows = [min(prompt_len, max_len)]
    for _ in range(steps):
        windows.append(keep if windows[-1] == max_len else windows[-1] + 1)
    return windows


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("policy, keep", [("refill", None), ("refill", 4), ("recompute", None)])
def test_window_policy_logits_are_forward_of_the_window(positions, policy, keep):
    """Every step, cached or not, the logits are model.forward of the last `window` tokens,
    and `window` follows the documented rule, far beyond max_len."""
    model = DecoderLM(tiny_config(positions=positions, max_len=8)).eval()
    rng = np.random.default_rng(5)
    steps = 25
    keep_used = {"recompute": 8}.get(policy, 4 if keep is None else keep)
    windows = expected_windows(5, steps, 8, keep_used)
    decoders = [WindowedDecoder(model, use_cache=c, policy=policy, keep=keep)
                for c in (True, False)]
    prompt = rng.integers(0, 11, (2, 5))
    logits = [d.start(prompt) for d in decoders]
    for step in range(steps + 1):
        ids = decoders[0].ids
        reference = model.forward(ids[:, -windows[step]:])[:, -1]
        assert decoders[0].window == decoders[1].window == windows[step]
        assert max_diff(logits[0], reference) <= 1e-10, f"cached, step {step}"
        assert max_diff(logits[1], reference) <= 1e-10, f"uncached, step {step}"
        if step < steps:
            next_ids = rng.integers(0, 11, 2)
            logits = [d.append(next_ids) for d in decoders]
    # the cache re-encodes the window only when it is cut back (after a full window);
    # without the cache every step is a full forward
    cuts = sum(1 for window in windows[:-1] if window == 8)
    assert decoders[0].prefills == 1 + cuts
    assert decoders[1].prefills == 1 + steps


def test_recompute_without_cache_is_the_chapter_sampler():
    """policy="recompute", use_cache=False: each step logits of ids[:, -max_len:]."""
    model = DecoderLM(tiny_config(max_len=6))
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    got = generate(model, prompt, 15, np.random.default_rng(7), use_cache=False,
                   policy="recompute", top_k=5)
    rng, ids = np.random.default_rng(7), prompt
    model.eval()
    for _ in range(15):  # the chapter's loop
        logits = model.forward(ids[:, -6:])[:, -1]
        ids = np.concatenate([ids, sample_next(logits, rng, top_k=5)[:, None]], axis=1)
    np.testing.assert_array_equal(got, ids)


@pytest.mark.parametrize("policy", ["refill", "recompute"])
@pytest.mark.parametrize("positions", POSITIONS)
def test_generate_cached_equals_uncached_beyond_max_len(policy, positions):
    model = DecoderLM(tiny_config(positions=positions, max_len=6))
    prompt = np.array([3, 1, 4, 1])
    runs = [generate(model, prompt, 20, np.random.default_rng(8), use_cache=c, policy=policy)
            for c in (True, False)]
    np.testing.assert_array_equal(runs[0], runs[1])
    assert runs[0].shape == (24,)


def test_refill_differs_from_recompute_only_after_max_len():
    """The two policies read the same window until the sequence first exceeds max_len; then
    refill reads the last `keep` tokens (positions restart at 0) and recompute max_len."""
    model = DecoderLM(tiny_config(positions="sinusoidal", max_len=6)).eval()
    refill, recompute = (WindowedDecoder(model, policy=p) for p in ("refill", "recompute"))
    prompt = np.array([[2, 7, 1]])
    a, b = refill.start(prompt), recompute.start(prompt)
    for token in [8, 2, 8]:  # the sequence grows to 6 = max_len
        assert max_diff(a, b) <= 1e-12
        a, b = refill.append([token]), recompute.append([token])
    assert max_diff(a, b) <= 1e-12 and refill.window == recompute.window == 6
    a, b = refill.append([1]), recompute.append([1])  # 7 tokens: refill keeps 3, recompute 6
    assert (refill.window, recompute.window) == (3, 6)
    assert max_diff(a, b) > 1e-3


def test_prompt_longer_than_max_len_is_cropped():
    model = DecoderLM(tiny_config(max_len=5))
    prompt = np.arange(9) % 11
    out = generate(model, prompt, 3, None, greedy=True)
    np.testing.assert_array_equal(out[:9], prompt)
    model.eval()
    first = int(model.forward(prompt[None, -5:])[0, -1].argmax())
    assert out[9] == first


# ---------------------------------------------------------------------- generate()


def test_generate_shapes_determinism_and_mode():
    model = DecoderLM(tiny_config(dropout=0.2))
    assert model.training
    out = generate(model, [[1, 2], [3, 4]], 6, np.random.default_rng(0), temperature=0.8,
                   top_p=0.9)
    assert out.shape == (2, 8) and out.dtype == np.int64
    np.testing.assert_array_equal(out[:, :2], [[1, 2], [3, 4]])
    assert ((out >= 0) & (out < 11)).all()
    assert model.training  # restored
    again = generate(model, [[1, 2], [3, 4]], 6, np.random.default_rng(0), temperature=0.8,
                     top_p=0.9)
    np.testing.assert_array_equal(out, again)
    model.eval()
    generate(model, [1], 2, None, greedy=True)
    assert not model.training
    np.testing.assert_array_equal(generate(model, [5, 6], 0, None, greedy=True), [5, 6])


def test_generate_greedy_equals_argmax_of_forward():
    model = DecoderLM(tiny_config(positions="rope")).eval()
    out = generate(model, [4, 2], 5, None, greedy=True)
    for t in range(2, 7):
        assert out[t] == model.forward(out[None, :t])[0, -1].argmax()


@pytest.mark.parametrize("kwargs, match", [
    (dict(prompt_ids=[1, 11]), "holds id 11"),
    (dict(prompt_ids=[-1]), "holds id -1"),
    (dict(prompt_ids=[1.0, 2.0]), "integer token ids"),
    (dict(prompt_ids=np.zeros(0, dtype=int)), "T >= 1"),
    (dict(prompt_ids=np.zeros((1, 2, 2), dtype=int)), r"shape \(T,\) or \(B, T\)"),
    (dict(steps=-1), "steps must be an integer >= 0, got -1"),
    (dict(steps=2.0), "got 2.0"),
    (dict(policy="slide"), "policy must be one of .* got 'slide'"),
    (dict(policy="recompute", keep=3), "keep=3 applies to policy='refill'"),
    (dict(keep=0), r"keep must be an integer in \[1, max_len=12\], got 0"),
    (dict(keep=13), "got 13"),
    (dict(temperature=0.0), "temperature must be a finite number > 0, got 0.0"),
    (dict(top_k=0), "top_k must be an integer >= 1 .* got 0"),
    (dict(top_p=1.5), r"top_p must lie in \(0, 1\] .* got 1.5"),
    (dict(rng=42), "rng must be a np.random.Generator .* got int"),
    (dict(vocab=0), r"vocab must be an integer in \[1, 11\]"),
    (dict(vocab=12), "got 12"),
])
def test_generate_bad_inputs(kwargs, match):
    model = DecoderLM(tiny_config())
    args = dict(model=model, prompt_ids=[1, 2], steps=2, rng=np.random.default_rng(0))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        generate(**args)


def test_generate_rejects_other_models():
    model = EncoderDecoder(tiny_config())
    with pytest.raises(ValueError, match="needs a DecoderLM or an LSTMLM, got EncoderDecoder"):
        generate(model, [1], 1, None, greedy=True)


@pytest.mark.parametrize("kwargs, match", [
    (dict(steps=-1), "steps must be an integer >= 0, got -1"),
    (dict(steps=True), "got True"),
    (dict(temperature=-2.0), "temperature must be a finite number > 0, got -2.0"),
    (dict(top_k=1.5), "top_k must be an integer >= 1 .* got 1.5"),
    (dict(top_p=0.0), r"top_p must lie in \(0, 1\] .* got 0.0"),
    (dict(rng=None), "rng must be a np.random.Generator when sampling, got NoneType"),
    (dict(src_ids=[[1, 2]]), "must hold the same number of sequences"),
    (dict(model=DecoderLM(tiny_config())), "needs an EncoderDecoder, got DecoderLM"),
])
def test_generate_seq2seq_bad_inputs(kwargs, match):
    """The loop shares generate's checks: each bad value is refused before any decoding."""
    args = dict(model=EncoderDecoder(tiny_config()), src_ids=[[1, 2], [3, 4]],
                start_ids=[[0], [0]], steps=2, rng=np.random.default_rng(0))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        generate_seq2seq(**args)


@pytest.mark.parametrize("family", ["decoder", "seq2seq"])
def test_mode_restored_when_a_step_raises(family):
    """Eval mode lasts as long as the loop, even one a failing forward ends early."""
    model = (DecoderLM if family == "decoder" else EncoderDecoder)(tiny_config(dropout=0.1))

    def failing_forward(*args, **kwargs):
        assert not model.training  # the loop runs in eval mode
        raise RuntimeError("forward failed")

    model.forward = failing_forward
    with pytest.raises(RuntimeError, match="forward failed"):
        if family == "decoder":
            generate(model, [1, 2], 3, np.random.default_rng(0))
        else:
            generate_seq2seq(model, [1, 2], [0], 3, np.random.default_rng(0))
    assert model.training


def test_sampling_stays_importable_from_generate():
    """sample_next and next_token_probs live in sampling.py; generate re-exports them."""
    from numpy_transformer import generate as generate_module
    from numpy_transformer import sampling

    assert sample_next is sampling.sample_next
    assert next_token_probs is sampling.next_token_probs
    assert all(hasattr(generate_module, name) for name in generate_module.__all__)


def test_check_sampling_allows_no_rng_only_when_greedy():
    from numpy_transformer.sampling import check_sampling

    check_sampling(None, temperature=0.5, top_k=3, top_p=0.9, greedy=True)
    with pytest.raises(ValueError, match="rng must be a np.random.Generator .* got int"):
        check_sampling(0, temperature=0.5)
    with pytest.raises(ValueError, match="top_p must lie in .* got 2"):
        check_sampling(None, top_p=2, greedy=True)  # greedy does not excuse a bad option


# ---------------------------------------------------------------------- sampling


def test_greedy_is_argmax():
    logits = np.random.default_rng(0).standard_normal((4, 9))
    np.testing.assert_array_equal(sample_next(logits, None, greedy=True), logits.argmax(-1))
    one = sample_next(logits[0], None, greedy=True)
    assert isinstance(one, int) and one == logits[0].argmax()


def test_temperature_scales_logits_and_goes_greedy_as_it_shrinks():
    logits = np.array([[1.0, 2.0, 0.5, 1.9]])
    for t in (0.5, 1.0, 3.0):
        z = logits / t
        np.testing.assert_allclose(next_token_probs(logits, temperature=t),
                                   np.exp(z) / np.exp(z).sum(), rtol=1e-12)
    np.testing.assert_allclose(next_token_probs(logits, temperature=1e-3), [[0, 1, 0, 0]],
                               atol=1e-40)
    rng = np.random.default_rng(1)
    draws = [sample_next(logits[0], rng, temperature=1e-3) for _ in range(300)]
    assert set(draws) == {1}
    hot = {sample_next(logits[0], rng, temperature=1.0) for _ in range(300)}
    assert hot == {0, 1, 2, 3}  # at T = 1 every token is drawn sometimes


def test_top_k_never_samples_outside_the_k_best():
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((3, 20)) * 0.3  # flat: without top-k all 20 would appear
    best = np.argsort(-logits, axis=-1)[:, :5]
    draws = np.stack([sample_next(logits, rng, top_k=5) for _ in range(2000)])  # (2000, 3)
    for b in range(3):
        assert set(draws[:, b]) == set(best[b])  # only the 5 best, and each of them
    p = next_token_probs(logits, top_k=5)
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-12)
    kept = np.exp(np.take_along_axis(logits, best, -1))
    np.testing.assert_allclose(np.take_along_axis(p, best, -1),
                               kept / kept.sum(-1, keepdims=True), rtol=1e-12)
    assert (p > 0).sum() == 15
    np.testing.assert_array_equal(next_token_probs(logits, top_k=50),
                                  next_token_probs(logits))  # k >= V keeps everything


@pytest.mark.parametrize("top_p, kept", [(0.45, [0.5]), (0.75, [0.5, 0.3]),
                                         (0.9, [0.5, 0.3, 0.15]), (1.0, [0.5, 0.3, 0.15, 0.05])])
def test_top_p_keeps_the_smallest_prefix_reaching_p(top_p, kept):
    probs = np.array([0.15, 0.5, 0.05, 0.3])  # unsorted on purpose
    p = next_token_probs(np.log(probs)[None], top_p=top_p)[0]
    expected = np.where(np.isin(probs, kept), probs, 0.0)
    np.testing.assert_allclose(p, expected / expected.sum(), rtol=1e-12, atol=1e-15)
    rng = np.random.default_rng(3)
    draws = {sample_next(np.log(probs), rng, top_p=top_p) for _ in range(500)}
    assert draws == set(np.flatnonzero(np.isin(probs, kept)))


def test_top_k_then_top_p():
    probs = np.array([0.4, 0.3, 0.2, 0.1])
    # top-k 3 renormalises to 4/9, 3/9, 2/9; top-p 0.7 then keeps the first two (7/9 >= 0.7)
    p = next_token_probs(np.log(probs)[None], top_k=3, top_p=0.7)[0]
    np.testing.assert_allclose(p, [4 / 7, 3 / 7, 0, 0], rtol=1e-12)


def test_masked_tokens_are_never_sampled():
    logits = np.array([-np.inf, 0.0, -np.inf, 0.0, -np.inf])
    rng = np.random.default_rng(4)
    assert {sample_next(logits, rng) for _ in range(300)} == {1, 3}


@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature=0), "temperature .* got 0"),
    (dict(temperature=-1.0), "got -1.0"),
    (dict(temperature=float("nan")), "got nan"),
    (dict(temperature=float("inf")), "got inf"),
    (dict(temperature=True), "got True"),
    (dict(top_k=0), "top_k .* got 0"),
    (dict(top_k=2.5), "got 2.5"),
    (dict(top_k=True), "got True"),
    (dict(top_p=0.0), r"top_p must lie in \(0, 1\] .* got 0.0"),
    (dict(top_p=1.01), "got 1.01"),
    (dict(top_p=-0.5), "got -0.5"),
    (dict(logits=np.array([1, 2, 3])), "float array .* dtype int"),
    (dict(logits=np.zeros((2, 2, 2))), r"shape \(2, 2, 2\)"),
    (dict(logits=np.array([0.0, np.nan])), "NaN"),
    (dict(logits=np.array([0.0, np.inf])), r"\+inf"),
    (dict(logits=np.array([[0.0, 1.0], [-np.inf, -np.inf]])), "no finite entry"),
    (dict(rng=None), "rng must be a np.random.Generator .* got NoneType"),
])
def test_sampling_bad_inputs(kwargs, match):
    args = dict(logits=np.array([0.0, 1.0, 2.0]), rng=np.random.default_rng(0))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        sample_next(**args)


@pytest.mark.parametrize("policy", ["refill", "recompute"])
def test_max_len_one_reads_only_the_last_token(policy):
    model = DecoderLM(tiny_config(max_len=1, positions="learned"))
    out = generate(model, [2, 9], 4, None, greedy=True, policy=policy)
    model.eval()
    for t in range(2, 6):
        assert out[t] == model.forward(out[None, t - 1:t])[0, -1].argmax()


def test_generate_without_an_rng_draws_from_a_fresh_one():
    """docs/python.md's ``generate(model, ids, steps=300)``: no generator given, a fresh unseeded
    one draws (two calls differ); greedy needs none."""
    model = DecoderLM(tiny_config())
    outs = {tuple(generate(model, [1, 2], 30, temperature=2.0)) for _ in range(3)}
    assert len(outs) > 1 and all(len(o) == 32 for o in outs)
    np.testing.assert_array_equal(generate(model, [1, 2], 5, greedy=True),
                                  generate(model, [1, 2], 5, None, greedy=True))


def test_generate_draws_only_ids_below_vocab():
    """A tokenizer with fewer ids than the model has rows: the rows above are never drawn,
    whatever their logits (here the largest)."""
    model = DecoderLM(tiny_config())
    model.head.params["b"][8:] = 100.0  # ids 8, 9, 10 would win every draw
    out = generate(model, [1, 2], 40, np.random.default_rng(0), vocab=8)
    assert out[2:].max() < 8
    assert generate(model, [1, 2], 5, greedy=True)[2:].min() >= 8  # the control

"""Inference keeps nothing: a forward in evaluation mode, or inside ``model.no_grad()``, keeps
no cache and copies no weight, a backward after it raises ``ValueError`` in one sentence, and
generation allocates its key/value buffers once, not per token.

"Copies no weight" is measured, not assumed: the bytes a forward allocates (``tracemalloc``)
in a model whose weights dwarf its activations (a wide vocabulary, two tokens). In training
mode the same forward copies every weight into its caches: the negative control.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from numpy_transformer import nn
from numpy_transformer.config import BACKENDS
from numpy_transformer.generate import generate
from numpy_transformer.nn import LSTMLM, DecoderLM, LSTMConfig, TransformerConfig
from numpy_transformer.nn.decoding import KVCache

TOKENS = np.array([[1, 2]])


def wide_model(backend: str, **overrides) -> DecoderLM:
    """Weights of about 2.6 MB (an untied head and a table of 4,000 x 64), activations of a
    few kB for two tokens."""
    config = dict(vocab=4000, width=64, heads=4, layers=2, ffn_width=256, max_len=16,
                  dtype="float32", backend=backend, tie_embeddings=False, seed=1)
    return DecoderLM(TransformerConfig(**{**config, **overrides}))


def weight_bytes(model) -> int:
    """The weights a training forward copies into its caches: all but the token table (a
    lookup keeps the ids only)."""
    return sum(p.nbytes for name, p, _ in model.named_parameters()
               if not name.endswith("tokens.table") and name != "embed.table")


def allocated_by(forward) -> int:
    """The peak bytes ``forward()`` allocates (and may keep) beyond what was there."""
    forward()  # the first call compiles or loads what it calls
    tracemalloc.start()
    try:
        forward()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_inference_forward_copies_no_weight_and_keeps_no_cache(backend):
    model = wide_model(backend)
    weights = weight_bytes(model)
    trained = allocated_by(lambda: model.train().forward(TOKENS))
    assert trained > weights  # the control: the caches copy every weight
    for mode, forward in (("eval", lambda: model.eval().forward(TOKENS)),
                          ("no_grad", lambda: _no_grad_forward(model.train()))):
        used = allocated_by(forward)
        assert used < weights / 4, (mode, used, weights)  # the logits and a few activations
        assert all(getattr(m, "cache", None) is None for _, m in model.named_modules()
                   if not isinstance(m, nn.LearnedPositions)), mode


def _no_grad_forward(model):
    with model.no_grad():
        return model.forward(TOKENS)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_backward_after_an_inference_forward_is_refused_in_one_sentence(backend):
    model = wide_model(backend)
    dlogits = np.ones((1, 2, 4000), np.float32)
    model.eval().forward(TOKENS)
    with pytest.raises(ValueError, match="evaluation mode or inside no_grad") as refused:
        model.backward(dlogits)
    assert "\n" not in str(refused.value)
    with model.train().no_grad():
        model.forward(TOKENS)
    with pytest.raises(ValueError, match="kept nothing for a backward"):
        model.backward(dlogits)
    assert all(m.grad_enabled is None for _, m in model.named_modules())  # restored
    model.forward(TOKENS)  # training mode, outside the block: the backward runs
    model.backward(dlogits)
    with model.eval().enable_grad():  # evaluation mode with a backward: no dropout
        model.forward(TOKENS)
    model.backward(dlogits)


def test_an_lstm_infers_without_copies_too():
    model = LSTMLM(LSTMConfig(vocab=4000, embed=64, hidden=64, max_len=16, dtype="float32",
                              seed=1))
    weights = weight_bytes(model)
    assert allocated_by(lambda: model.train().forward(TOKENS)) > weights / 4  # w_ih, w_hh copied
    assert allocated_by(lambda: model.eval().forward(TOKENS)) < weights / 8
    with pytest.raises(ValueError, match="evaluation mode"):
        model.backward(np.ones((1, 2, 4000), np.float32))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kv_heads", [None, 2])
def test_generation_allocates_its_key_value_buffers_once(backend, kv_heads, monkeypatch):
    """One KVCache per block for the whole generation, and a decoding step's memory does not
    grow with the positions held: nothing copies the cache (grouped-query heads included, on
    the numba backend; the NumPy reference repeats the kv heads, ``repeat_kv``, as it reads)."""
    made = []
    init = KVCache.__init__

    def counted(self, *args, **kwargs):
        made.append(args)
        init(self, *args, **kwargs)

    monkeypatch.setattr(KVCache, "__init__", counted)
    model = wide_model(backend, max_len=512, kv_heads=kv_heads, vocab=64).eval()
    prompt = np.arange(8)
    out = generate(model, prompt, 40, greedy=True)
    assert len(made) == model.config.layers and len(out) == 48
    from numpy_transformer.generate import WindowedDecoder

    decoder = WindowedDecoder(model)
    decoder.start(np.zeros((1, 400), dtype=int))  # a cache of 400 positions
    cache = decoder.cache.blocks[0].attn
    step = allocated_by(lambda: decoder.append(np.array([3])))
    if kv_heads is None or backend == "numba":
        assert step < cache.k[:, :, :cache.length].nbytes, step  # less than a layer's keys


def test_negative_control_a_step_that_copies_the_cache_is_seen(monkeypatch):
    """The measure above catches a decoding step that copies its keys: one that does."""
    model = wide_model("numpy", max_len=512, vocab=64).eval()
    from numpy_transformer.generate import WindowedDecoder

    decoder = WindowedDecoder(model)
    decoder.start(np.zeros((1, 400), dtype=int))
    kept = KVCache.kept
    monkeypatch.setattr(KVCache, "kept", lambda self: tuple(a.copy() for a in kept(self)))
    cache = decoder.cache.blocks[0].attn
    assert allocated_by(lambda: decoder.append(np.array([3]))) >= \
        cache.k[:, :, :cache.length].nbytes

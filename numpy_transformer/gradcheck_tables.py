"""The gradient-check tables: every op, module and model family against finite differences.

``numpy-transformer gradcheck`` prints them. It is the first thing to run when studying the
gradients: each table row is one named tensor, with the worst absolute and relative error of
the hand-written backward against central differences in float64.

Every table checks the readable references of ``numpy_transformer/functional``: the ops
directly, the modules and the models on the ``"numpy"`` backend. Those are the backwards
written by hand, the ones a reader studies; the compiled kernels are a second implementation
of the same functions, held to the references' numbers by the test suite
(``tests/test_kernel*.py``) and in training. Checking the models on the numba backend would
also compile every kernel in float64 (about half a minute on two cores, before any check
runs) and prove nothing more about the hand-written gradients.

The choices come from the registries of ``numpy_transformer.config``: every activation and
every norm has its row among the ops, every positional scheme its model among the models, so
a name added there is checked here without an edit.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator

import numpy as np

from . import functional as F
from .config import ACTIVATIONS, GATED_ACTIVATIONS, NORM_PAIRS, POSITIONS
from .gradcheck import GradcheckReport, check_direction, check_module, check_op


def _loss_forward(loss_forward: Callable, targets: np.ndarray) -> Callable:
    """A loss's forward of the differentiable arrays alone, its loss as a 0-d array."""
    def forward(*arrays):
        loss, cache = loss_forward(*arrays, targets)
        return np.array(loss), cache
    return forward


def op_checks(rng: np.random.Generator) -> Iterator[Callable[[], GradcheckReport]]:
    """One thunk per functional op; each returns its report when called."""
    x = rng.normal(size=(2, 3, 6))
    w, b = rng.normal(size=6), rng.normal(size=6)
    q, k, v = (rng.normal(size=(2, 2, 4, 4)) for _ in range(3))
    ids = np.array([[0, 2, 2], [4, 2, 1]])
    targets = rng.integers(0, 6, size=(2, 3))
    targets[0, 0] = -100
    cos, sin = F.rope_tables(4, 4)
    padded = F.combine_masks(F.causal_mask(4), F.key_padding_mask(np.array([4, 2]), 4))
    yield lambda: check_op(F.linear_forward, F.linear_backward,
                           {"x": x.copy(), "w": rng.normal(size=(6, 5)), "b": rng.normal(size=5)},
                           title="linear")
    yield lambda: check_op(lambda t: F.embedding_forward(ids, t), F.embedding_backward,
                           {"table": rng.normal(size=(5, 4))}, title="embedding (repeated ids)")
    for name in ACTIVATIONS:  # elementwise: x; gated: gate and up (config.GATED_ACTIVATIONS)
        fwd, bwd = getattr(F, f"{name}_forward"), getattr(F, f"{name}_backward")
        gated = name in GATED_ACTIVATIONS
        yield lambda fwd=fwd, bwd=bwd, name=name, gated=gated: check_op(
            fwd, bwd, {"gate": x.copy(), "up": rng.normal(size=x.shape)} if gated
            else {"x": x.copy()}, title=name)
    yield lambda: check_op(F.softmax_forward, F.softmax_backward, {"x": x.copy()}, title="softmax")
    yield lambda: check_op(_loss_forward(F.cross_entropy_forward, targets),
                           F.cross_entropy_backward, {"logits": x.copy()},
                           title="cross-entropy (one ignored target)")
    yield lambda: check_op(_loss_forward(F.linear_cross_entropy_forward, targets),
                           F.linear_cross_entropy_backward,
                           {"x": x.copy(), "w": rng.normal(size=(6, 6)), "b": rng.normal(size=6)},
                           title="output head and its loss (linear + cross-entropy)")
    for name, stem in NORM_PAIRS.items():  # x, then the (C,) gain (and shift) the norm takes
        fwd, bwd = getattr(F, f"{stem}_forward"), getattr(F, f"{stem}_backward")
        arrays = [n for n, p in inspect.signature(fwd).parameters.items() if p.default is p.empty]
        yield lambda fwd=fwd, bwd=bwd, name=name, arrays=arrays: check_op(
            fwd, bwd, dict(zip(arrays, (x.copy(), w, b), strict=False)), title=name)
    yield lambda: check_op(lambda x: (F.rope_forward(x, cos, sin), None),
                           lambda d, _: F.rope_backward(d, cos, sin), {"x": q.copy()},
                           title="rope")
    yield lambda: check_op(lambda q, k, v: F.sdpa_forward(q, k, v, padded, F.alibi_bias(2, 4, 4)),
                           F.sdpa_backward, {"q": q, "k": k, "v": v},
                           title="attention (causal + padding + alibi)")
    drop = F.dropout_mask((2, 2, 4, 4), 0.3, rng, np.float64)  # one fixed mask of the weights
    yield lambda: check_op(lambda q, k, v: F.sdpa_forward(q, k, v, F.causal_mask(4),
                                                          dropout=drop),
                           F.sdpa_backward, {"q": q, "k": k, "v": v},
                           title="attention (causal, dropout 0.3 on the weights)")
    # grouped-query: 4 query heads read 2 kv heads, so dk, dv sum over each group of 2
    yield lambda: check_op(lambda q, k, v: F.sdpa_forward(q, k, v, padded, F.alibi_bias(4, 4, 4)),
                           F.sdpa_backward, {"q": rng.normal(size=(2, 4, 4, 4)),
                                             "k": rng.normal(size=(2, 2, 4, 4)),
                                             "v": rng.normal(size=(2, 2, 4, 4))},
                           title="grouped-query attention (4 heads, 2 kv heads; causal + "
                                 "padding + alibi)")


def module_checks(rng: np.random.Generator) -> Iterator[Callable[[], GradcheckReport]]:
    """Attention (self and cross; multi-head, grouped-query and multi-query), the two blocks
    in both placements."""
    from .nn import DecoderBlock, EncoderBlock, MultiHeadAttention

    x, memory = rng.normal(size=(2, 4, 8)), rng.normal(size=(2, 3, 8))
    causal = F.causal_mask(4)
    ref = "numpy"  # the modules on the readable references, as the ops above
    yield lambda: check_module(MultiHeadAttention(8, 2, rope=True, max_len=4, rng=rng,
                                                  backend=ref),
                               {"x": x.copy()}, mask=causal,
                               title="multi-head self-attention (causal, RoPE)")
    yield lambda: check_module(MultiHeadAttention(8, 2, rng=rng, backend=ref),
                               {"x": x.copy(), "context": memory.copy()},
                               mask=F.key_padding_mask(np.array([3, 2]), 3),
                               title="multi-head cross-attention (key padding)")
    yield lambda: check_module(MultiHeadAttention(8, 4, kv_heads=2, rope=True, max_len=4,
                                                  rng=rng, backend=ref),
                               {"x": x.copy()}, mask=causal,
                               title="grouped-query self-attention (4 heads, 2 kv heads, "
                                     "causal, RoPE)")
    yield lambda: check_module(MultiHeadAttention(8, 4, kv_heads=1, rng=rng, backend=ref),
                               {"x": x.copy(), "context": memory.copy()},
                               mask=F.key_padding_mask(np.array([3, 2]), 3),
                               title="multi-query cross-attention (4 heads, 1 kv head, key "
                                     "padding)")
    for norm_first in (True, False):
        place = "pre-LN" if norm_first else "post-LN"
        yield lambda nf=norm_first, place=place: check_module(
            EncoderBlock(8, 2, 16, norm_first=nf, activation="gelu", rng=rng, backend=ref),
            {"x": x.copy()},
            title=f"encoder block ({place}, GELU, LayerNorm)")
    yield lambda: check_module(
        DecoderBlock(8, 2, 16, cross=True, activation="swiglu", norm="rmsnorm", rng=rng,
                     backend=ref),
        {"x": x.copy(), "memory": memory.copy()},
        title="decoder block (pre-LN, cross-attention, SwiGLU, RMSNorm)")


def _tiny(**choices):
    """The tiny TransformerConfig of the model checks, on the readable references."""
    from .nn import TransformerConfig

    return TransformerConfig(**{**dict(vocab=7, width=8, heads=2, layers=2, ffn_width=16,
                                       max_len=5, num_classes=4, backend="numpy"), **choices})


def model_checks(rng: np.random.Generator) -> Iterator[Callable[[], GradcheckReport]]:
    """The three model families, tiny, every parameter; one random-direction check each; and
    :func:`positional_checks` (on the readable references, as the modules: see the module
    docstring)."""
    from .nn import DecoderLM, EncoderClassifier, EncoderDecoder

    tokens, src = rng.integers(0, 7, size=(2, 5)), rng.integers(0, 7, size=(2, 4))
    models = (
        ("encoder-only classifier (learned positions, post-LN)",
         EncoderClassifier(_tiny(positions="learned", norm_first=False)), {"tokens": tokens}),
        ("decoder-only LM (sinusoidal, tied embeddings)",
         DecoderLM(_tiny(tie_embeddings=True, embed_scale=True)), {"tokens": tokens}),
        ("decoder-only LM (RoPE, SwiGLU, RMSNorm)",
         DecoderLM(_tiny(positions="rope", activation="swiglu", norm="rmsnorm")),
         {"tokens": tokens}),
        ("decoder-only LM (LLaMA's shape: grouped-query attention, 4 heads, 2 kv heads)",
         DecoderLM(_tiny(heads=4, kv_heads=2, positions="rope", activation="swiglu",
                         norm="rmsnorm", bias=False)), {"tokens": tokens}),
        ("encoder-decoder (ALiBi, GELU-tanh)",
         EncoderDecoder(_tiny(positions="alibi", activation="gelu_tanh")),
         {"src": src, "tgt": tokens}),
    )
    for title, model, inputs in models:
        yield lambda m=model, i=inputs, t=title: check_module(m, i, title=t)
        yield lambda m=model, i=inputs, t=title: check_direction(m, i,
                                                                 title=f"{t}: random direction")
    yield from positional_checks(tokens)


def positional_checks(tokens: np.ndarray) -> Iterator[Callable[[], GradcheckReport]]:
    """A decoder-only LM per positional scheme of ``config.POSITIONS``, one random direction
    each, on the (2, 5) ``tokens``."""
    from .nn import DecoderLM

    for positions in POSITIONS:
        yield lambda p=positions: check_direction(
            DecoderLM(_tiny(positions=p)), {"tokens": tokens},
            title=f"decoder-only LM (positions {p!r}): random direction")


def lstm_checks(rng: np.random.Generator) -> Iterator[Callable[[], GradcheckReport]]:
    """The LSTM pair (initial state in, gradients into the output and the final state), a
    two-layer LSTM module, and the LSTMLM (every parameter, and one random direction)."""
    from .nn import LSTM, LSTMLM, LSTMConfig

    x, tokens = rng.normal(size=(2, 4, 3)), rng.integers(0, 7, size=(2, 5))
    state = {"h0": rng.normal(size=(2, 4)), "c0": rng.normal(size=(2, 4))}
    weights = {"w_ih": 0.5 * rng.normal(size=(3, 16)), "w_hh": 0.5 * rng.normal(size=(4, 16)),
               "b": rng.normal(size=16)}

    def forward(*args):  # out, h_T and c_T each get their own random upstream gradient
        out, (h_t, c_t), cache = F.lstm_forward(*args)
        return (out, h_t, c_t), cache

    yield lambda: check_op(forward, lambda g, cache: F.lstm_backward(*g, cache),
                           {"x": x.copy(), **state, **weights},
                           title="lstm (initial state, final state used)")
    yield lambda: check_module(LSTM(3, 4, layers=2, rng=rng, backend="numpy"), {"x": x.copy()},
                               title="LSTM module (2 layers)")
    model = LSTMLM(LSTMConfig(vocab=7, embed=4, hidden=5, layers=2, max_len=5,
                              backend="numpy"))
    title = "LSTM LM (embedding, 2 LSTM layers, linear head)"
    yield lambda: check_module(model, {"tokens": tokens}, title=title)
    yield lambda: check_direction(model, {"tokens": tokens}, title=f"{title}: random direction")


SECTIONS = {"ops": op_checks, "modules": module_checks, "models": model_checks,
            "lstm": lstm_checks}


def print_tables(names: list[str] | None = None, tol: float = 1e-6, seed: int = 0) -> bool:
    """Print the gradient-check tables of the named sections (default: all of them).

    Parameters
    ----------
    names : list of str, optional
        Sections from ``SECTIONS``: ``"ops"``, ``"modules"``, ``"models"``, ``"lstm"``.
    tol : float
        Largest relative error a tensor may have.
    seed : int
        Seed of the inputs, parameters and upstream gradients.

    Returns
    -------
    bool
        True when every check passed.

    Raises
    ------
    ValueError
        For an unknown section name.
    """
    names = list(SECTIONS) if not names else names
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        raise ValueError(f"unknown gradcheck section {unknown[0]!r}; choose from "
                         f"{', '.join(SECTIONS)}")
    rng = np.random.default_rng(seed)
    passed = failed = 0
    for name in names:
        print(f"=== {name} " + "=" * 60, flush=True)
        for check in SECTIONS[name](rng):
            report = check()
            verdict = "ok" if report.ok(tol) else f"FAILED (tolerance {tol:g})"
            print(f"{report}\n  -> {verdict}\n", flush=True)
            passed, failed = (passed + 1, failed) if report.ok(tol) else (passed, failed + 1)
    print(f"{passed} checks passed, {failed} failed (float64 central differences, "
          f"relative error <= {tol:g})")
    return failed == 0

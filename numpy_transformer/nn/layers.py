"""The basic layers: Linear, Embedding, the tied output projection, the two norms, Dropout and
the position-wise feed-forward network.

Each is a thin stateful shell around a pure forward/backward pair from
``numpy_transformer.functional``: ``forward`` stores that pair's cache, ``backward`` passes it
back and adds the parameter gradients into ``grads``.

The layers whose pair has a Numba twin in ``numpy_transformer.kernels`` (Linear, whose rows
the kernel shares out over the threads, the embedding backward, LayerNorm, RMSNorm and exact
GELU; the whole ReLU feed-forward network is one kernel) take a ``backend``, as the attention
does: ``"numpy"`` runs the readable reference, ``"numba"`` the kernel with the same contract.
The choice is made once, in ``__init__``, and stored as the layer's ``forward``/``backward``
pair.
"""

from __future__ import annotations

import numpy as np

from .._checks import check_positive
from ..functional.activations import (
    dropout_backward,
    dropout_forward,
    gelu_backward,
    gelu_forward,
    gelu_tanh_backward,
    gelu_tanh_forward,
    relu_backward,
    relu_forward,
    swiglu_backward,
    swiglu_forward,
)
from ..functional.embedding import embedding_backward, embedding_forward
from ..functional.linear import linear_backward, linear_forward, linear_heads_forward
from ..functional.norms import (
    layer_norm_backward,
    layer_norm_forward,
    rms_norm_backward,
    rms_norm_forward,
)
from .module import Module

ACTIVATION_NAMES = ("relu", "gelu", "gelu_tanh", "swiglu")
NORM_NAMES = ("layernorm", "rmsnorm")
BACKEND_NAMES = ("numpy", "numba")  # as nn.attention.BACKENDS


def _check_backend(backend: str) -> None:
    if backend not in BACKEND_NAMES:
        raise ValueError(f"backend must be one of {BACKEND_NAMES}, got {backend!r}")


def linear_backend(backend: str):
    """``(linear_forward, linear_backward)`` of the backend ``"numpy"`` or ``"numba"``."""
    _check_backend(backend)
    if backend == "numba":
        from ..kernels import linear as fast  # lazy: compiles on first import

        return fast.linear_forward, fast.linear_backward
    return linear_forward, linear_backward


def linear_heads_backend(backend: str):
    """``linear_heads_forward`` (attention's stacked projections, by head) of the backend."""
    _check_backend(backend)
    if backend == "numba":
        from ..kernels import linear as fast  # lazy: compiles on first import

        return fast.linear_heads_forward
    return linear_heads_forward


def _generator(rng: np.random.Generator | None) -> np.random.Generator:
    """The given generator, or a fresh unseeded one (models always pass a seeded generator)."""
    return np.random.default_rng() if rng is None else rng


class Linear(Module):
    """Affine map ``out = x @ w + b`` over the last axis.

    Parameters
    ----------
    in_width, out_width : int
        C_in and C_out.
    bias : bool, default True
    dtype : dtype, default float64
    rng : np.random.Generator, optional
        Source of the initial values.
    backend : {"numpy", "numba"}, default "numpy"
        ``"numba"`` splits the rows over the cores (``kernels/linear.py``).

    Notes
    -----
    ``w`` has shape (C_in, C_out), the transpose of PyTorch's ``nn.Linear.weight``. It is
    initialised as PyTorch does, ``w, b ~ U(-1/sqrt(C_in), 1/sqrt(C_in))``.
    """

    def __init__(self, in_width: int, out_width: int, bias: bool = True, *, dtype=np.float64,
                 rng: np.random.Generator | None = None, backend: str = "numpy") -> None:
        super().__init__()
        self.affine_forward, self.affine_backward = linear_backend(backend)
        check_positive("in_width", in_width, integer=True)
        check_positive("out_width", out_width, integer=True)
        rng = _generator(rng)
        bound = 1.0 / np.sqrt(in_width)
        self.add_param("w", rng.uniform(-bound, bound, (in_width, out_width)).astype(dtype))
        if bias:
            self.add_param("b", rng.uniform(-bound, bound, out_width).astype(dtype))
        self.cache = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x : (..., C_in) -> out : (..., C_out)."""
        out, self.cache = self.affine_forward(x, self.params["w"], self.params.get("b"))
        return out

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """dout : (..., C_out) -> dx : (..., C_in); adds into ``grads["w"]`` and ``grads["b"]``."""
        dx, dw, db = self.affine_backward(dout, self.cache)
        self.grads["w"] += dw
        if db is not None:
            self.grads["b"] += db
        return dx


class Embedding(Module):
    """Token embedding: one learned row of ``table`` (V, C) per token id.

    Parameters
    ----------
    vocab, width : int
        V and C.
    std : float, default 1.0
        Initial values are N(0, std^2) (PyTorch's ``nn.Embedding`` uses std 1).
    dtype : dtype, default float64
    rng : np.random.Generator, optional
    backend : {"numpy", "numba"}, default "numpy"
        The backward's scatter-add: ``np.add.at`` (reference) or a compiled loop.
    """

    def __init__(self, vocab: int, width: int, std: float = 1.0, *, dtype=np.float64,
                 rng: np.random.Generator | None = None, backend: str = "numpy") -> None:
        super().__init__()
        check_positive("vocab", vocab, integer=True)
        check_positive("width", width, integer=True)
        check_positive("std", std)
        _check_backend(backend)
        self.grad_rows = embedding_backward
        if backend == "numba":
            from ..kernels.embedding import embedding_backward as fast  # lazy: compiles

            self.grad_rows = fast
        table = std * _generator(rng).standard_normal((vocab, width))  # N(0, std^2)
        self.add_param("table", table.astype(dtype))
        self.cache = None

    def forward(self, ids: np.ndarray) -> np.ndarray:
        """ids : int (B, T) -> out : (B, T, C). ValueError for non-integer or out-of-range ids."""
        out, self.cache = embedding_forward(ids, self.params["table"])
        return out

    def backward(self, dout: np.ndarray) -> None:
        """Adds ``dout`` (B, T, C) into the rows of ``grads["table"]``; ids have no gradient."""
        self.grads["table"] += self.grad_rows(dout, self.cache)


class TiedOutput(Module):
    """Output projection that reuses an embedding table: ``logits = x @ table^T``.

    It owns no parameter. Its gradient ``dtable = (x^T dout)^T`` is *added* into the
    embedding's own ``grads["table"]``, next to the gradient of the lookup, which is why every
    backward in this library accumulates.

    Parameters
    ----------
    embedding : Embedding
        The input embedding whose table (V, C) doubles as the output weight. It is not
        registered as a child, so the shared table is counted and saved once.
    backend : {"numpy", "numba"}, default "numpy"
        As for :class:`Linear`.

    References
    ----------
    Press & Wolf, "Using the Output Embedding to Improve Language Models", 2017.
    """

    def __init__(self, embedding: Embedding, backend: str = "numpy") -> None:
        super().__init__()
        self.embedding = embedding
        self.affine_forward, self.affine_backward = linear_backend(backend)
        self.cache = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x : (B, T, C) -> logits : (B, T, V)."""
        out, self.cache = self.affine_forward(x, self.embedding.params["table"].T)
        return out

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """dout : (B, T, V) -> dx : (B, T, C); adds into the embedding's ``grads["table"]``."""
        dx, dw, _ = self.affine_backward(dout, self.cache)  # dw is d(table^T), shape (C, V)
        self.embedding.grads["table"] += dw.T
        return dx


class LayerNorm(Module):
    """LayerNorm over the last axis with gain ``w`` (ones) and shift ``b`` (zeros).

    Parameters
    ----------
    width : int
    eps : float, default 1e-5 (as ``torch.nn.LayerNorm``)
    dtype : dtype, default float64
    backend : {"numpy", "numba"}, default "numpy"
        ``functional.norms`` (reference) or ``kernels.norms`` (fused, same contract).

    References
    ----------
    Ba, Kiros & Hinton, "Layer Normalization", 2016.
    """

    def __init__(self, width: int, eps: float = 1e-5, *, dtype=np.float64,
                 backend: str = "numpy") -> None:
        super().__init__()
        check_positive("width", width, integer=True)
        _check_backend(backend)
        self.eps = eps
        self.norm_forward, self.norm_backward = layer_norm_forward, layer_norm_backward
        if backend == "numba":
            from ..kernels import norms  # lazy: compiles on first import

            self.norm_forward, self.norm_backward = norms.layer_norm_forward, \
                norms.layer_norm_backward
        self.add_param("w", np.ones(width, dtype=dtype))
        self.add_param("b", np.zeros(width, dtype=dtype))
        self.cache = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x : (..., C) -> out : (..., C)."""
        out, self.cache = self.norm_forward(x, self.params["w"], self.params["b"], self.eps)
        return out

    def backward(self, dout: np.ndarray, add: np.ndarray | None = None) -> np.ndarray:
        """dout : (..., C) -> dx, or ``dx + add`` (a residual's gradient joined in the pass)."""
        dx, dw, db = self.norm_backward(dout, self.cache, add)
        self.grads["w"] += dw
        self.grads["b"] += db
        return dx


class RMSNorm(Module):
    """RMSNorm over the last axis with gain ``w`` (ones); no mean subtraction, no shift.

    Parameters
    ----------
    width : int
    eps : float, optional
        ``None`` means ``np.finfo(dtype).eps``, as ``torch.nn.RMSNorm(eps=None)``.
    dtype : dtype, default float64
    backend : {"numpy", "numba"}, default "numpy"
        ``functional.norms`` (reference) or ``kernels.norms`` (fused, same contract).

    References
    ----------
    Zhang & Sennrich, "Root Mean Square Layer Normalization", 2019.
    """

    def __init__(self, width: int, eps: float | None = None, *, dtype=np.float64,
                 backend: str = "numpy") -> None:
        super().__init__()
        check_positive("width", width, integer=True)
        _check_backend(backend)
        self.eps = eps
        self.norm_forward, self.norm_backward = rms_norm_forward, rms_norm_backward
        if backend == "numba":
            from ..kernels import norms  # lazy: compiles on first import

            self.norm_forward, self.norm_backward = norms.rms_norm_forward, \
                norms.rms_norm_backward
        self.add_param("w", np.ones(width, dtype=dtype))
        self.cache = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x : (..., C) -> out : (..., C)."""
        out, self.cache = self.norm_forward(x, self.params["w"], self.eps)
        return out

    def backward(self, dout: np.ndarray, add: np.ndarray | None = None) -> np.ndarray:
        """dout : (..., C) -> dx, or ``dx + add`` (a residual's gradient joined in the pass)."""
        dx, dw = self.norm_backward(dout, self.cache, add)
        self.grads["w"] += dw
        return dx


def make_norm(norm: str, width: int, *, dtype=np.float64,
              backend: str = "numpy") -> LayerNorm | RMSNorm:
    """``LayerNorm(width)`` for ``"layernorm"``, ``RMSNorm(width)`` for ``"rmsnorm"``."""
    if norm == "layernorm":
        return LayerNorm(width, dtype=dtype, backend=backend)
    if norm == "rmsnorm":
        return RMSNorm(width, dtype=dtype, backend=backend)
    raise ValueError(f"norm must be one of {NORM_NAMES}, got {norm!r}")


class Dropout(Module):
    """Inverted dropout with its own random generator; the identity in evaluation mode.

    Parameters
    ----------
    p : float
        Probability of zeroing an entry, in [0, 1).
    seed : int, optional
        Seed of this layer's ``np.random.Generator``.

    Notes
    -----
    The forward's keep-mask is the cache, so the backward multiplies by exactly the same mask.
    """

    def __init__(self, p: float, seed: int | None = None) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must lie in [0, 1), got {p!r}")
        self.p = p
        self.rng = np.random.default_rng(seed)
        self.cache = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        out, self.cache = dropout_forward(x, self.p, self.rng, self.training)
        return out

    def backward(self, dout: np.ndarray) -> np.ndarray:
        return dropout_backward(dout, self.cache)


class FeedForward(Module):
    """Position-wise feed-forward network, ``C -> F -> C``.

    Parameters
    ----------
    width : int
        C, the model width.
    hidden : int
        F, the hidden width, used as given for every activation (also for SwiGLU, whose
        gated FFN then has three (C, F)-sized matrices instead of two; LLaMA shrinks F to about
        8C/3 to keep the count of a 4C FFN -- pass that F yourself if you want it).
    activation : {"relu", "gelu", "gelu_tanh", "swiglu"}, default "gelu"
        ``gelu`` is the exact (erf) GELU, ``gelu_tanh`` its tanh approximation.
    dtype : dtype, default float64
    rng : np.random.Generator, optional
    backend : {"numpy", "numba"}, default "numpy"
        With ``"numba"``, the linear maps run on every core (``kernels.linear``); with ReLU
        the whole network is one kernel (``kernels.feedforward``), exact GELU runs the fused
        pair of ``kernels.activations``; ``gelu_tanh`` and ``swiglu`` have no kernel and use
        the reference either way.

    Notes
    -----
    relu / gelu / gelu_tanh (children ``up``, ``down``):
        (1) h = up(x)   (2) a = act(h)   (3) out = down(a)
    swiglu (children ``gate``, ``up``, ``down``; LLaMA's w1, w3, w2):
        (1) g = gate(x), u = up(x)   (2) a = silu(g) * u   (3) out = down(a)

    References
    ----------
    Vaswani et al., "Attention Is All You Need", 2017.
    Shazeer, "GLU Variants Improve Transformer", 2020.
    """

    def __init__(self, width: int, hidden: int, activation: str = "gelu", *, dtype=np.float64,
                 rng: np.random.Generator | None = None, backend: str = "numpy") -> None:
        super().__init__()
        if activation not in ACTIVATION_NAMES:
            raise ValueError(f"activation must be one of {ACTIVATION_NAMES}, got {activation!r}")
        _check_backend(backend)
        rng = _generator(rng)
        self.activation = activation
        if activation == "swiglu":
            self.gate = self.add("gate", Linear(width, hidden, dtype=dtype, rng=rng,
                                                backend=backend))
        self.up = self.add("up", Linear(width, hidden, dtype=dtype, rng=rng, backend=backend))
        self.down = self.add("down", Linear(hidden, width, dtype=dtype, rng=rng,
                                            backend=backend))
        # the elementwise pair, chosen once; swiglu's pair takes two inputs and is called apart
        if activation == "relu":
            self.act_forward, self.act_backward = relu_forward, relu_backward
        elif activation == "gelu":
            self.act_forward, self.act_backward = gelu_forward, gelu_backward
        elif activation == "gelu_tanh":
            self.act_forward, self.act_backward = gelu_tanh_forward, gelu_tanh_backward
        if backend == "numba" and activation == "gelu":
            from ..kernels import activations as fast  # lazy: compiles on first import

            self.act_forward, self.act_backward = fast.gelu_forward, fast.gelu_backward
        # With the numba backend, the ReLU network runs as one kernel over chunks of rows,
        # (1)-(3) for each chunk while it is in cache (``kernels/feedforward.py``); up and
        # down then only hold the parameters and gradients
        self.fused_forward = self.fused_backward = None
        if backend == "numba" and activation == "relu":
            from ..kernels import feedforward as fused  # lazy: compiles on first import

            self.fused_forward, self.fused_backward = (fused.relu_ffn_forward,
                                                       fused.relu_ffn_backward)
        self.cache = None  # the activation's cache, or the fused kernel's

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x : (B, T, C) -> out : (B, T, C)."""
        if self.fused_forward is not None:  # (1)-(3)
            up, down = self.up.params, self.down.params
            out, self.cache = self.fused_forward(x, up["w"], up["b"], down["w"], down["b"])
            return out
        if self.activation == "swiglu":
            a, self.cache = swiglu_forward(self.gate(x), self.up(x))  # (1), (2)
        else:
            a, self.cache = self.act_forward(self.up(x))  # (1), (2)
        return self.down(a)  # (3) (B, T, C)

    def backward(self, dout: np.ndarray) -> np.ndarray:
        if self.fused_backward is not None:  # (3)-(1)
            dx, dw1, db1, dw2, db2 = self.fused_backward(dout, self.cache)
            for layer, dw, db in ((self.up, dw1, db1), (self.down, dw2, db2)):
                layer.grads["w"] += dw
                layer.grads["b"] += db
            return dx
        da = self.down.backward(dout)  # (3)
        if self.activation == "swiglu":
            dg, du = swiglu_backward(da, self.cache)  # (2)
            return self.gate.backward(dg) + self.up.backward(du)  # (1) x feeds both branches
        dh = self.act_backward(da, self.cache)  # (2)
        return self.up.backward(dh)  # (1)

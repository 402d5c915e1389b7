"""The basic layers: Linear, Embedding, the tied output projection, the two norms, Dropout and
the position-wise feed-forward network.

Each is a thin stateful shell around a pure forward/backward pair: ``forward`` stores that
pair's cache, ``backward`` passes it back and adds the parameter gradients into ``grads``.
The pairs come from ``self.ops``, the layer's :class:`~numpy_transformer.backend.Backend`,
taken once in ``__init__`` from its ``backend`` argument (a name or a Backend): the readable
references of ``numpy_transformer.functional`` (``"numpy"``), or the kernels with the same
names and contracts (``"numba"``).
"""

from __future__ import annotations

import numpy as np

from .._checks import check_choice, check_positive
from ..backend import Backend, get_backend
from ..config import ACTIVATIONS, DEFAULT_BACKEND, GATED_ACTIVATIONS, NORMS
from ..functional.activations import dropout_backward, dropout_forward
from .module import Module, drawn


def _generator(rng: np.random.Generator | None) -> np.random.Generator:
    """The given generator, or a fresh unseeded one (models always pass a seeded generator)."""
    return np.random.default_rng() if rng is None else rng


BackendArg = str | Backend  # a backend's name, or the Backend itself (what models pass down)


def _loss_gradients(head: Module, dloss: float) -> tuple:
    """``(dx, dw, db)`` of the loss of ``head.loss_forward`` (a Linear's or a TiedOutput's),
    whose cache is let go: one backward per loss forward."""
    if head.loss_cache is None:
        raise ValueError(f"{type(head).__name__}.loss_backward needs a loss_forward first, in "
                         f"training mode outside no_grad()")
    cache, head.loss_cache = head.loss_cache, None
    return head.ops.linear_cross_entropy_backward(dloss, cache)


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
    backend : str or Backend, default ``config.DEFAULT_BACKEND``
        Where ``linear_forward`` / ``linear_backward`` come from (numba: the rows shared out
        over the cores, ``kernels/linear.py``).

    Notes
    -----
    ``w`` has shape (C_in, C_out), the transpose of PyTorch's ``nn.Linear.weight``. It is
    initialised as PyTorch does, ``w, b ~ U(-1/sqrt(C_in), 1/sqrt(C_in))``.
    """

    def __init__(self, in_width: int, out_width: int, bias: bool = True, *, dtype=np.float64,
                 rng: np.random.Generator | None = None,
                 backend: BackendArg = DEFAULT_BACKEND) -> None:
        super().__init__()
        self.ops = get_backend(backend)
        check_positive("in_width", in_width, integer=True)
        check_positive("out_width", out_width, integer=True)
        rng = _generator(rng)
        bound = 1.0 / np.sqrt(in_width)
        self.add_param("w", drawn((in_width, out_width), dtype,
                                  lambda s: rng.uniform(-bound, bound, s)))
        if bias:
            self.add_param("b", rng.uniform(-bound, bound, out_width).astype(dtype))
        self.cache = None
        self.loss_cache = None  # loss_forward's, for loss_backward

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x : (..., C_in) -> out : (..., C_out)."""
        out, self.cache = self.ops.linear_forward(x, self.params["w"], self.params.get("b"),
                                                  keep=self.keeps_cache)
        return self.expect_grad_like(out)

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """dout : (..., C_out) -> dx : (..., C_in); adds into ``grads["w"]`` and ``grads["b"]``."""
        self.check_grad("dout", dout)
        dx, dw, db = self.ops.linear_backward(dout, self.cache)
        self.add_grad("w", dw)
        if db is not None:
            self.add_grad("b", db)
        return dx

    def loss_forward(self, x: np.ndarray, targets: np.ndarray,
                     mask: np.ndarray | None = None) -> float:
        """x : (..., C_in), targets : int (...) -> the mean cross-entropy of the outputs as
        logits (``linear_cross_entropy_forward``, the outputs never returned)."""
        loss, self.loss_cache = self.ops.linear_cross_entropy_forward(
            x, self.params["w"], self.params.get("b"), targets, mask=mask, keep=self.keeps_cache)
        return loss

    def loss_backward(self, dloss: float = 1.0) -> np.ndarray:
        """-> dx : (..., C_in), of the loss of :meth:`loss_forward`; adds into ``grads``."""
        dx, dw, db = _loss_gradients(self, dloss)
        self.add_grad("w", dw)
        if db is not None:
            self.add_grad("b", db)
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
    backend : str or Backend, default ``config.DEFAULT_BACKEND``
        The backward's scatter-add: ``np.add.at`` (reference) or a compiled loop.
    """

    def __init__(self, vocab: int, width: int, std: float = 1.0, *, dtype=np.float64,
                 rng: np.random.Generator | None = None,
                 backend: BackendArg = DEFAULT_BACKEND) -> None:
        super().__init__()
        self.ops = get_backend(backend)
        check_positive("vocab", vocab, integer=True)
        check_positive("width", width, integer=True)
        check_positive("std", std)
        rng = _generator(rng)
        self.add_param("table", drawn((vocab, width), dtype,
                                      lambda s: std * rng.standard_normal(s)))  # N(0, std^2)
        self.cache = None

    def forward(self, ids: np.ndarray) -> np.ndarray:
        """ids : int (B, T) -> out : (B, T, C). ValueError for non-integer or out-of-range ids."""
        out, self.cache = self.ops.embedding_forward(ids, self.params["table"],
                                                     keep=self.keeps_cache)
        return self.expect_grad_like(out)

    def backward(self, dout: np.ndarray) -> None:
        """Adds ``dout`` (B, T, C) into the rows of ``grads["table"]``; ids have no gradient."""
        self.check_grad("dout", dout)
        self.add_grad("table", self.ops.embedding_backward(dout, self.cache))


class TiedOutput(Module):
    """Output projection that reuses an embedding table: ``logits = x @ table^T``.

    It owns no parameter. Its gradient ``dtable = (x^T dout)^T`` is *added* into the
    embedding's own ``grads["table"]``, next to the gradient of the lookup, which is why every
    backward in this library accumulates.

    Parameters
    ----------
    embedding : Embedding
        The input embedding whose table (V, C) doubles as the output weight. It is not
        registered as a child, so the shared table is counted and saved once. Its backend is
        this projection's.

    References
    ----------
    Press & Wolf, "Using the Output Embedding to Improve Language Models", 2017.
    """

    def __init__(self, embedding: Embedding) -> None:
        super().__init__()
        self.embedding = embedding
        self.ops = embedding.ops
        self.cache = None
        self.loss_cache = None  # loss_forward's, for loss_backward

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x : (B, T, C) -> logits : (B, T, V)."""
        out, self.cache = self.ops.linear_forward(x, self.embedding.params["table"].T,
                                                  keep=self.keeps_cache)
        return self.expect_grad_like(out)

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """dout : (B, T, V) -> dx : (B, T, C); adds into the embedding's ``grads["table"]``."""
        self.check_grad("dout", dout)
        dx, dw, _ = self.ops.linear_backward(dout, self.cache)  # dw is d(table^T), (C, V)
        self.embedding.add_grad("table", dw.T)
        return dx

    def loss_forward(self, x: np.ndarray, targets: np.ndarray,
                     mask: np.ndarray | None = None) -> float:
        """x : (B, T, C), targets : int (B, T) -> the mean cross-entropy of the logits
        (``linear_cross_entropy_forward``, the logits never returned)."""
        loss, self.loss_cache = self.ops.linear_cross_entropy_forward(
            x, self.embedding.params["table"].T, None, targets, mask=mask,
            keep=self.keeps_cache)
        return loss

    def loss_backward(self, dloss: float = 1.0) -> np.ndarray:
        """-> dx : (B, T, C), of the loss of :meth:`loss_forward`; adds into the embedding's
        ``grads["table"]``."""
        dx, dw, _ = _loss_gradients(self, dloss)  # dw: d(table^T), (C, V)
        self.embedding.add_grad("table", dw.T)
        return dx


class LayerNorm(Module):
    """LayerNorm over the last axis with gain ``w`` (ones) and shift ``b`` (zeros).

    Parameters
    ----------
    width : int
    eps : float, default 1e-5 (as ``torch.nn.LayerNorm``)
    dtype : dtype, default float64
    backend : str or Backend, default ``config.DEFAULT_BACKEND``

    References
    ----------
    Ba, Kiros & Hinton, "Layer Normalization", 2016.
    """

    def __init__(self, width: int, eps: float = 1e-5, *, dtype=np.float64,
                 backend: BackendArg = DEFAULT_BACKEND) -> None:
        super().__init__()
        self.ops = get_backend(backend)
        check_positive("width", width, integer=True)
        self.eps = eps
        self.add_param("w", np.ones(width, dtype=dtype))
        self.add_param("b", np.zeros(width, dtype=dtype))
        self.cache = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x : (..., C) -> out : (..., C)."""
        out, self.cache = self.ops.layer_norm_forward(x, self.params["w"], self.params["b"],
                                                      self.eps, keep=self.keeps_cache)
        return self.expect_grad_like(out)

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """dout : (..., C) -> dx : (..., C); adds into ``grads["w"]`` and ``grads["b"]``."""
        self.check_grad("dout", dout)
        dx, dw, db = self.ops.layer_norm_backward(dout, self.cache)
        self.add_grad("w", dw)
        self.add_grad("b", db)
        return dx


class RMSNorm(Module):
    """RMSNorm over the last axis with gain ``w`` (ones); no mean subtraction, no shift.

    Parameters
    ----------
    width : int
    eps : float, optional
        ``None`` means ``np.finfo(dtype).eps``, as ``torch.nn.RMSNorm(eps=None)``.
    dtype : dtype, default float64
    backend : str or Backend, default ``config.DEFAULT_BACKEND``

    References
    ----------
    Zhang & Sennrich, "Root Mean Square Layer Normalization", 2019.
    """

    def __init__(self, width: int, eps: float | None = None, *, dtype=np.float64,
                 backend: BackendArg = DEFAULT_BACKEND) -> None:
        super().__init__()
        self.ops = get_backend(backend)
        check_positive("width", width, integer=True)
        self.eps = eps
        self.add_param("w", np.ones(width, dtype=dtype))
        self.cache = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x : (..., C) -> out : (..., C)."""
        out, self.cache = self.ops.rms_norm_forward(x, self.params["w"], self.eps,
                                                    keep=self.keeps_cache)
        return self.expect_grad_like(out)

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """dout : (..., C) -> dx : (..., C); adds into ``grads["w"]``."""
        self.check_grad("dout", dout)
        dx, dw = self.ops.rms_norm_backward(dout, self.cache)
        self.add_grad("w", dw)
        return dx


def make_norm(norm: str, width: int, eps: float | None = None, *, dtype=np.float64,
              backend: BackendArg = DEFAULT_BACKEND) -> LayerNorm | RMSNorm:
    """``LayerNorm(width)`` for ``"layernorm"``, ``RMSNorm(width)`` for ``"rmsnorm"``; with
    ``eps``, that epsilon instead of the norm's default (1e-5; the dtype's)."""
    check_choice("norm", norm, NORMS)
    if norm == "layernorm":
        return LayerNorm(width, 1e-5 if eps is None else eps, dtype=dtype, backend=backend)
    return RMSNorm(width, eps, dtype=dtype, backend=backend)


class Dropout(Module):
    """Inverted dropout with its own random generator; the identity in evaluation mode.

    Parameters
    ----------
    p : float
        Probability of zeroing an entry, in [0, 1).
    seed : int or np.random.Generator, optional
        Seed of this layer's ``np.random.Generator``, or the generator itself.

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
        out, self.cache = dropout_forward(x, self.p, self.rng, self.training,
                                          keep=self.keeps_cache)
        return self.expect_grad_like(out)

    def backward(self, dout: np.ndarray) -> np.ndarray:
        self.check_grad("dout", dout)
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
    activation : str, default "gelu"
        One of ``config.ACTIVATIONS``: ``gelu`` is the exact (erf) GELU, ``gelu_tanh`` its
        tanh approximation, ``swiglu`` the gated unit.
    bias : bool, default True
        Whether the linear layers add a bias (LLaMA's have none).
    dtype : dtype, default float64
    rng : np.random.Generator, optional
    backend : str or Backend, default ``config.DEFAULT_BACKEND``

    Notes
    -----
    elementwise activations (children ``up``, ``down``):
        (1) h = up(x)   (2) a = act(h)   (3) out = down(a)
    gated ones, swiglu (children ``gate``, ``up``, ``down``; LLaMA's w1, w3, w2):
        (1) g = gate(x), u = up(x)   (2) a = silu(g) * u   (3) out = down(a)

    (1)-(3) are the backend's ``feed_forward_forward`` (``functional/feedforward.py``); the
    children hold the parameters and their gradients.

    References
    ----------
    Vaswani et al., "Attention Is All You Need", 2017.
    Shazeer, "GLU Variants Improve Transformer", 2020.
    """

    def __init__(self, width: int, hidden: int, activation: str = "gelu", *, bias: bool = True,
                 dtype=np.float64, rng: np.random.Generator | None = None,
                 backend: BackendArg = DEFAULT_BACKEND) -> None:
        super().__init__()
        self.ops = get_backend(backend)
        self.activation = check_choice("activation", activation, ACTIVATIONS)
        rng = _generator(rng)
        opts = dict(bias=bias, dtype=dtype, rng=rng, backend=self.ops)
        if activation in GATED_ACTIVATIONS:
            self.gate = self.add("gate", Linear(width, hidden, **opts))
        self.up = self.add("up", Linear(width, hidden, **opts))
        self.down = self.add("down", Linear(hidden, width, **opts))
        self.cache = None

    def weights(self) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
        """``{name: (w, b or None)}`` of the children, as ``feed_forward_forward`` takes them."""
        return {name: (layer.params["w"], layer.params.get("b"))
                for name, layer in self.children.items()}

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x : (B, T, C) -> out : (B, T, C)."""
        out, self.cache = self.ops.feed_forward_forward(x, self.weights(), self.activation,
                                                        keep=self.keeps_cache)
        return self.expect_grad_like(out)  # (1)-(3)

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """dout : (B, T, C) -> dx : (B, T, C); adds into every child's ``grads``."""
        self.check_grad("dout", dout)
        dx, grads = self.ops.feed_forward_backward(dout, self.cache)  # (3)-(1)
        for name, (dw, db) in grads.items():
            layer = self.children[name]
            layer.add_grad("w", dw)
            if db is not None:
                layer.add_grad("b", db)
        return dx

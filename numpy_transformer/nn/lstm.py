"""The recurrent language model: a stacked :class:`LSTM` and :class:`LSTMLM` on top of it.

``LSTMLM`` is the char-LM chapter's third model (its "Chapter 12 LSTM"): token embedding,
LSTM, linear head to the vocabulary. It keeps the trainer's contract of the Transformers
(``forward(tokens) -> logits (B, T, V)``, ``backward(dlogits)``, ``config`` with ``vocab``,
``max_len``, ``backend``, ``dtype``, ``seed``), so ``Trainer``, checkpoints and the experiments
take it as they take a ``DecoderLM``.

Generation carries the recurrent state instead of re-reading a window: ``forward(tokens,
state=state)`` starts from the :class:`LSTMState` it is given (built by :func:`new_state`) and
leaves in it the state after the last token, so the next call costs one step per new token,
however long the sequence already is. A forward without ``state`` starts from zeros, as the
training windows and the fixed-window held-out loss do.

Parameter names follow ``torch.nn.LSTM`` (``w_ih_l0``, ``w_hh_l0``, ``b_ih_l0``, ``b_hh_l0``
for ``weight_ih_l0``, ...), with the weights transposed to our (C_in, 4H) layout
(``functional/lstm.py``; ``numpy_transformer.interop`` exchanges them).
"""

from __future__ import annotations

import numpy as np

from .._checks import check_ids, check_positive
from ..backend import get_backend
from ..config import DEFAULT_BACKEND, LSTMConfig
from .layers import BackendArg, Embedding, Linear, _generator
from .module import Module


class LSTMState:
    """The state (h, c) of every layer of an LSTM for a batch of sequences (inference).

    Attributes
    ----------
    h, c : ndarray of shape (L, B, H)
        Hidden and cell state of each of the L layers: PyTorch's ``(h_n, c_n)`` layout.
    """

    def __init__(self, h: np.ndarray, c: np.ndarray) -> None:
        self.h, self.c = h, c


def new_state(model: LSTMLM | LSTM, batch: int) -> LSTMState:
    """A zero :class:`LSTMState` for ``batch`` sequences of ``model``, in its weights' dtype.

    Raises
    ------
    ValueError
        If ``model`` is not an LSTMLM or an LSTM, or ``batch`` is not a positive integer.
    """
    if not isinstance(model, (LSTMLM, LSTM)):
        raise ValueError(f"a recurrent state needs an LSTMLM or an LSTM, got "
                         f"{type(model).__name__}")
    check_positive("batch", batch, integer=True)
    lstm = model.lstm if isinstance(model, LSTMLM) else model
    dtype = lstm.params["w_hh_l0"].dtype
    shape = (lstm.layers, batch, lstm.hidden)
    return LSTMState(np.zeros(shape, dtype), np.zeros(shape, dtype))


class LSTM(Module):
    """A stack of LSTM layers over whole sequences: x (B, T, C) -> hidden states (B, T, H).

    Parameters
    ----------
    in_width, hidden : int
        C and H.
    layers : int, default 1
    dtype : dtype, default float64
    rng : np.random.Generator, optional
    backend : str or Backend, default ``config.DEFAULT_BACKEND``
        Where ``lstm_forward`` / ``lstm_backward`` come from (numba: ``kernels/lstm.py``).

    Notes
    -----
    Layer k holds ``w_ih_l{k}`` (C_k, 4H), ``w_hh_l{k}`` (H, 4H), ``b_ih_l{k}`` and
    ``b_hh_l{k}`` (4H,), with C_0 = C and C_k = H above. Every entry starts U(-1/sqrt(H),
    1/sqrt(H)), as in ``torch.nn.LSTM``. The two biases are PyTorch's: the cell sees only
    their sum (``functional/lstm.py``), so each receives the same gradient. Keeping both costs
    4H parameters per layer and buys PyTorch's parameter count, initial distribution of the
    summed bias and Adam trajectory, so that a run here and one in PyTorch agree step by step.
    """

    def __init__(self, in_width: int, hidden: int, layers: int = 1, *, dtype=np.float64,
                 rng: np.random.Generator | None = None,
                 backend: BackendArg = DEFAULT_BACKEND) -> None:
        super().__init__()
        self.ops = get_backend(backend)
        for name, value in (("in_width", in_width), ("hidden", hidden), ("layers", layers)):
            check_positive(name, value, integer=True)
        self.hidden, self.layers = hidden, layers
        rng = _generator(rng)
        bound = 1.0 / np.sqrt(hidden)
        for k in range(layers):
            shapes = {"w_ih": (in_width if k == 0 else hidden, 4 * hidden),
                      "w_hh": (hidden, 4 * hidden), "b_ih": (4 * hidden,), "b_hh": (4 * hidden,)}
            for name, shape in shapes.items():
                self.add_param(f"{name}_l{k}", rng.uniform(-bound, bound, shape).astype(dtype))
        self.cache = None  # one functional cache per layer, of the latest forward

    def forward(self, x: np.ndarray, state: LSTMState | None = None) -> np.ndarray:
        """x : (B, T, C) -> out : (B, T, H), the last layer's hidden states.

        Without ``state`` every layer starts from zeros. With one (inference), every layer
        starts from ``state.h[k], state.c[k]`` and the state after the last step is written
        back into ``state``.
        """
        p = self.params
        if state is not None:
            self._check_state(state, x.shape[0])
        caches = []
        for k in range(self.layers):
            h0, c0 = (None, None) if state is None else (state.h[k], state.c[k])
            x, (h_t, c_t), cache = self.ops.lstm_forward(x, h0, c0, p[f"w_ih_l{k}"],
                                                         p[f"w_hh_l{k}"],
                                                         p[f"b_ih_l{k}"] + p[f"b_hh_l{k}"],
                                                         keep=self.keeps_cache)
            caches.append(cache)
            if state is not None:
                state.h[k], state.c[k] = h_t, c_t
        self.cache = caches if self.keeps_cache else None
        return self.expect_grad_like(x)

    def _check_state(self, state: LSTMState, batch: int) -> None:
        """Raise ``ValueError`` unless ``state`` holds (h, c) of shape (L, B, H) for this
        LSTM's L layers and width H, and the B sequences of the input."""
        if not isinstance(state, LSTMState):
            raise ValueError(f"state must be an LSTMState (new_state), got "
                             f"{type(state).__name__}")
        want = (self.layers, batch, self.hidden)
        for name, a in (("h", state.h), ("c", state.c)):
            if not isinstance(a, np.ndarray) or a.shape != want or a.dtype.kind != "f":
                got = (f"{a.dtype} array of shape {a.shape}" if isinstance(a, np.ndarray)
                       else type(a).__name__)
                raise ValueError(f"state.{name} must be a float array of shape {want} (layers, "
                                 f"batch, hidden), got a {got}")

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """dout : (B, T, H) -> dx : (B, T, C); adds into every layer's four gradients.

        The final state is taken to have no gradient (it feeds nothing in training), and the
        gradient of the initial state is dropped: it is zeros, or a carried state, not a
        parameter.
        """
        self.check_grad("dout", dout)
        for k in reversed(range(self.layers)):
            dout, _, _, dw_ih, dw_hh, db = self.ops.lstm_backward(dout, None, None,
                                                                  self.cache[k])
            self.add_grad(f"w_ih_l{k}", dw_ih)
            self.add_grad(f"w_hh_l{k}", dw_hh)
            self.add_grad(f"b_ih_l{k}", db)  # b = b_ih + b_hh: each gets db
            self.add_grad(f"b_hh_l{k}", db)
        return dout


class LSTMLM(Module):
    """Recurrent language model: tokens (B, T) -> next-token logits (B, T, V).

    Parameters
    ----------
    config : LSTMConfig

    Notes
    -----
    (1) e = table[tokens]   (2) h = LSTM(e)   (3) logits = h W + b

    Examples
    --------
    The size used beside the chapter's Transformer (132,488 parameters):

    >>> LSTMLM(LSTMConfig(vocab=104, embed=85, hidden=128, max_len=100)).num_parameters()
    132336
    """

    def __init__(self, config: LSTMConfig) -> None:
        super().__init__()
        self.config = config.validate()
        rng = np.random.default_rng(config.seed)
        dtype, ops = np.dtype(config.dtype), get_backend(config.backend)
        self.ops = ops
        width = config.embed_width
        self.embed = self.add("embed", Embedding(config.vocab, width, config.embed_std,
                                                 dtype=dtype, rng=rng, backend=ops))
        self.lstm = self.add("lstm", LSTM(width, config.hidden, config.layers, dtype=dtype,
                                          rng=rng, backend=ops))
        self.head = self.add("head", Linear(config.hidden, config.vocab, dtype=dtype, rng=rng,
                                            backend=ops))

    def _tokens(self, tokens: np.ndarray) -> np.ndarray:
        """The token ids checked: integers in [0, vocab), shaped (B, T)."""
        tokens = check_ids("tokens", tokens, self.config.vocab)
        if tokens.ndim != 2:
            raise ValueError(f"tokens must have shape (B, T), got {tokens.shape}")
        return tokens

    def forward(self, tokens: np.ndarray, state: LSTMState | None = None) -> np.ndarray:
        """tokens : int (B, T) -> logits (B, T, V); position t sees tokens 0 .. t only.

        With ``state`` (:func:`new_state`, inference), the tokens continue the sequences whose
        state it holds, and it is advanced past them: feeding a sequence in pieces gives the
        logits of feeding it whole.
        """
        tokens = self._tokens(tokens)
        return self.expect_grad_like(self.head(self.lstm(self.embed(tokens), state)))  # (1)-(3)

    def backward(self, dlogits: np.ndarray) -> None:
        """Adds into every parameter's gradient."""
        self.check_grad("dlogits", dlogits)
        self.embed.backward(self.lstm.backward(self.head.backward(dlogits)))

    def loss_and_backward(self, tokens: np.ndarray, *, targets: np.ndarray,
                          mask: np.ndarray | None = None) -> float:
        """The mean cross-entropy of the next-token logits against ``targets``, every gradient
        added; see ``DecoderLM.loss_and_backward`` (``nn/models.py``)."""
        tokens = self._tokens(tokens)
        with self.ops.forward_and_backward(self):
            loss = self.head.loss_forward(self.lstm(self.embed(tokens)), targets, mask)
            self.embed.backward(self.lstm.backward(self.head.loss_backward()))
        return loss

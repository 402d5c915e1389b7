"""Every public entry point of ``numpy_transformer/kernels`` refuses bad input with a
``ValueError`` before it enters compiled code.

Compiled code does not check its indices, so an upstream gradient one column short used to be
read past its end (garbage out), and written past its end by ``layer_norm_backward`` (hangs,
SIGABRT) or ``linear_backward`` (SIGSEGV). Here each kernel is first called with valid
arguments (the control: it must run), then once per *mutation* of one argument: another
dtype (int, float16, the other float), an empty array, a list instead of an array, and, for
an argument whose shape the others fix (a gradient against its cache, a bias against its
weight), one column short, one row more, or a single row that NumPy would broadcast. Each must
raise ``ValueError``; the few mutations a kernel accepts by contract (a bias converted to q's
dtype, a norm's gain cast to x's) are listed with the case, so nothing passes unnoticed.

The test covers every public callable of every kernel module (each ``__all__`` and the rest:
``ParameterSet``, ``erf_f32``, ``gemm``, ``gemm_address``) or fails, so a new kernel needs a
case here. Run it as CI does, where a crash would show as a fault, not a failure::

    PYTHONPATH=$PWD python -X faulthandler -m pytest tests/test_kernel_inputs.py
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pytest

import numpy_transformer.kernels as kernels_package
from numpy_transformer.functional.masks import causal_mask
from numpy_transformer.kernels import (
    activations,
    adam,
    attention,
    blas,
    embedding,
    feedforward,
    head_loss,
    linear,
    lstm,
    norms,
    softmax,
)

# Public callables of the kernel modules that are not entry points into compiled code
NOT_KERNELS = {
    "exp_shifted": "called from Python it is its NumPy reference line (compiled: an overload)",
    "exp_clamped": "called from Python it is np.exp (compiled: an overload)",
    "SDPAKernelCache": "the forward's cache, a NamedTuple; sdpa_backward checks what it holds",
    "HeadsKernelCache": "the forward's cache, a NamedTuple; linear_heads_backward checks it",
    "HeadLossKernelCache": "the forward's gradients; linear_cross_entropy_backward checks it",
}

ROWS = 300  # above kernels.linear._MIN_ROWS: the chunked kernels run, not the reference


class Case(NamedTuple):
    call: Callable  # the kernel, called as call(*args)
    args: Callable[[], tuple]  # fresh valid arguments
    bound: tuple[int, ...] = ()  # positions of the arrays whose shape and dtype the others fix
    caches: tuple[int, ...] = ()  # positions of caches
    accepts: tuple[str, ...] = ()  # "position:mutation" accepted by the contract


def arr(*shape, dtype=np.float64, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _backward(forward: Callable, forward_args: tuple, extra: tuple = ()) -> Callable:
    """Valid arguments of a backward: a random dout shaped like the forward's output, the
    forward's cache, then ``extra``."""
    def args():
        out, cache = forward(*forward_args())
        return (arr(*out.shape, dtype=out.dtype, seed=1), cache, *extra)
    return args


def _head_loss_args():
    """A vocabulary wide enough for the blocked kernel, not the two kernels composed."""
    v = head_loss._WIDE_COLUMNS
    return (arr(2, 3, 5), arr(5, v, seed=1), arr(v, seed=2),
            np.array([[0, v - 1, 1], [2, 2, -100]]))


def _x():
    return (arr(2, 5, 7),)


def _norm_args():
    return arr(3, ROWS // 3, 8), arr(8), arr(8)


def _linear_args():
    return arr(3, ROWS // 3, 6), arr(6, 12), arr(12)


def _ffn_args():
    return arr(3, ROWS // 3, 6), arr(6, 9), arr(9), arr(9, 6), arr(6)


def _feed_forward(x, w_up, b_up, w_down, b_down):
    """The ReLU network with biases: the one-pass kernel, its weights as arguments."""
    return feedforward.feed_forward_forward(x, {"up": (w_up, b_up), "down": (w_down, b_down)},
                                            "relu")


def _sdpa_args():
    return arr(2, 3, 4, 8), arr(2, 3, 5, 8), arr(2, 3, 5, 8), causal_mask(4, 5), arr(1, 3, 4, 5)


def _heads_args():
    """x (B, T, C_in), two weights and their biases, two heads: the kernel's own path."""
    return (arr(3, ROWS // 3, 6), (arr(6, 12), arr(6, 12, seed=1)),
            (arr(12), arr(12, seed=2)), 2)


def _heads_backward_args():
    ys, cache = linear.linear_heads_forward(*_heads_args())
    return tuple(arr(*y.shape, seed=3 + i) for i, y in enumerate(ys)), cache


def _embeddings_args():
    return np.array([[0, 2, 2], [4, 2, 1]]), arr(5, 4), 2.0, arr(3, 4)


def _group(n=2):
    """(ps, gs, ms, vs) of n parameters, C-contiguous float64."""
    return tuple([arr(3, 4, seed=10 * g + k) for k in range(n)] for g in range(4))


_ADAM_SCALARS = (0.9, 0.999, 0.001, 0.5, 1e-8, -0.01)  # w1, beta2, w2, bc2_sqrt, eps, neg_step
_ADAM_HYPER = (0.01, 0.9, 0.999, 1e-8)  # lr, beta1, beta2, eps


def _adam_update(p, g, m, v, lr, beta1, beta2, eps, weight_decay, t):
    adam.adam_update(p, g, m, v, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                     weight_decay=weight_decay, t=t, decoupled=False)


def _adam_update_group(ps, gs, ms, vs, lr, beta1, beta2, eps, weight_decays, t):
    adam.adam_update_group(ps, gs, ms, vs, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                           weight_decays=weight_decays, t=t, decoupled=True)


def _parameter_set_update(ps, gs, ms, vs, decay, l2, *scalars):
    adam.ParameterSet(ps, gs, ms, vs).update(decay, l2, *scalars)


def _gemm_args():
    a, b = arr(6, 4), arr(4, 5)
    return a, b, np.empty((6, 5)), blas.gemm_address(np.float64)


def _lstm_args():
    """x (B, T, C), h0, c0 (B, H), w_ih (C, 4H), w_hh (H, 4H), b (4H,)."""
    return arr(2, 5, 3), arr(2, 4), arr(2, 4), arr(3, 16), arr(4, 16), arr(16)


def _lstm_backward_args():
    out, (h_t, c_t), cache = lstm.lstm_forward(*_lstm_args())
    return arr(*out.shape, seed=1), arr(*h_t.shape, seed=2), arr(*c_t.shape, seed=3), cache


_PROMOTED = ("1:other float", "2:other float")  # w, b: x @ w + b in NumPy's promoted dtype

CASES = {
    "relu_forward": Case(activations.relu_forward, _x),
    "relu_backward": Case(activations.relu_backward, _backward(activations.relu_forward, _x),
                          bound=(0,), caches=()),
    "gelu_forward": Case(activations.gelu_forward, _x),
    "gelu_backward": Case(activations.gelu_backward, _backward(activations.gelu_forward, _x),
                          bound=(0,)),
    "gelu_tanh_forward": Case(activations.gelu_tanh_forward, _x),
    "gelu_tanh_backward": Case(activations.gelu_tanh_backward,
                               _backward(activations.gelu_tanh_forward, _x), bound=(0,)),
    "erf_f32": Case(activations.erf_f32, _x),
    "adam_update": Case(_adam_update,  # t = 3 times 7 is a step count as good
                        lambda: (*[a[0] for a in _group(1)], *_ADAM_HYPER, 0.1, 3),
                        bound=(1, 2, 3), accepts=("9:another integer",)),
    "adam_update_group": Case(_adam_update_group,
                              lambda: (*_group(), *_ADAM_HYPER, [0.1, 0.0], 3),
                              bound=(1, 2, 3), accepts=("9:another integer",)),
    "ParameterSet": Case(_parameter_set_update,
                         lambda: (*_group(), np.ones(2), np.zeros(2), *_ADAM_SCALARS),
                         bound=(1, 2, 3, 4, 5)),
    "sdpa_forward": Case(attention.sdpa_forward, _sdpa_args, bound=(1, 2, 3, 4),
                         # the bias is converted to q's dtype; mask and bias broadcast to
                         # (B, H, T_q, T_k): (1, T_k) and (2, H, T_q, T_k) both do
                         accepts=("4:float16", "4:other float", "3:one row",
                                  "4:one row more")),
    "sdpa_backward": Case(attention.sdpa_backward, _backward(attention.sdpa_forward, _sdpa_args),
                          bound=(0,), caches=(1,)),
    "gemm": Case(blas.gemm, _gemm_args, bound=(0, 1, 2)),
    "gemm_address": Case(blas.gemm_address, lambda: (np.float64,)),
    "embeddings_forward": Case(embedding.embeddings_forward, _embeddings_args, bound=(3,)),
    "embeddings_backward": Case(embedding.embeddings_backward,
                                _backward(embedding.embeddings_forward, _embeddings_args,
                                          (2.0,)), bound=(0,), caches=(1,)),
    "embedding_backward": Case(embedding.embedding_backward,
                               _backward(embedding.embeddings_forward, _embeddings_args),
                               bound=(0,), caches=(1,)),
    # weights of the other float: the composition of the linear kernels, which promote
    "feed_forward_forward": Case(_feed_forward, _ffn_args, bound=(1, 2, 3, 4),
                                 accepts=tuple(f"{i}:other float" for i in (1, 2, 3, 4))),
    "feed_forward_backward": Case(feedforward.feed_forward_backward,
                                  _backward(_feed_forward, _ffn_args), bound=(0,),
                                  caches=(1,)),
    "linear_forward": Case(linear.linear_forward, _linear_args, bound=(1, 2),
                           accepts=_PROMOTED),
    "linear_backward": Case(linear.linear_backward,
                            _backward(linear.linear_forward, _linear_args), bound=(0,),
                            caches=(1,)),
    "linear_heads_forward": Case(linear.linear_heads_forward, _heads_args, bound=(1, 2),
                                 accepts=("1:first other float", "2:first other float")),
    "linear_heads_backward": Case(linear.linear_heads_backward, _heads_backward_args,
                                  bound=(0,), caches=(1,)),
    "layer_norm_forward": Case(norms.layer_norm_forward, _norm_args, bound=(1, 2),
                               accepts=("1:float16", "1:other float", "2:float16",
                                        "2:other float")),  # w, b: cast to x's dtype
    "layer_norm_backward": Case(norms.layer_norm_backward,
                                _backward(norms.layer_norm_forward, _norm_args), bound=(0,),
                                caches=(1,)),
    "rms_norm_forward": Case(norms.rms_norm_forward, lambda: _norm_args()[:2], bound=(1,),
                             accepts=("1:float16", "1:other float")),
    "rms_norm_backward": Case(norms.rms_norm_backward,
                              _backward(norms.rms_norm_forward, lambda: _norm_args()[:2]),
                              bound=(0,), caches=(1,)),
    "lstm_forward": Case(lstm.lstm_forward, _lstm_args, bound=(1, 2, 3, 4, 5)),
    "lstm_backward": Case(lstm.lstm_backward, _lstm_backward_args, bound=(0, 1, 2),
                          caches=(3,)),
    "cross_entropy_forward": Case(softmax.cross_entropy_forward,
                                  lambda: (arr(2, 3, 5), np.array([[0, 4, 1], [2, 2, 3]])),
                                  bound=(1,)),
    "cross_entropy_backward": Case(
        softmax.cross_entropy_backward,
        lambda: (0.7, softmax.cross_entropy_forward(arr(2, 3, 5),
                                                    np.array([[0, 4, 1], [2, 2, 3]]))[1]),
        caches=(1,)),
    "linear_cross_entropy_forward": Case(head_loss.linear_cross_entropy_forward,
                                         _head_loss_args, bound=(1, 2, 3),
                                         accepts=_PROMOTED),
    "linear_cross_entropy_backward": Case(
        head_loss.linear_cross_entropy_backward,
        lambda: (0.7, head_loss.linear_cross_entropy_forward(*_head_loss_args())[1]),
        caches=(1,)),
}


def _array_mutations(x: np.ndarray, bound: bool):
    """(label, mutated x) pairs that a kernel must refuse for x (see the module docstring)."""
    if x.dtype.kind == "f":
        # a cache may hold -inf (a masked row's lse): only the dtype matters, not the values
        with np.errstate(invalid="ignore", over="ignore"):
            as_int, as_half = x.astype(np.int64), x.astype(np.float16)
            as_other = x.astype(np.float32 if x.dtype == np.float64 else np.float64)
        yield "int", as_int
        yield "float16", as_half
        yield "a list", x.tolist()
        if bound:
            yield "other float", as_other
    else:  # ids, targets, masks: any array-like is taken, but not floats
        yield "float", x.astype(np.float64)
    yield "empty", x[:0]
    if bound:
        yield "one column short", x[..., :-1]
        yield "one row more", np.concatenate([x, x[:1]])
        if len(x) > 1:
            yield "one row", x[:1]


def _mutations(value, bound: bool, cache: bool):
    if cache:
        yield "a plain tuple", tuple(value if isinstance(value, tuple) else vars(value).values())
    elif isinstance(value, np.ndarray):
        yield from _array_mutations(value, bound)
    elif isinstance(value, (list, tuple)):  # adam's groups and decays, linear_heads' ws, bs, dys
        yield "empty", type(value)()
        for label, first in _mutations(value[0], True, False):
            yield f"first {label}", type(value)([first, *value[1:]])
    elif isinstance(value, int) and not isinstance(value, bool):  # groups, heads, fn
        yield "zero", 0
        yield "not an integer", 1.5
        yield "another integer", value + 8 if value > 100 else value * 7
    elif isinstance(value, float):  # scale, dloss, the Adam scalars
        yield "an array", np.array([value, value])
    elif isinstance(value, type):  # gemm_address's dtype
        yield "not a dtype", "no such dtype"
        yield "unhashable", [value]


def _bad_calls():
    for name, case in CASES.items():
        args = case.args()
        for i, value in enumerate(args):
            for label, _ in _mutations(value, i in case.bound, i in case.caches):
                if f"{i}:{label}" not in case.accepts:
                    yield pytest.param(name, i, label, id=f"{name}-arg{i}-{label}")


def _mutated_args(case: Case, i: int, label: str) -> tuple:
    args = list(case.args())
    mutated = dict(_mutations(args[i], i in case.bound, i in case.caches))
    args[i] = mutated[label]
    return tuple(args)


@pytest.mark.parametrize("name", list(CASES))
def test_valid_arguments_run(name):
    """The control: each case's valid arguments pass, so the bad calls below fail for the one
    thing that was changed."""
    case = CASES[name]
    case.call(*case.args())


@pytest.mark.parametrize("name, i, label", list(_bad_calls()))
def test_bad_argument_raises_value_error(name, i, label):
    case = CASES[name]
    args = _mutated_args(case, i, label)
    with pytest.raises(ValueError):
        case.call(*args)


@pytest.mark.parametrize("name", list(CASES))
def test_accepted_mutations_still_run(name):
    """What a case lists as accepted must really run: the list cannot hide a refusal."""
    case = CASES[name]
    for entry in case.accepts:
        i, label = entry.split(":")
        case.call(*_mutated_args(case, int(i), label))


def _public_callables():
    for info in pkgutil.iter_modules(kernels_package.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{kernels_package.__name__}.{info.name}")
        names = set(getattr(module, "__all__", ()))
        names |= {n for n, obj in vars(module).items() if not n.startswith("_")
                  and callable(obj) and getattr(obj, "__module__", None) == module.__name__}
        yield from ((info.name, n) for n in sorted(names))


def test_every_public_kernel_has_a_case():
    found = list(_public_callables())
    assert len(found) > 25  # the discovery itself works
    missing = [f"{module}.{name}" for module, name in found
               if name not in CASES and name not in NOT_KERNELS]
    assert not missing, f"kernels without a case in {__file__}: {missing}"
    stale = set(CASES) - {name for _, name in found}
    assert not stale, f"cases for kernels that no longer exist: {stale}"


@pytest.mark.parametrize("name", ["relu_backward", "layer_norm_backward", "linear_backward",
                                  "embedding_backward"])
def test_the_reported_crashes_name_dout(name):
    """The four calls of issue 13 (a dout of the wrong size) now say what is wrong."""
    case = CASES[name]
    with pytest.raises(ValueError, match=r"dout must have shape .* like the forward's output"):
        case.call(*_mutated_args(case, 0, "one column short"))

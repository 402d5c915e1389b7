"""The LSTM: the functional pair against finite differences (with a negative control), the
numba kernel against the pair, the module and the model, the carried state, generation.

PyTorch's numbers are in ``reference_checks/test_lstm.py`` (with torch) and
``tests/test_fixtures.py`` (without).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
from _kernel_helpers import TOL, rel_err
from _nn_helpers import assert_gradcheck

from numpy_transformer.checkpoint import load_checkpoint, save_checkpoint
from numpy_transformer.functional import lstm as ref
from numpy_transformer.generate import generate
from numpy_transformer.gradcheck import check_direction, check_module, check_op, numeric_grad
from numpy_transformer.kernels import lstm as fast
from numpy_transformer.nn import LSTM, LSTMLM, LSTMConfig, LSTMState, new_state
from numpy_transformer.optim import Adam
from numpy_transformer.schedules import constant_lr
from numpy_transformer.train import Batch, Trainer

GRAD_TOL = 1e-6


def problem(b, t, c, h, dtype=np.float64, seed=0, scale=0.5):
    """Inputs (x, h0, c0, w_ih, w_hh, b) and upstream gradients (dout, dh_T, dc_T)."""
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal((b, t, c)), rng.standard_normal((b, h)),
              rng.standard_normal((b, h)), scale * rng.standard_normal((c, 4 * h)),
              scale * rng.standard_normal((h, 4 * h)), rng.standard_normal(4 * h)]
    grads = [rng.standard_normal((b, t, h)), rng.standard_normal((b, h)),
             rng.standard_normal((b, h))]
    return [a.astype(dtype) for a in inputs], [g.astype(dtype) for g in grads]


def three_outputs(forward):
    """The pair as ``check_op`` takes it: out, h_T and c_T each get a random gradient."""
    def fwd(*args):
        out, (h_t, c_t), cache = forward(*args)
        return (out, h_t, c_t), cache
    return fwd


NAMES = ("x", "h0", "c0", "w_ih", "w_hh", "b")


# ----------------------------------------------------------------------------- the pair
def test_lstm_pair_gradcheck():
    inputs, _ = problem(2, 5, 3, 4)
    report = check_op(three_outputs(ref.lstm_forward), lambda g, cache: ref.lstm_backward(
        *g, cache), dict(zip(NAMES, inputs, strict=True)), title="lstm")
    assert report.ok(GRAD_TOL), str(report)


def test_lstm_pair_gradcheck_from_a_zero_state():
    inputs, _ = problem(2, 4, 3, 4, seed=1)
    x, _, _, w_ih, w_hh, b = inputs

    def forward(x, w_ih, w_hh, b):
        out, _, cache = ref.lstm_forward(x, None, None, w_ih, w_hh, b)
        return out, cache

    def backward(dout, cache):
        dx, _, _, dw_ih, dw_hh, db = ref.lstm_backward(dout, None, None, cache)
        return dx, dw_ih, dw_hh, db

    report = check_op(forward, backward, {"x": x, "w_ih": w_ih, "w_hh": w_hh, "b": b})
    assert report.ok(GRAD_TOL), str(report)


def test_checker_catches_a_backward_that_forgets_the_forget_gate():
    """Negative control: carrying dc back unchanged (dc_{t-1} = dc instead of dc f)."""
    inputs, _ = problem(2, 5, 3, 4, seed=2)
    x, h0, c0, w_ih, w_hh, b = inputs

    def wrong_backward(g, cache):
        ones = cache.gates.copy()
        ones[..., 4:8] = 1.0  # the forget gate read as 1 in the backward only
        return ref.lstm_backward(*g, cache._replace(gates=ones))

    report = check_op(three_outputs(ref.lstm_forward), wrong_backward,
                      dict(zip(NAMES, inputs, strict=True)))
    assert not report.ok(GRAD_TOL) and report.max_rel > 1e-2


def test_final_state_is_the_last_output_and_a_copy():
    inputs, _ = problem(3, 4, 2, 5)
    out, (h_t, c_t), cache = ref.lstm_forward(*inputs)
    np.testing.assert_array_equal(h_t, out[:, -1])
    np.testing.assert_array_equal(c_t, cache.c[:, -1])
    h_t += 1.0
    assert not np.array_equal(h_t, out[:, -1])


# ----------------------------------------------------------------------------- the kernel
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(3, 5, 4, 6), (70, 7, 5, 8), (33, 1, 3, 4), (1, 9, 2, 3)])
@pytest.mark.parametrize("zero_state", [False, True])
def test_kernel_matches_reference(dtype, shape, zero_state):
    """Several chunks (B > 32, and B = 33: chunks of 17 and 16), one step, one sequence."""
    inputs, grads = problem(*shape, dtype=dtype, seed=sum(shape))
    if zero_state:
        inputs[1] = inputs[2] = grads[1] = grads[2] = None
    out_r, final_r, cache_r = ref.lstm_forward(*inputs)
    out_f, final_f, cache_f = fast.lstm_forward(*inputs)
    assert type(cache_f) is type(cache_r) and out_f.dtype == dtype
    for name, got, want in (("out", out_f, out_r), ("h_T", final_f[0], final_r[0]),
                            ("c_T", final_f[1], final_r[1])):
        assert got.dtype == dtype and rel_err(got, want) <= TOL[dtype], name
    grads_r = ref.lstm_backward(*grads, cache_r)
    grads_f = fast.lstm_backward(*grads, cache_f)
    for name, got, want in zip(("dx", "dh0", "dc0", "dw_ih", "dw_hh", "db"), grads_f, grads_r,
                               strict=True):
        assert got.dtype == dtype and got.shape == want.shape, name
        if not want.any():  # dw_hh from a zero state in one step: exactly zero on both sides
            assert not got.any(), name
            continue
        assert rel_err(got, want) <= TOL[dtype], f"{name}: {rel_err(got, want):.3g}"


def test_kernel_backward_takes_the_reference_cache():
    inputs, grads = problem(5, 6, 3, 4)
    _, _, cache = ref.lstm_forward(*inputs)
    for got, want in zip(fast.lstm_backward(*grads, cache), ref.lstm_backward(*grads, cache),
                         strict=True):
        assert rel_err(got, want) <= TOL[np.float64]


def test_kernel_accepts_non_contiguous_arrays():
    inputs, grads = problem(4, 6, 3, 5)
    x, h0, c0, w_ih, w_hh, b = inputs
    w_ih_f = np.asfortranarray(w_ih)
    x_strided = np.repeat(x, 2, axis=1)[:, ::2]  # same values, non-contiguous
    out, _, cache = fast.lstm_forward(x_strided, h0, c0, w_ih_f, w_hh, b)
    out_ref, _, cache_ref = ref.lstm_forward(*inputs)
    assert rel_err(out, out_ref) <= TOL[np.float64]
    dout = np.repeat(grads[0], 2, axis=2)[..., ::2]
    assert rel_err(fast.lstm_backward(dout, None, None, cache)[0],
                   ref.lstm_backward(grads[0], None, None, cache_ref)[0]) <= TOL[np.float64]


@pytest.mark.parametrize("forward", [ref.lstm_forward, fast.lstm_forward])
@pytest.mark.parametrize("index, bad, message", [
    (0, np.zeros((2, 0, 3)), "length 0"),
    (0, np.zeros((0, 4, 3)), "length 0"),
    (0, np.zeros((2, 4)), "x must have 3 dimensions"),
    (0, np.zeros((2, 4, 3), dtype=int), "x must be a float array"),
    (1, np.zeros((3, 5)), r"h0 must have shape \(2, 5\)"),
    (2, np.zeros((2, 5), np.float32), "c0 has dtype float32"),
    (3, np.zeros((4, 20)), r"w_ih must have shape \(3, 20\)"),
    (4, [[0.0]], "w_hh must be a NumPy array"),
    (5, np.zeros(19), r"b must have shape \(20,\)"),
])
def test_bad_inputs_name_the_argument(forward, index, bad, message):
    inputs, _ = problem(2, 4, 3, 5)
    inputs[index] = bad
    with pytest.raises(ValueError, match=message):
        forward(*inputs)


def test_kernel_refuses_float16_and_bad_upstream_gradients():
    inputs, grads = problem(2, 4, 3, 5)
    with pytest.raises(ValueError, match="float32 or float64"):
        fast.lstm_forward(*[a.astype(np.float16) for a in inputs])
    _, _, cache = fast.lstm_forward(*inputs)
    with pytest.raises(ValueError, match=r"dout must have shape \(2, 4, 5\) like the forward"):
        fast.lstm_backward(grads[0][:, :-1], None, None, cache)
    with pytest.raises(ValueError, match=r"dh_T must be a float64 array of shape \(2, 5\)"):
        fast.lstm_backward(grads[0], grads[1][:1], None, cache)
    with pytest.raises(ValueError, match="cache must be the LSTMCache"):
        fast.lstm_backward(grads[0], None, None, (1, 2))


# ----------------------------------------------------------------------------- modules
def tiny_lm(backend="numpy", layers=2, dtype="float64", **kw) -> LSTMLM:
    return LSTMLM(LSTMConfig(vocab=7, embed=4, hidden=5, layers=layers, max_len=6,
                             backend=backend, dtype=dtype, **kw))


def test_lstm_module_gradcheck():
    rng = np.random.default_rng(3)
    module = LSTM(3, 4, layers=2, rng=rng, backend="numpy")
    assert_gradcheck(check_module(module, {"x": rng.standard_normal((2, 5, 3))}), module)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_lstm_lm_gradcheck(backend):
    model = tiny_lm(backend)
    tokens = {"tokens": np.random.default_rng(4).integers(0, 7, (3, 6))}
    assert_gradcheck(check_module(model, tokens), model)
    assert check_direction(model, tokens).ok(GRAD_TOL)


def test_lstm_lm_checker_catches_a_bias_left_without_gradient():
    """Negative control on the model: backward adds db into b_ih_l0 only."""
    model = tiny_lm()
    original = model.lstm.backward

    def half(dout):
        before = model.lstm.grads["b_hh_l1"].copy()
        dx = original(dout)
        model.lstm.grads["b_hh_l1"][...] = before
        return dx

    model.lstm.backward = half
    report = check_module(model, {"tokens": np.random.default_rng(5).integers(0, 7, (2, 6))})
    assert not report.ok(GRAD_TOL)
    assert [r.name for r in report.rows if not r.ok(GRAD_TOL)] == ["lstm.b_hh_l1"]


def test_parameters_and_initialisation_follow_torch():
    model = LSTMLM(LSTMConfig(vocab=104, embed=85, hidden=128, max_len=100))
    assert model.num_parameters() == 132_336  # 0.11% below the Transformer's 132,488
    names = [n for n, _, _ in model.named_parameters()]
    assert names == ["embed.table", "lstm.w_ih_l0", "lstm.w_hh_l0", "lstm.b_ih_l0",
                     "lstm.b_hh_l0", "head.w", "head.b"]
    bound = 1 / np.sqrt(128)
    for name, p, _ in model.named_parameters():
        if name.startswith("lstm."):  # U(-1/sqrt(H), 1/sqrt(H)), the forget bias included
            assert np.abs(p).max() <= bound and np.abs(p).max() > 0.95 * bound, name
    assert 0.95 < model.embed.params["table"].std() < 1.05  # N(0, 1), nn.Embedding's


@pytest.mark.parametrize("field, value, message", [
    ("hidden", 0, "hidden must be a positive integer"),
    ("layers", 1.5, "layers must be a positive integer"),
    ("embed", -3, "embed must be a positive integer"),
    ("backend", "torch", "backend must be one of"),
    ("dtype", "float16", "dtype must be one of"),
    ("seed", "0", "seed must be an integer"),
    ("seed", -1, "seed must be an integer >= 0, got -1"),  # NumPy's words were its own
    ("embed_std", float("inf"), "embed_std must be a positive finite number"),
    ("embed_std", float("nan"), "embed_std must be a positive finite number"),
])
def test_config_names_the_bad_value(field, value, message):
    kwargs = dict(vocab=7, hidden=5, max_len=6)
    kwargs[field] = value
    with pytest.raises(ValueError, match=message):
        LSTMLM(LSTMConfig(**kwargs))


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_state_carries_a_sequence_fed_in_pieces(backend):
    model = tiny_lm(backend)
    tokens = np.random.default_rng(6).integers(0, 7, (2, 9))
    whole = model.forward(tokens)
    state = new_state(model, 2)
    pieces = [model.forward(tokens[:, a:b], state=state) for a, b in ((0, 4), (4, 5), (5, 9))]
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), whole, rtol=0, atol=1e-12)


@pytest.mark.parametrize("shape_of, message", [
    (lambda L, B, H: (L + 1, B, H), r"state.h must be a float array of shape \(2, 3, 5\)"),
    (lambda L, B, H: (L - 1, B, H), r"got a float64 array of shape \(1, 3, 5\)"),
    (lambda L, B, H: (L, B + 1, H), r"\(layers, batch, hidden\), got a float64 array"),
])
def test_a_state_that_does_not_fit_the_model_is_refused(shape_of, message):
    """More layers than the model (once silently cut), fewer (once an IndexError), another
    batch: each refused naming the shape wanted; the state is left untouched."""
    model = tiny_lm("numpy", layers=2)
    tokens = np.random.default_rng(7).integers(0, 7, (3, 4))
    good = new_state(model, 3)
    bad = LSTMState(*(np.ones(shape_of(*good.h.shape)) for _ in range(2)))
    with pytest.raises(ValueError, match=message):
        model.forward(tokens, state=bad)
    assert (bad.h == 1).all() and (bad.c == 1).all()
    with pytest.raises(ValueError, match="state.c must be"):
        model.forward(tokens, state=LSTMState(good.h, good.c[:, :2]))
    with pytest.raises(ValueError, match="state must be an LSTMState"):
        model.forward(tokens, state=(good.h, good.c))
    model.forward(tokens, state=good)  # the state it fits is taken
    assert np.abs(good.h).max() > 0


def _param_grads(model, tokens, dlogits, state=None) -> dict[str, np.ndarray]:
    model.zero_grad()
    model.forward(tokens, state=state)
    model.backward(dlogits)
    return {name: grad.copy() for name, _, grad in model.named_parameters()}


def _fd_param_grads(model, loss) -> dict[str, np.ndarray]:
    return {name: numeric_grad(loss, p) for name, p, _ in model.named_parameters()}


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_gradients_from_a_zero_state_are_those_without_one(backend):
    """A zero state from ``new_state`` is no state: same gradients, bit for bit, and right.

    The forward writes the final state into the state's arrays, which are the initial state
    of the step: a cache that kept them by reference read h_T, c_T as h_0, c_0 (issue 23).
    """
    model = tiny_lm(backend)
    rng = np.random.default_rng(11)
    tokens, dlogits = rng.integers(0, 7, (3, 6)), rng.standard_normal((3, 6, 7))
    clean = _param_grads(model, tokens, dlogits)
    stated = _param_grads(model, tokens, dlogits, new_state(model, 3))
    numeric = _fd_param_grads(model, lambda: float(
        (model.forward(tokens, state=new_state(model, 3)) * dlogits).sum()))
    for name, want in clean.items():
        np.testing.assert_array_equal(stated[name], want, err_msg=name)
        assert rel_err(stated[name], numeric[name]) <= GRAD_TOL, name


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_truncated_bptt_over_two_windows(backend):
    """Truncated backpropagation through time by hand: window 2 starts from the state window 1
    left (non-zero, carried in the same LSTMState), and its gradient treats that state as a
    constant. Finite differences of window 2's loss from a copy of that state agree."""
    model = tiny_lm(backend)
    rng = np.random.default_rng(12)
    first, second = rng.integers(0, 7, (2, 3, 6))
    dlogits = rng.standard_normal((3, 6, 7))
    state = new_state(model, 3)
    state.h[...], state.c[...] = rng.standard_normal((2,) + state.h.shape)
    model.forward(first, state=state)  # window 1: the state now holds its final state
    carried = LSTMState(state.h.copy(), state.c.copy())
    analytic = _param_grads(model, second, dlogits, state)  # window 2 advances the state
    assert not np.array_equal(state.h, carried.h)

    def loss() -> float:
        fresh = LSTMState(carried.h.copy(), carried.c.copy())
        return float((model.forward(second, state=fresh) * dlogits).sum())

    numeric = _fd_param_grads(model, loss)
    for name, want in numeric.items():
        assert rel_err(analytic[name], want) <= GRAD_TOL, \
            f"{name}: {rel_err(analytic[name], want):.3g}"


def test_numba_and_numpy_models_agree_in_float32():
    tokens = np.random.default_rng(7).integers(0, 7, (40, 6))  # two chunks in the kernel
    models = [tiny_lm(b, dtype="float32") for b in ("numpy", "numba")]
    dlogits = np.random.default_rng(8).standard_normal((40, 6, 7)).astype(np.float32)
    for m in models:
        m.forward(tokens)
        m.backward(dlogits)
    for (name, _, g_ref), (_, _, g_fast) in zip(*(m.named_parameters() for m in models),
                                                strict=True):
        assert rel_err(g_fast, g_ref) <= TOL[np.float32], name


def test_trains_checkpoints_and_generates(tmp_path):
    model = tiny_lm("numba", layers=1)
    rng = np.random.default_rng(9)
    ids = np.tile(np.arange(7), 30)  # a cycle: easy to learn
    trainer = Trainer(model, Adam(lr=0.05), constant_lr(0.05))
    losses = []
    for _ in range(60):
        starts = rng.integers(0, len(ids) - 7, 8)
        x = np.stack([ids[s:s + 6] for s in starts])
        y = np.stack([ids[s + 1:s + 7] for s in starts])
        losses.append(trainer.step(Batch((x,), y)).loss)
    assert losses[-1] < 0.3 * losses[0]
    save_checkpoint(tmp_path / "lstm.npz", step=60, model=model, optimizer=trainer.optimizer,
                    rng={}, config=dataclasses.asdict(model.config), options={},
                    tokenizer=None, meta={"model": "LSTMLM"})
    ckpt = load_checkpoint(tmp_path / "lstm.npz")
    copy = LSTMLM(LSTMConfig(**ckpt.config))
    copy.load_state_dict(ckpt.params)
    out = generate(copy, [0, 1, 2], 12, None, greedy=True)
    np.testing.assert_array_equal(out, np.arange(15) % 7)  # it continues the cycle


def test_generate_carried_state_equals_rereading_the_sequence():
    model = tiny_lm("numba")
    runs = [generate(model, [[1, 2, 3], [4, 5, 6]], 25, np.random.default_rng(10),
                     temperature=0.9, use_cache=c) for c in (True, False)]
    np.testing.assert_array_equal(runs[0], runs[1])
    assert runs[0].shape == (2, 28)


@pytest.mark.parametrize("options", [dict(policy="refill"), dict(keep=3)])
def test_generate_refuses_a_window_policy_for_an_lstm(options):
    with pytest.raises(ValueError, match="an LSTMLM reads none"):
        generate(tiny_lm(), [1, 2], 3, None, greedy=True, **options)


def test_new_state_names_bad_arguments():
    with pytest.raises(ValueError, match="batch must be a positive integer"):
        new_state(tiny_lm(), 0)
    with pytest.raises(ValueError, match="needs an LSTMLM or an LSTM"):
        new_state(object(), 1)


def test_gradcheck_command_prints_the_lstm_tables():
    result = subprocess.run([sys.executable, "-m", "numpy_transformer", "gradcheck", "lstm"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 checks passed, 0 failed" in result.stdout
    assert "LSTM LM (embedding, 2 LSTM layers, linear head): random direction" in result.stdout

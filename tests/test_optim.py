"""Adam / AdamW against the textbook equations, against each other (NumPy vs numba) and against
torch.optim; global-norm clipping against its definition and torch; the LR schedules."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest

from numpy_transformer import config
from numpy_transformer.functional.adam import adam_update as adam_update_numpy
from numpy_transformer.functional.adam import adam_update_group as adam_update_group_numpy
from numpy_transformer.kernels.adam import adam_update as adam_update_numba
from numpy_transformer.kernels.adam import adam_update_group as adam_update_group_numba
from numpy_transformer.optim import Adam, AdamW, clip_grad_norm
from numpy_transformer.schedules import constant_lr, warmup_cosine

BACKENDS = config.BACKENDS
SHAPES = {"emb": (11, 6), "w": (6, 5), "b": (5,), "gain": (5,), "w3": (2, 3, 4)}


def make_params(rng, dtype=np.float64):
    return {k: rng.standard_normal(s).astype(dtype) for k, s in SHAPES.items()}


def make_grads(rng, params, scale=1.0):
    return {k: (scale * rng.standard_normal(p.shape)).astype(p.dtype) for k, p in params.items()}


def textbook_adam(params, grad_seq, lr, betas, eps, wd, decoupled, decayed):
    """Kingma & Ba / Loshchilov & Hutter written plainly, in float64, independent of optim.py."""
    b1, b2 = betas
    p = {k: v.astype(np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    for t, grads in enumerate(grad_seq, start=1):
        for k in p:
            g = grads[k].astype(np.float64)
            w = wd if k in decayed else 0.0
            if decoupled:
                p[k] = p[k] - lr * w * p[k]
            else:
                g = g + w * p[k]
            m[k] = b1 * m[k] + (1 - b1) * g
            v[k] = b2 * v[k] + (1 - b2) * g * g
            m_hat = m[k] / (1 - b1 ** t)
            v_hat = v[k] / (1 - b2 ** t)
            # torch adds eps after dividing sqrt(v) by sqrt(1 - b2^t), i.e. to sqrt(v_hat)
            p[k] = p[k] - lr * m_hat / (np.sqrt(v_hat) + eps)
    return p


# --------------------------------------------------------------------------------------------
# Adam / AdamW arithmetic
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cls", [Adam, AdamW])
def test_matches_textbook_equations(cls, backend):
    rng = np.random.default_rng(0)
    params = make_params(rng)
    grad_seq = [make_grads(rng, params) for _ in range(5)]
    hyper = dict(lr=0.01, betas=(0.8, 0.95), eps=1e-6, wd=0.1)
    expected = textbook_adam(params, grad_seq, **hyper, decoupled=cls is AdamW,
                             decayed={"emb", "w", "w3"})  # the default rule: ndim >= 2
    opt = cls(lr=hyper["lr"], betas=hyper["betas"], eps=hyper["eps"],
              weight_decay=hyper["wd"], backend=backend)
    for grads in grad_seq:
        opt.step(params, grads)
    assert opt.t == 5
    for k in params:
        np.testing.assert_allclose(params[k], expected[k], rtol=1e-12, atol=1e-14, err_msg=k)


@pytest.mark.parametrize("backend", BACKENDS)
def test_first_step_is_lr_times_sign(backend):
    # After one step the bias-corrected moments are g and g^2, so the update is
    # lr * g / (|g| + eps): almost exactly lr * sign(g), whatever the scale of g.
    rng = np.random.default_rng(1)
    params = make_params(rng)
    before = {k: p.copy() for k, p in params.items()}
    grads = make_grads(rng, params, scale=1e3)
    Adam(lr=0.05, backend=backend).step(params, grads)
    for k in params:
        g = grads[k]
        np.testing.assert_allclose(before[k] - params[k], 0.05 * g / (np.abs(g) + 1e-8),
                                   rtol=1e-12, err_msg=k)
        np.testing.assert_allclose(before[k] - params[k], 0.05 * np.sign(g), rtol=1e-6)


HYPER = dict(lr=3e-3, beta1=0.9, beta2=0.999, eps=1e-8)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("decoupled", [False, True])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_numba_kernel_equals_numpy_reference_bitwise(dtype, decoupled, weight_decay):
    rng = np.random.default_rng(2)
    p = rng.standard_normal(1000).astype(dtype)
    m = (0.1 * rng.standard_normal(1000)).astype(dtype)
    v = (0.01 * rng.random(1000)).astype(dtype)
    state_a = [p.copy(), m.copy(), v.copy()]
    state_b = [p.copy(), m.copy(), v.copy()]
    for t in range(1, 6):
        g = rng.standard_normal(1000).astype(dtype)
        hyper = dict(HYPER, weight_decay=weight_decay, t=t, decoupled=decoupled)
        adam_update_numpy(*state_a[:1], g, *state_a[1:], **hyper)
        adam_update_numba(*state_b[:1], g, *state_b[1:], **hyper)
        for name, a, b in zip("pmv", state_a, state_b, strict=True):
            assert a.dtype == dtype
            np.testing.assert_array_equal(a, b, err_msg=f"{name} at step {t}")
    assert not np.array_equal(state_a[0], p)  # the update did something


def test_reference_is_kingma_and_ba_in_float64():
    """One call of the reference against Algorithm 1 written plainly (and AdamW's decay)."""
    rng = np.random.default_rng(12)
    p, g, m = (rng.standard_normal((4, 3)) for _ in range(3))
    v = rng.random((4, 3))
    lr, b1, b2, eps, wd, t = 0.01, 0.8, 0.95, 1e-6, 0.1, 7
    for decoupled in (False, True):
        g_t = g if decoupled else g + wd * p  # (1)
        theta = p * (1 - lr * wd) if decoupled else p  # (2)
        m_t, v_t = b1 * m + (1 - b1) * g_t, b2 * v + (1 - b2) * g_t ** 2  # (3), (4)
        m_hat, v_hat = m_t / (1 - b1 ** t), v_t / (1 - b2 ** t)  # (5), (6)
        expected = theta - lr * m_hat / (np.sqrt(v_hat) + eps)  # (7)
        got = [p.copy(), m.copy(), v.copy()]
        adam_update_numpy(got[0], g, got[1], got[2], lr=lr, beta1=b1, beta2=b2, eps=eps,
                          weight_decay=wd, t=t, decoupled=decoupled)
        for name, x, y in zip("pmv", got, (expected, m_t, v_t), strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-13, atol=0, err_msg=f"{name} {decoupled}")


@pytest.mark.parametrize("dtypes", ["float32", "float64", "mixed"])
@pytest.mark.parametrize("decoupled", [False, True])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_group_kernel_equals_reference_bitwise(dtypes, decoupled, weight_decay):
    """``adam_update_group`` itself, reference against kernel: parameters that decay and
    parameters that do not, one array longer than a work block, and (``mixed``) two dtypes in
    one call, which the kernel splits by dtype."""
    from numpy_transformer.kernels.adam import _BLOCK

    rng = np.random.default_rng(13)
    shapes = [(_BLOCK + 777,), (6, 5), (5,), (3, 4), (4,)]
    dtype_of = {"float32": [np.float32] * 5, "float64": [np.float64] * 5,
                "mixed": [np.float32, np.float64, np.float32, np.float64, np.float64]}[dtypes]
    ps = [rng.standard_normal(s).astype(d) for s, d in zip(shapes, dtype_of, strict=True)]
    states = [[[p.copy() for p in ps], [np.zeros_like(p) for p in ps],
               [np.zeros_like(p) for p in ps]] for _ in range(2)]
    weight_decays = [weight_decay if p.ndim >= 2 else 0.0 for p in ps]
    for t in range(1, 5):
        gs = [rng.standard_normal(p.shape).astype(p.dtype) for p in ps]
        hyper = dict(HYPER, weight_decays=weight_decays, t=t, decoupled=decoupled)
        for update, (qs, ms, vs) in zip((adam_update_group_numpy, adam_update_group_numba),
                                        states, strict=True):
            update(qs, gs, ms, vs, **hyper)
    for k, p in enumerate(ps):
        for name, a, b in zip("pmv", states[0], states[1], strict=True):
            assert a[k].dtype == b[k].dtype == p.dtype
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{name}[{k}]")


def _valid_group(rng):
    ps = [rng.standard_normal((3, 2)), rng.standard_normal(4)]
    return ps, [rng.standard_normal(p.shape) for p in ps], [np.zeros_like(p) for p in ps], \
        [np.zeros_like(p) for p in ps]


BAD_ARGUMENTS = [  # (changed keyword or array, its bad value, the message it must raise)
    ("lr", -1e-3, "lr"), ("lr", float("nan"), "lr"), ("beta1", 1.0, "beta1"),
    ("beta2", -0.1, "beta2"), ("eps", -1.0, "eps"), ("eps", np.ones(2), "eps"),
    ("t", 0, "t must be a positive integer"), ("t", 2.0, "t must"), ("t", True, "t must"),
    ("decoupled", "yes", "decoupled"), ("decoupled", None, "decoupled"),
    ("weight_decays", [0.1], "one number per parameter, 2"),
    ("weight_decays", [0.1, -0.5], r"weight_decays\[1\]"),
    ("weight_decays", "ab", "weight_decays"),
    ("gs", 1, r"gs\[1\] must have shape \(4,\)"), ("ms", 1, r"ms\[1\] must be float64"),
    ("vs", 1, r"vs\[1\] is read-only"), ("ps", 1, r"ps\[1\] must be a float array"),
    ("ps", None, "as many arrays"),
]


def _break(kwargs, arrays, key, bad):
    """Put the bad value in: a keyword, or for an array group, damage its entry ``bad``
    (None: drop that group's last array)."""
    if key in kwargs:
        kwargs[key] = bad
        return
    group = arrays[key]
    if bad is None:
        group.pop()
    else:
        x = group[bad]
        group[bad] = {"gs": x[:-1], "ms": x.astype(np.float32), "ps": x.astype(np.int64),
                      "vs": x}[key]
        if key == "vs":
            x.flags.writeable = False


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("key, bad, message", BAD_ARGUMENTS)
def test_update_group_rejects_bad_arguments_and_changes_nothing(backend, key, bad, message):
    update = {"numpy": adam_update_group_numpy, "numba": adam_update_group_numba}[backend]
    rng = np.random.default_rng(14)
    arrays = dict(zip(("ps", "gs", "ms", "vs"), _valid_group(rng), strict=True))
    before = {k: [x.copy() for x in group] for k, group in arrays.items()}
    kwargs = dict(HYPER, weight_decays=[0.1, 0.0], t=1, decoupled=True)
    _break(kwargs, arrays, key, bad)
    with pytest.raises(ValueError, match=message):
        update(*arrays.values(), **kwargs)
    for k, group in arrays.items():  # the first parameter's arrays were not touched either
        np.testing.assert_array_equal(group[0], before[k][0], err_msg=k)


@pytest.mark.parametrize("backend", BACKENDS)
def test_update_names_the_bad_argument_of_one_parameter(backend):
    update = {"numpy": adam_update_numpy, "numba": adam_update_numba}[backend]
    rng = np.random.default_rng(15)
    p, g = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    m, v = np.zeros_like(p), np.zeros_like(p)
    good = dict(HYPER, weight_decay=0.1, t=1, decoupled=False)
    for change, message in (({"weight_decay": -0.1}, "weight_decay"), ({"t": -2}, "t must"),
                            ({"lr": "0.1"}, "lr")):
        with pytest.raises(ValueError, match=message):
            update(p, g, m, v, **(good | change))
    for args, message in (((p, g.T, m, v), r"g must have shape \(2, 3\)"),
                          ((p, g, m.astype(np.float32), v), "m must be float64")):
        with pytest.raises(ValueError, match=message):
            update(*args, **good)
    np.testing.assert_array_equal(m, 0.0)


@pytest.mark.parametrize("cls", [Adam, AdamW])
def test_one_call_for_all_parameters_equals_numpy_bitwise(cls):
    """The numba path updates every parameter in one call (``kernels/adam.py``): two dtypes
    in one dict, weight decay on some arrays only, an array longer than one work block."""
    from numpy_transformer.kernels.adam import _BLOCK

    rng = np.random.default_rng(4)
    shapes = {"big": (_BLOCK + 777,), "w": (6, 5), "b": (5,), "w64": (3, 4), "b64": (4,)}
    base = {k: rng.standard_normal(s).astype(np.float64 if k.endswith("64") else np.float32)
            for k, s in shapes.items()}
    grads_seq = [make_grads(rng, base) for _ in range(4)]
    results = []
    for backend in BACKENDS:
        params = {k: p.copy() for k, p in base.items()}
        opt = cls(lr=0.01, weight_decay=0.1, backend=backend)
        for grads in grads_seq:
            opt.step(params, grads)
        results.append((params, opt.m, opt.v))
    for (a, ma, va), (b, mb, vb) in zip(results[:1], results[1:], strict=True):
        for k in shapes:
            assert b[k].dtype == base[k].dtype
            for x, y in ((a[k], b[k]), (ma[k], mb[k]), (va[k], vb[k])):
                np.testing.assert_array_equal(x, y, err_msg=k)


def test_numba_path_follows_a_replaced_parameter_array():
    """The one-call path keeps views of the arrays between steps; a parameter (or gradient)
    replaced by a new array must be the one updated next, not the old one."""
    rng = np.random.default_rng(5)
    params = make_params(rng, np.float32)
    grads = make_grads(rng, params)
    opt = Adam(lr=0.1)
    opt.step(params, grads)
    old = params["w"]
    params["w"] = old.copy()
    grads["b"] = grads["b"].copy()
    kept = old.copy()
    opt.step(params, grads)
    np.testing.assert_array_equal(old, kept)  # the replaced array is left alone
    assert not np.array_equal(params["w"], kept)


def test_parameter_set_rejects_mismatched_arrays():
    from numpy_transformer.kernels.adam import ParameterSet

    a, b = np.zeros((3, 2)), np.zeros(5)
    with pytest.raises(ValueError, match=r"gs\[0\] must have shape \(3, 2\) .* got \(2, 3\)"):
        ParameterSet([a, b], [a.T.copy(), b], [a, b], [a, b])  # another shape
    with pytest.raises(ValueError, match=r"gs\[0\] must be float64 .* got float32"):
        ParameterSet([a, b], [a.astype(np.float32), b], [a, b], [a, b])  # another dtype
    with pytest.raises(ValueError, match=r"one dtype, got \['float32', 'float64'\]"):
        c = b.astype(np.float32)
        ParameterSet([a, c], [a, c], [a, c], [a, c])  # two dtypes
    with pytest.raises(ValueError, match=r"vs\[0\] must be C-contiguous"):
        ParameterSet([a, b], [a, b], [a, b], [np.zeros((2, 3)).T, b])  # strided
    with pytest.raises(ValueError, match="as many arrays"):
        ParameterSet([a, b], [a], [a], [a])  # different lengths


def test_numba_path_handles_non_contiguous_params():
    rng = np.random.default_rng(3)
    base = {"w": rng.standard_normal((6, 4)), "b": rng.standard_normal(4)}
    grads_seq = [{"w": rng.standard_normal((4, 6)).T, "b": rng.standard_normal(4)}
                 for _ in range(3)]
    results = []
    for backend in BACKENDS:
        params = {"w": base["w"].T.copy().T, "b": base["b"].copy()}  # w: a Fortran-order view
        assert not params["w"].flags.c_contiguous
        opt = AdamW(lr=0.1, backend=backend)
        for grads in grads_seq:
            opt.step(params, grads)
        results.append(params)
    for k in base:
        np.testing.assert_array_equal(results[0][k], results[1][k], err_msg=k)
        assert not np.array_equal(results[0][k], base[k])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtype_is_preserved(dtype, backend):
    rng = np.random.default_rng(4)
    params = make_params(rng, dtype)
    opt = AdamW(backend=backend)
    opt.step(params, make_grads(rng, params))
    for k in params:
        assert params[k].dtype == dtype and opt.m[k].dtype == dtype and opt.v[k].dtype == dtype


def test_decay_rule_default_names_and_callable():
    rng = np.random.default_rng(5)
    zero = {k: np.zeros_like(p) for k, p in make_params(rng).items()}

    def decayed_after_one_step(**kwargs):
        params = make_params(np.random.default_rng(6))
        before = {k: p.copy() for k, p in params.items()}
        AdamW(lr=0.1, weight_decay=0.5, **kwargs).step(params, zero)  # zero grad: only decay
        return {k for k in params if not np.array_equal(params[k], before[k])}

    assert decayed_after_one_step() == {"emb", "w", "w3"}
    assert decayed_after_one_step(decay={"b", "w"}) == {"b", "w"}
    assert decayed_after_one_step(decay=lambda name, p: name.startswith("w")) == {"w", "w3"}
    # with zero gradient, the update is exactly p * (1 - lr * wd)
    params = make_params(np.random.default_rng(6))
    before = params["w"].copy()
    AdamW(lr=0.1, weight_decay=0.5).step(params, zero)
    np.testing.assert_allclose(params["w"], before * (1 - 0.1 * 0.5), rtol=1e-15)


def test_step_lr_overrides_and_zero_lr_only_moves_moments():
    rng = np.random.default_rng(7)
    params = make_params(rng)
    before = {k: p.copy() for k, p in params.items()}
    opt = Adam(lr=0.5)
    opt.step(params, make_grads(rng, params), lr=0.0)
    for k in params:
        np.testing.assert_array_equal(params[k], before[k])
        assert np.any(opt.m[k] != 0)
    assert opt.t == 1


def test_defaults_are_torchs():
    torch = pytest.importorskip("torch")
    for ours, theirs in ((Adam(), torch.optim.Adam), (AdamW(), torch.optim.AdamW)):
        d = theirs([torch.zeros(1, requires_grad=True)]).defaults
        assert (ours.lr, ours.betas, ours.eps, ours.weight_decay) == \
            (d["lr"], d["betas"], d["eps"], d["weight_decay"]), type(ours).__name__


# --------------------------------------------------------------------------------------------
# Against PyTorch: 20 steps of clip + step with a warmup-cosine schedule
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-6), (np.float64, 1e-12)])
@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_matches_torch_over_20_steps(name, dtype, tol, backend):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    params = make_params(rng, dtype)
    wd = 0.05
    ours = {"Adam": Adam, "AdamW": AdamW}[name](lr=1.0, betas=(0.9, 0.99), eps=1e-7,
                                                 weight_decay=wd, backend=backend)
    tparams = {k: torch.tensor(p.copy(), requires_grad=True) for k, p in params.items()}
    groups = [{"params": [t for k, t in tparams.items() if params[k].ndim >= 2],
               "weight_decay": wd},
              {"params": [t for k, t in tparams.items() if params[k].ndim < 2],
               "weight_decay": 0.0}]
    theirs = getattr(torch.optim, name)(groups, lr=1.0, betas=(0.9, 0.99), eps=1e-7)
    schedule = warmup_cosine(0.05, warmup_steps=5, total_steps=20, floor=0.005)
    for step in range(1, 21):
        # large gradients on some steps, so clipping is active on those and not on others
        grads = make_grads(rng, params, scale=3.0 if step % 2 else 0.05)
        for k, t in tparams.items():
            t.grad = torch.tensor(grads[k].copy())
        norm = clip_grad_norm(grads, max_norm=1.0)
        tnorm = torch.nn.utils.clip_grad_norm_(list(tparams.values()), max_norm=1.0)
        assert math.isclose(norm, float(tnorm), rel_tol=10 * tol), f"norm at step {step}"
        for k, t in tparams.items():
            np.testing.assert_allclose(grads[k], t.grad.numpy(), rtol=10 * tol, atol=tol,
                                       err_msg=f"clipped grad {k} at step {step}")
        lr = schedule(step)
        ours.step(params, grads, lr=lr)
        for group in theirs.param_groups:
            group["lr"] = lr
        theirs.step()
    for k, t in tparams.items():
        np.testing.assert_allclose(params[k], t.detach().numpy(), rtol=0, atol=tol,
                                   err_msg=f"param {k} after 20 steps")
        state = theirs.state[t]
        np.testing.assert_allclose(ours.m[k], state["exp_avg"].numpy(), rtol=0, atol=tol,
                                   err_msg=f"m[{k}]")
        np.testing.assert_allclose(ours.v[k], state["exp_avg_sq"].numpy(), rtol=0, atol=tol,
                                   err_msg=f"v[{k}]")


# --------------------------------------------------------------------------------------------
# Optimiser state
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_state_dict_round_trip_through_npz_resumes_identically(backend):
    rng = np.random.default_rng(9)
    params0 = make_params(rng, np.float32)
    grad_seq = [make_grads(rng, params0) for _ in range(20)]

    straight = {k: p.copy() for k, p in params0.items()}
    opt = AdamW(lr=0.01, backend=backend)
    for grads in grad_seq:
        opt.step(straight, grads)

    resumed = {k: p.copy() for k, p in params0.items()}
    first = AdamW(lr=0.01, backend=backend)
    for grads in grad_seq[:10]:
        first.step(resumed, grads)
    state = first.state_dict()
    flat = {k: v for k, v in state.items() if k not in ("m", "v")}
    flat |= {f"m/{k}": a for k, a in state["m"].items()}
    flat |= {f"v/{k}": a for k, a in state["v"].items()}
    buf = io.BytesIO()
    np.savez(buf, **flat)
    buf.seek(0)
    with np.load(buf) as z:
        loaded = {k: z[k] for k in z.files}
    state2 = {k: loaded[k] for k in ("t", "lr", "beta1", "beta2", "eps", "weight_decay")}
    state2["m"] = {k[2:]: a for k, a in loaded.items() if k.startswith("m/")}
    state2["v"] = {k[2:]: a for k, a in loaded.items() if k.startswith("v/")}
    second = AdamW(lr=123.0, backend=backend)  # hyperparameters come from the state
    second.load_state_dict(state2)
    assert second.t == 10 and second.lr == 0.01
    for grads in grad_seq[10:]:
        second.step(resumed, grads)
    for k in params0:
        np.testing.assert_array_equal(resumed[k], straight[k], err_msg=k)


def test_state_dict_is_a_copy():
    rng = np.random.default_rng(10)
    params = make_params(rng)
    opt = Adam()
    opt.step(params, make_grads(rng, params))
    state = opt.state_dict()
    m_saved = state["m"]["w"].copy()
    opt.step(params, make_grads(rng, params))
    np.testing.assert_array_equal(state["m"]["w"], m_saved)
    assert state["t"] == 1 and isinstance(state["t"], int)


def test_load_state_dict_rejects_bad_state():
    good = Adam().state_dict()
    with pytest.raises(ValueError, match="keys"):
        Adam().load_state_dict({k: v for k, v in good.items() if k != "t"})
    with pytest.raises(ValueError, match="t"):
        Adam().load_state_dict(good | {"t": -1})
    with pytest.raises(ValueError, match="different keys"):
        Adam().load_state_dict(good | {"t": 1, "m": {"w": np.zeros(2)}, "v": {}})
    with pytest.raises(ValueError, match="fresh state"):
        Adam().load_state_dict(good | {"t": 3})


# --------------------------------------------------------------------------------------------
# Validation: a bad call raises and changes nothing
# --------------------------------------------------------------------------------------------

def test_bad_step_calls_raise_and_change_nothing():
    rng = np.random.default_rng(11)
    params = make_params(rng)
    grads = make_grads(rng, params)
    opt = Adam()
    opt.step(params, grads)
    snapshot = ({k: p.copy() for k, p in params.items()}, opt.t)

    bad_calls = [
        ({**params}, {k: g for k, g in grads.items() if k != "b"}, "no gradient for \\['b'\\]"),
        (params, {**grads, "b": np.zeros(7)}, "grads\\['b'\\]"),
        (params, {**grads, "b": grads["b"].astype(np.float32)}, "float32"),
        ({**params, "extra": np.zeros(3)}, {**grads, "extra": np.zeros(3)}, "new \\['extra'\\]"),
        (params, {**grads, "w": grads["w"].astype(int)}, "float array"),
    ]
    for p, g, msg in bad_calls:
        with pytest.raises(ValueError, match=msg):
            opt.step(p, g)
    with pytest.raises(ValueError, match="lr"):
        opt.step(params, grads, lr=-1.0)
    ro = {k: p.copy() for k, p in params.items()}
    ro["w"].flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        opt.step(ro, grads)
    for k in params:
        np.testing.assert_array_equal(params[k], snapshot[0][k])
    assert opt.t == snapshot[1]
    with pytest.raises(ValueError, match="not parameters"):
        AdamW(decay={"nope"}).step(params, grads)


@pytest.mark.parametrize("kwargs, word", [
    ({"lr": -1e-3}, "lr"), ({"lr": float("nan")}, "lr"), ({"betas": (1.0, 0.9)}, "beta1"),
    ({"betas": (0.9, -0.1)}, "beta2"), ({"betas": 0.9}, "betas"), ({"eps": -1.0}, "eps"),
    ({"weight_decay": -0.1}, "weight_decay"), ({"backend": "cuda"}, "backend"),
    ({"decay": "w"}, "decay"),
])
def test_bad_constructor_arguments(kwargs, word):
    with pytest.raises(ValueError, match=word):
        AdamW(**kwargs)


# --------------------------------------------------------------------------------------------
# Gradient clipping
# --------------------------------------------------------------------------------------------

def test_clip_uses_one_global_norm_and_returns_it_before_clipping():
    rng = np.random.default_rng(12)
    grads = {"big": 10 * rng.standard_normal((4, 5)), "small": 0.1 * rng.standard_normal(3)}
    before = {k: g.copy() for k, g in grads.items()}
    expected = np.sqrt(sum((g ** 2).sum() for g in before.values()))
    norm = clip_grad_norm(grads, max_norm=2.0)
    assert math.isclose(norm, expected, rel_tol=1e-12)
    coef = 2.0 / (expected + 1e-6)
    for k in grads:  # every tensor by the SAME factor: the direction is kept
        np.testing.assert_allclose(grads[k], before[k] * coef, rtol=1e-12, err_msg=k)
    after = np.sqrt(sum((g ** 2).sum() for g in grads.values()))
    assert after < 2.0 and math.isclose(after, 2.0, rel_tol=1e-6)


def test_clip_leaves_small_gradients_alone():
    grads = {"a": np.array([0.3, 0.4], dtype=np.float32)}
    assert math.isclose(clip_grad_norm(grads, 1.0), 0.5, rel_tol=1e-7)
    np.testing.assert_array_equal(grads["a"], np.array([0.3, 0.4], dtype=np.float32))
    assert grads["a"].dtype == np.float32
    assert clip_grad_norm({}, 1.0) == 0.0


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_clip_non_finite_norm_returns_it_and_changes_nothing(bad):
    grads = {"a": np.array([1.0, bad]), "b": np.array([5.0, 6.0])}
    norm = clip_grad_norm(grads, 1.0)
    assert not math.isfinite(norm)
    assert math.isnan(norm) == math.isnan(bad)
    np.testing.assert_array_equal(grads["b"], [5.0, 6.0])


@pytest.mark.parametrize("max_norm", [0.0, -1.0, float("inf"), float("nan"), "1", True])
def test_clip_rejects_bad_max_norm(max_norm):
    with pytest.raises(ValueError, match="max_norm"):
        clip_grad_norm({"a": np.ones(2)}, max_norm)


# --------------------------------------------------------------------------------------------
# Schedules
# --------------------------------------------------------------------------------------------

def test_constant_lr():
    schedule = constant_lr(3e-4)
    assert [schedule(s) for s in (0, 1, 10 ** 6)] == [3e-4] * 3
    with pytest.raises(ValueError, match="lr"):
        constant_lr(0.0)


def test_warmup_cosine_key_steps():
    lr, floor = 1e-3, 1e-4
    s = warmup_cosine(lr, warmup_steps=10, total_steps=110, floor=floor)
    assert s(0) == 0.0
    assert math.isclose(s(1), lr / 10)
    assert math.isclose(s(5), lr / 2)
    assert math.isclose(s(10), lr)  # peak at the end of warmup
    assert math.isclose(s(60), (lr + floor) / 2)  # cosine half way: cos(pi/2) = 0
    assert math.isclose(s(35), floor + (lr - floor) * (1 + math.cos(math.pi / 4)) / 2)
    assert math.isclose(s(110), floor) and s(10 ** 6) == s(110)
    values = [s(k) for k in range(0, 120)]
    assert np.all(np.diff(values[:11]) > 0)  # rising warmup
    assert np.all(np.diff(values[10:]) <= 0)  # falling afterwards
    no_warmup = warmup_cosine(lr, warmup_steps=0, total_steps=4)
    assert no_warmup(0) == lr and math.isclose(no_warmup(2), lr / 2) and no_warmup(4) == 0.0


@pytest.mark.parametrize("args, word", [
    ((0.0, 1, 10), "lr"), ((1e-3, -1, 10), "warmup_steps"), ((1e-3, 1.5, 10), "warmup_steps"),
    ((1e-3, 10, 10), "total_steps"), ((1e-3, 1, 10, 2e-3), "floor"),
    ((1e-3, 1, 10, -1e-5), "floor"),
])
def test_warmup_cosine_rejects_bad_arguments(args, word):
    with pytest.raises(ValueError, match=word):
        warmup_cosine(*args)
    with pytest.raises(ValueError, match="step"):
        warmup_cosine(1e-3, 1, 10)(-1)

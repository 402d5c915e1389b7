"""The LSTM against ``torch.nn.LSTM``: one layer with an initial state and gradients into the
final state, the whole ``LSTMLM`` (two layers) by parameter name, both backends, float64 to
1e-10 and float32 to 1e-5; and fifty training steps in both frameworks.

Our weights are the transposes of PyTorch's (``w_ih`` (C, 4H) against ``weight_ih_l0``
(4H, C)), the gate blocks in the same order (i, f, g, o); our op takes one bias, the sum of
PyTorch's two, whose gradients are both ``db``.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from numpy_transformer import config  # noqa: E402
from numpy_transformer.backend import get_backend  # noqa: E402
from numpy_transformer.nn import LSTMLM, LSTMConfig  # noqa: E402
from numpy_transformer.torch_twins import TORCH_DTYPES  # noqa: E402
from reference_checks import end_to_end as e2e  # noqa: E402
from reference_checks.compare import WORST, assert_close, check_module  # noqa: E402

DTYPES = [getattr(np, name) for name in config.DTYPES]
BACKENDS = config.BACKENDS


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [3, 40])  # 40: two chunks of sequences in the kernel
def test_lstm_op_against_torch(dtype, backend, batch):
    r = np.random.default_rng(batch)
    t, c, h = 7, 4, 6
    lstm = torch.nn.LSTM(c, h, batch_first=True).to(TORCH_DTYPES[np.dtype(dtype)])
    x, h0, c0 = (torch.tensor(r.standard_normal(s).astype(dtype), requires_grad=True)
                 for s in ((batch, t, c), (1, batch, h), (1, batch, h)))
    y, (h_t, c_t) = lstm(x, (h0, c0))
    gs = [r.standard_normal(tuple(a.shape)).astype(dtype) for a in (y, h_t, c_t)]
    sum((a * torch.from_numpy(g)).sum() for a, g in zip((y, h_t, c_t), gs, strict=True)).backward()

    def npy(a):
        return a.detach().numpy().copy()

    ops = get_backend(backend)
    b = npy(lstm.bias_ih_l0 + lstm.bias_hh_l0)
    out, (oh, oc), cache = ops.lstm_forward(npy(x), npy(h0[0]), npy(c0[0]),
                                            npy(lstm.weight_ih_l0.T), npy(lstm.weight_hh_l0.T), b)
    family = f"lstm op ({backend})"
    for name, ours, theirs in (("out", out, y), ("h_T", oh, h_t[0]), ("c_T", oc, c_t[0])):
        assert_close(family, name, ours, npy(theirs), dtype)
    grads = ops.lstm_backward(gs[0], gs[1][0], gs[2][0], cache)
    theirs = {"dx": x.grad, "dh0": h0.grad[0], "dc0": c0.grad[0],
              "dw_ih": lstm.weight_ih_l0.grad.T, "dw_hh": lstm.weight_hh_l0.grad.T,
              "db (bias_ih)": lstm.bias_ih_l0.grad}
    for (name, t_grad), ours in zip(theirs.items(), grads, strict=True):
        assert_close(family, name, ours, t_grad.numpy(), dtype)
    assert_close(family, "db (bias_hh)", grads[-1], lstm.bias_hh_l0.grad.numpy(), dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_lstm_lm_against_torch(dtype, backend):
    model = LSTMLM(LSTMConfig(vocab=11, embed=6, hidden=8, layers=2, max_len=9,
                              dtype=np.dtype(dtype).name, backend=backend, seed=3))
    tokens = np.random.default_rng(4).integers(0, 11, (3, 9))
    check_module(f"lstm model ({backend})", model, (tokens,))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fifty_lstm_steps_agree(dtype):
    """Adam (lr 2e-3), global-norm clipping at 1.0, batch 8 x context 32 of the corpus; the
    numba backend. Nothing in an LSTM has a kink, so float32 does not drift apart."""
    model = LSTMLM(e2e.lstm_config(dtype))
    assert model.num_parameters() == 132_336
    result = e2e.compare_training(model, e2e.char_batches(50, batch=8, context=32, seed=1))
    diffs = np.abs(np.array(result["ours"]) - np.array(result["torch"]))
    key = ("e2e lstm |dloss| (abs)", dtype)
    WORST[key] = max(WORST[key], (float(diffs.max()), f"step {int(diffs.argmax()) + 1}"))
    tol = {"float32": 1e-4, "float64": 1e-9}[dtype]
    assert diffs.max() <= tol, f"losses differ by {diffs.max():.2e}"
    assert result["ours"][-1] < result["ours"][0] - 0.5, "the model did not learn"
    for name, diff in result["param_diff"].items():
        assert diff <= tol, f"final {name} differs by {diff:.2e} (relative)"

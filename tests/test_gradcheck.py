"""The checker itself: it must pass right backwards and catch wrong ones (negative controls)."""

import numpy as np
import pytest

from numpy_transformer import functional as F
from numpy_transformer.gradcheck import check_op, numeric_grad


def test_numeric_grad_of_a_known_function():
    x = np.array([0.3, -1.2, 2.0])
    g = numeric_grad(lambda: float((x ** 3).sum()), x)
    np.testing.assert_allclose(g, 3 * x ** 2, rtol=1e-8)
    np.testing.assert_array_equal(x, [0.3, -1.2, 2.0])  # restored


def test_catches_a_wrong_softmax_backward():
    x = np.random.default_rng(0).normal(size=(3, 5))

    def wrong_backward(dy, y):  # forgets the normalisation term
        return y * dy

    assert check_op(F.softmax_forward, F.softmax_backward, {"x": x}).ok(1e-6)
    report = check_op(F.softmax_forward, wrong_backward, {"x": x.copy()})
    assert not report.ok(1e-6) and report.max_rel > 1e-2


def test_catches_gelu_with_the_other_gelus_derivative():
    x = np.random.default_rng(1).normal(size=(4, 6)) * 2
    report = check_op(F.gelu_tanh_forward, lambda d, c: F.gelu_backward(d, c[0]), {"x": x})
    assert not report.ok(1e-6)


def test_catches_a_layer_norm_backward_missing_the_mean_term():
    rng = np.random.default_rng(2)
    x, w, b = rng.normal(size=(2, 3, 5)), rng.normal(size=5), rng.normal(size=5)

    def wrong(dout, cache):
        dx, dw, db = F.layer_norm_backward(dout, cache)
        dxh = dout * cache.w
        return dx + cache.rstd * dxh.mean(-1, keepdims=True), dw, db  # the mean term dropped

    assert not check_op(F.layer_norm_forward, wrong, {"x": x, "w": w, "b": b}).ok(1e-6)


def test_refuses_float32():
    with pytest.raises(ValueError, match="float32"):
        check_op(F.softmax_forward, F.softmax_backward, {"x": np.ones((2, 3), np.float32)})


def test_report_table_names_every_tensor():
    rng = np.random.default_rng(3)
    report = check_op(F.linear_forward, F.linear_backward,
                      {"x": rng.normal(size=(2, 3)), "w": rng.normal(size=(3, 2)),
                       "b": rng.normal(size=2)}, title="linear")
    text = str(report)
    assert "linear" in text and all(f"\n  {n} " in text for n in "xwb")

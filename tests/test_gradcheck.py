"""The checker itself: it must pass right backwards and catch wrong ones (negative controls)."""

import numpy as np
import pytest

from numpy_transformer import functional as F
from numpy_transformer.gradcheck import (
    WrongGradientError,
    check_op,
    compare,
    numeric_grad,
    verdict,
)


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
    report = check_op(F.gelu_tanh_forward, F.gelu_backward, {"x": x})
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


def test_numeric_grad_at_chosen_entries():
    x = np.random.default_rng(4).normal(size=(3, 4))
    entries = np.array([0, 5, 11])
    g = numeric_grad(lambda: float((np.sin(x) * x).sum()), x, entries=entries)
    full = np.sin(x) + x * np.cos(x)
    assert g.shape == (3,)
    np.testing.assert_allclose(g, full.reshape(-1)[entries], rtol=1e-7, atol=1e-8)


def softmax_case():
    """A softmax, a random upstream gradient, the library's dx and its finite differences."""
    rng = np.random.default_rng(5)
    x, dy = rng.normal(size=(2, 6)), rng.normal(size=(2, 6))
    y, cache = F.softmax_forward(x)
    dx = F.softmax_backward(dy, cache)
    numeric = numeric_grad(lambda: float((F.softmax_forward(x)[0] * dy).sum()), x)
    return x, y, dy, dx, numeric


def test_compare_says_exact_and_close_for_a_right_gradient(capsys):
    _, y, dy, dx, numeric = softmax_case()
    mine = y * (dy - (dy * y).sum(-1, keepdims=True))  # the closed form, written by hand
    compare("dx", mine, dx, numeric)
    line = capsys.readouterr().out
    assert line.startswith("dx ") and line.count("\n") == 1
    assert "library exact" in line and "finite differences close (max rel err" in line
    jacobian = np.einsum("ni,ij->nij", y, np.eye(6)) - y[:, :, None] * y[:, None, :]
    compare("dx", np.einsum("nij,ni->nj", jacobian, dy), dx, numeric)
    line = capsys.readouterr().out
    assert "library close" in line and "WRONG" not in line


def test_compare_catches_a_wrong_gradient_and_raises_after_printing(capsys):
    """Negative control: softmax's backward without the normalisation term is WRONG."""
    _, y, dy, dx, numeric = softmax_case()
    with pytest.raises(WrongGradientError, match="WRONG"):
        compare("dx", y * dy, dx, numeric)
    assert capsys.readouterr().out.count("WRONG (max abs err") == 2  # printed before raising
    compare("dx", y * dy, numeric=numeric, strict=False)  # only reported
    line = capsys.readouterr().out
    assert "finite differences WRONG" in line and "library" not in line


def test_compare_checks_a_sample_of_entries(capsys):
    x, y, dy, dx, numeric = softmax_case()
    entries = np.array([1, 7])
    sample = numeric_grad(lambda: float((F.softmax_forward(x)[0] * dy).sum()), x,
                          entries=entries)
    compare("dx", dx, numeric=sample, entries=entries)
    assert "finite differences close" in capsys.readouterr().out
    with pytest.raises(WrongGradientError):
        compare("dx", dx, numeric=-sample, entries=entries)


def test_compare_line_columns_and_a_name_that_says_wrong(capsys):
    """The verdicts decide the raise, not the printed text: a name holding "WRONG" passes."""
    a = np.array([1.0, -2.0, 3.0])
    compare("WRONG-dx", a, a, a + 1e-12)
    assert capsys.readouterr().out == ("WRONG-dx        library exact                        "
                                       "finite differences close (max rel err 3.3e-13)\n")
    compare("dx", a, a + 1, label="separate", strict=False)
    assert capsys.readouterr().out == "dx              separate WRONG (max abs err 1.0e+00)\n"


def test_verdicts():
    a = np.array([1.0, -2.0, 3.0])
    assert verdict(a, a.copy()) == "exact"
    assert verdict(a, a + 1e-12).startswith("close (max rel err")
    assert verdict(np.zeros(3), np.full(3, 1e-13)).startswith("close (max abs err")
    assert verdict(a, a + 0.1) == "WRONG (max abs err 1.0e-01)"
    assert verdict(a, a[None]) == "WRONG (shape (3,), expected (1, 3))"
    assert verdict(a * np.nan, a) == "WRONG (not finite)"


def test_compare_refuses_an_unfilled_exercise_and_a_missing_reference():
    with pytest.raises(ValueError, match="dv is still"):
        compare("dv", ..., np.zeros(2))
    with pytest.raises(ValueError, match="needs a reference"):
        compare("dv", np.zeros(2))

"""The synthetic tasks: targets checked element by element against their definitions."""

from __future__ import annotations

import numpy as np
import pytest

from numpy_transformer.tasks import IGNORE_INDEX, copy_back_batch, reverse_batch, sort_batch


def test_sort_targets_are_the_sorted_inputs():
    x, y = sort_batch(500, np.random.default_rng(0))
    assert x.shape == y.shape == (500, 10) and x.dtype == y.dtype == np.int64
    assert x.min() >= 0 and x.max() <= 9
    assert np.all(np.diff(y, axis=1) >= 0)  # non-decreasing
    for xb, yb in zip(x, y, strict=True):  # the same multiset of digits
        assert np.array_equal(np.bincount(xb, minlength=10), np.bincount(yb, minlength=10))
    assert not np.array_equal(x, y)  # the inputs are not already sorted


def test_sort_respects_length_and_digits():
    x, y = sort_batch(20, np.random.default_rng(1), length=5, digits=3)
    assert x.shape == (20, 5) and set(np.unique(x).tolist()) <= {0, 1, 2}


@pytest.mark.parametrize("shift", [3, 1, 0])
def test_copy_back_targets_look_back(shift):
    length = 10
    x, y, mask = copy_back_batch(300, np.random.default_rng(2), length=length, shift=shift)
    assert x.shape == y.shape == mask.shape == (300, length) and mask.dtype == bool
    for t in range(length):
        if t >= shift:
            assert mask[:, t].all()
            assert np.array_equal(y[:, t], x[:, t - shift]), t
        else:
            assert not mask[:, t].any()
            assert (y[:, t] == IGNORE_INDEX).all()


def test_copy_forward_variant_targets_the_future_and_masks_the_tail():
    length = 10
    x, y, mask = copy_back_batch(300, np.random.default_rng(3), length=length, shift=-3)
    for t in range(length):
        if t + 3 < length:  # a future token exists
            assert mask[:, t].all()
            assert np.array_equal(y[:, t], x[:, t + 3]), t
        else:
            assert not mask[:, t].any()
            assert (y[:, t] == IGNORE_INDEX).all()
    assert mask.sum() == 300 * 7


def test_reverse_targets_and_teacher_forcing_inputs():
    length, digits = 8, 10
    src, tgt_in, tgt_out = reverse_batch(200, np.random.default_rng(4), length=length)
    assert src.shape == tgt_in.shape == tgt_out.shape == (200, length)
    for t in range(length):
        assert np.array_equal(tgt_out[:, t], src[:, length - 1 - t]), t
    assert (tgt_in[:, 0] == digits).all()  # BOS = digits
    assert np.array_equal(tgt_in[:, 1:], tgt_out[:, :-1])  # shifted right by one
    assert src.max() < digits and tgt_out.max() < digits  # BOS only as the first input
    assert tgt_in.max() == digits


def test_same_seed_same_batch_different_seed_different():
    for make in (sort_batch, copy_back_batch, reverse_batch):
        a = make(50, np.random.default_rng(7))
        b = make(50, np.random.default_rng(7))
        c = make(50, np.random.default_rng(8))
        assert all(np.array_equal(u, v) for u, v in zip(a, b, strict=True)), make.__name__
        assert not np.array_equal(a[0], c[0]), make.__name__


@pytest.mark.parametrize("make", [sort_batch, copy_back_batch, reverse_batch])
def test_bad_arguments(make):
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="n must be"):
        make(0, rng)
    with pytest.raises(ValueError, match="length"):
        make(4, rng, length=0)
    with pytest.raises(ValueError, match="rng"):
        make(4, 1234)


@pytest.mark.parametrize("shift", [10, -10, 2.0, True])
def test_copy_back_rejects_bad_shift(shift):
    with pytest.raises(ValueError, match="shift"):
        copy_back_batch(4, np.random.default_rng(0), length=10, shift=shift)

"""Learning-rate schedules: callables ``step -> lr``, the ``lr`` of each optimiser step.

A training step passes the number of the update about to be made, counting from 1::

    opt.step(params, grads, lr=schedule(opt.t + 1))

:func:`constant_lr` gives the same rate at every step; :func:`warmup_cosine` ramps up linearly,
then decays along a half cosine.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ._checks import check_number

__all__ = ["constant_lr", "warmup_cosine"]


def _check_step(step: object) -> int:
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    return int(step)


def constant_lr(lr: float) -> Callable[[int], float]:
    """The schedule ``step -> lr`` for every step.

    Raises
    ------
    ValueError
        If ``lr`` is not a positive finite number.
    """
    lr = check_number("lr", lr, 0.0, low_open=True)

    def schedule(step: int) -> float:
        _check_step(step)
        return lr

    return schedule


def warmup_cosine(lr: float, warmup_steps: int, total_steps: int,
                  floor: float = 0.0) -> Callable[[int], float]:
    """Linear warmup from 0 to ``lr``, then a half cosine down to ``floor``.

    Parameters
    ----------
    lr : float
        Peak learning rate, reached at ``step == warmup_steps``. Positive.
    warmup_steps : int
        Length of the linear ramp, >= 0 (0: start at the peak).
    total_steps : int
        Step at which the cosine reaches ``floor``; it stays there afterwards.
        Must exceed ``warmup_steps``.
    floor : float, default 0.0
        Final learning rate, in ``[0, lr]``.

    Returns
    -------
    schedule : callable int -> float
        ``schedule(step)`` for ``step >= 0``. Pass the number of the update about to be made,
        counting from 1 (``opt.t + 1``): step 0 gives 0, step 1 gives ``lr / warmup_steps``.

    Raises
    ------
    ValueError
        Naming the first invalid argument.

    Notes
    -----
    ::

        step <= warmup:          lr * step / warmup
        warmup < step < total:   floor + (lr - floor) * (1 + cos(pi * progress)) / 2,
                                 progress = (step - warmup) / (total - warmup)
        step >= total:           floor
    """
    lr = check_number("lr", lr, 0.0, low_open=True)
    for name, value in (("warmup_steps", warmup_steps), ("total_steps", total_steps)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if total_steps <= warmup_steps:
        raise ValueError(f"total_steps ({total_steps}) must exceed warmup_steps "
                         f"({warmup_steps})")
    floor = check_number("floor", floor, 0.0, lr, high_open=False)
    warmup, total = int(warmup_steps), int(total_steps)

    def schedule(step: int) -> float:
        step = _check_step(step)
        if step < warmup:
            return lr * step / warmup
        progress = min((step - warmup) / (total - warmup), 1.0)
        return floor + (lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return schedule

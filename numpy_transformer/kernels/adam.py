"""Adam's update in Numba: all the parameters of a model in one parallel call.

The arithmetic is that of ``optim.adam_update_numpy`` (the readable reference, read it
first), entry by entry, in the parameters' dtype and without fastmath, so the two give the
same numbers bit for bit (``tests/test_optim.py``):

* :class:`ParameterSet`: flat views of same-dtype parameters, gradients and moments, and a
  table of blocks that shares their entries out over the threads; ``update(...)`` applies
  one step to all of them. ``optim.Adam`` keeps one per dtype while the arrays stay the same.
* :func:`adam_update_numba`: the same for one parameter, with the reference's signature.

Why one call for all: the chapter's model has 37 parameter arrays, most of them small. One
parallel call per array cost about 10 us each in start-up and dispatch, 0.4 ms per step for
132k numbers whose arithmetic takes 0.05 ms; one call over a table of blocks takes 0.06 ms.
"""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np
from numba.typed import List

_BLOCK = 8192  # entries per work item: large enough to amortise, small enough to balance


@numba.njit(cache=True, nogil=True, parallel=True)
def _adam_kernel(ps, gs, ms, vs, decay, l2, block_array, block_start, block_stop, w1, beta2,
                 w2, bc2_sqrt, eps, neg_step):  # pragma: no cover - compiled
    # ps, gs, ms, vs: lists of 1-D contiguous arrays of one dtype; decay, l2: (arrays,) of it;
    # block b covers entries block_start[b]:block_stop[b] of array block_array[b]. The
    # scalars arrive in the arrays' dtype, so float32 computes in float32 as the reference.
    # No fastmath: LLVM neither fuses a*b+c into an FMA nor reorders, so each line rounds at
    # the same points as the reference.
    for blk in numba.prange(block_array.size):
        a, lo, hi = block_array[blk], block_start[blk], block_stop[blk]
        # slices, so the loop runs from 0: the compiler makes SIMD code of it (a loop from a
        # start known only at run time must allow for negative, wrapped-around indices)
        p, g, m, v = ps[a][lo:hi], gs[a][lo:hi], ms[a][lo:hi], vs[a][lo:hi]
        dec, wd = decay[a], l2[a]
        for i in range(p.size):
            gi = g[i]
            if wd != 0:
                gi = gi + wd * p[i]  # (0)
            mi = m[i] + w1 * (gi - m[i])  # (2)
            vi = v[i] * beta2 + w2 * gi * gi  # (3)
            denom = np.sqrt(vi) / bc2_sqrt + eps  # (4)
            m[i] = mi
            v[i] = vi
            p[i] = p[i] * dec + neg_step * (mi / denom)  # (1), (5)


class ParameterSet:
    """Parameters, gradients and moments of one dtype, as flat views for :func:`update`.

    Parameters
    ----------
    ps, gs, ms, vs : sequences of C-contiguous ndarrays
        Parameters, gradients, first and second moments; the k-th of each have one shape,
        and all one float dtype. The views made here write through to them.
    """

    def __init__(self, ps: Sequence[np.ndarray], gs: Sequence[np.ndarray],
                 ms: Sequence[np.ndarray], vs: Sequence[np.ndarray]) -> None:
        arrays = (ps, gs, ms, vs)
        dtype = ps[0].dtype
        if len({len(a) for a in arrays}) != 1 or any(
                x.shape != p.shape or x.dtype != dtype or not x.flags.c_contiguous
                for group in arrays for x, p in zip(group, ps, strict=True)):
            raise ValueError("ps, gs, ms, vs must hold C-contiguous arrays of one dtype, "
                             "shaped alike")
        self.dtype = dtype
        self.lists = tuple(List([x.reshape(-1) for x in group]) for group in arrays)
        table = [(k, lo, min(p.size, lo + _BLOCK))
                 for k, p in enumerate(ps) for lo in range(0, p.size, _BLOCK)]
        self.blocks = tuple(np.array(column, dtype=np.int64) for column in zip(*table,
                                                                             strict=True))

    def update(self, decay: np.ndarray, l2: np.ndarray, w1, beta2, w2, bc2_sqrt, eps,
               neg_step) -> None:
        """One Adam/AdamW step of every array, in place.

        ``decay`` and ``l2`` hold one value per parameter; the other scalars are shared. All
        are of the arrays' dtype (see ``optim.adam_update_numpy`` for what each means).
        """
        _adam_kernel(*self.lists, decay, l2, *self.blocks, w1, beta2, w2, bc2_sqrt, eps,
                     neg_step)


def adam_update_numba(p, g, m, v, scratch, decay, l2, w1, beta2, w2, bc2_sqrt, eps, neg_step):
    """The update of ``optim.adam_update_numpy``, for one parameter, by the same kernel.

    Needs ``p``, ``m`` and ``v`` C-contiguous (``g`` is copied if it is not); otherwise falls
    back to the NumPy version. ``scratch`` is unused and accepted only so both share one
    signature.
    """
    if not (p.flags.c_contiguous and m.flags.c_contiguous and v.flags.c_contiguous):
        from ..optim import adam_update_numpy  # the reference, for the rare strided array

        adam_update_numpy(p, g, m, v, scratch, decay, l2, w1, beta2, w2, bc2_sqrt, eps, neg_step)
        return
    one = ParameterSet([p], [np.ascontiguousarray(g)], [m], [v])
    one.update(np.array([decay]), np.array([l2]), w1, beta2, w2, bc2_sqrt, eps, neg_step)

"""Adam's update in Numba: all the parameters of a model in one parallel call.

Same contract as ``functional/adam.py`` (the readable reference, read it first), whose
arithmetic runs here entry by entry, in the parameters' dtype and without fastmath, so the two
give the same numbers bit for bit (``tests/test_optim.py``):

* :func:`adam_update_group`: every parameter of one dtype in one call. It keeps the last few
  :class:`ParameterSet` it built, so a training loop that hands it the same arrays every step
  builds one once.
* :func:`adam_update`: the same for one parameter.
* :class:`ParameterSet`: the addresses of same-dtype parameters, gradients and moments, and a
  table of blocks that shares their entries out over the threads; ``update(...)`` applies
  one step to all of them.

Why one call for all: the chapter's model has 37 parameter arrays, most of them small. One
parallel call per array cost about 10 us each in start-up and dispatch, 0.4 ms per step for
132k numbers whose arithmetic takes 0.05 ms; one call over a table of blocks takes 0.06 ms.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from .._checks import check_scalar
from ..functional import adam as reference
from ._jit import jit_options
from ._validate import check_kernel_float

# The operations this module gives the numba backend (numpy_transformer.backend)
__all__ = ['adam_update', 'adam_update_group']

_BLOCK = 8192  # entries per work item: large enough to amortise, small enough to balance
_KEPT_SETS = 4  # ParameterSets remembered by adam_update_group (one per model and dtype)


@intrinsic
def _pointer_to(typingctx, address, like):
    # the integer address as a pointer to numbers of like's dtype (like: an array)
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

    return types.CPointer(like.dtype)(address, like), codegen


@numba.njit(parallel=True, **jit_options())
def _adam_kernel(addresses, sizes, decay, l2, block_array, block_start, block_stop, w1, beta2,
                 w2, bc2_sqrt, eps, neg_step):  # pragma: no cover - compiled
    # addresses: (4, arrays) int64, the data of the k-th p, g, m, v in column k, each
    # C-contiguous with sizes[k] entries of decay's dtype; decay, l2: (arrays,); block b
    # covers entries block_start[b]:block_stop[b] of array block_array[b]. The scalars arrive
    # in the arrays' dtype, so float32 computes in float32 as the reference. No fastmath:
    # LLVM neither fuses a*b+c into an FMA nor reorders, so each line rounds at the same
    # points as the reference.
    for blk in numba.prange(block_array.size):
        a, lo, hi = block_array[blk], block_start[blk], block_stop[blk]
        n = sizes[a]
        # slices, so the loop runs from 0: the compiler makes SIMD code of it (a loop from a
        # start known only at run time must allow for negative, wrapped-around indices)
        p = numba.carray(_pointer_to(addresses[0, a], decay), n)[lo:hi]
        g = numba.carray(_pointer_to(addresses[1, a], decay), n)[lo:hi]
        m = numba.carray(_pointer_to(addresses[2, a], decay), n)[lo:hi]
        v = numba.carray(_pointer_to(addresses[3, a], decay), n)[lo:hi]
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
    """Parameters, gradients and moments of one dtype, for :func:`update` to change in place.

    Parameters
    ----------
    ps, gs, ms, vs : sequences of C-contiguous, writeable ndarrays
        Parameters, gradients, first and second moments; the k-th of each have one shape,
        and all one dtype, float32 or float64. The set holds them (and their addresses).

    Raises
    ------
    ValueError
        If the arrays do not fit that description (checked once, here; :meth:`update` checks
        its own arguments).
    """

    def __init__(self, ps: Sequence[np.ndarray], gs: Sequence[np.ndarray],
                 ms: Sequence[np.ndarray], vs: Sequence[np.ndarray]) -> None:
        arrays = (ps, gs, ms, vs)
        _check_arrays(ps, gs, ms, vs)
        for group_name, group in zip("pgmv", arrays, strict=True):
            for k, x in enumerate(group):  # (one Numba type for all: writeable, C order)
                if not (x.flags.c_contiguous and x.flags.writeable):
                    raise ValueError(f"{group_name}s[{k}] must be C-contiguous and writeable")
        self.dtype = ps[0].dtype
        # the kernel reaches the arrays by address (a typed List of them would compile
        # Numba's list code, which is not cached, in every new process: 0.3-0.5 s); these
        # references keep them alive, and so the addresses valid, as long as this set
        self.arrays = tuple(tuple(group) for group in arrays)
        self.addresses = np.array([[x.ctypes.data for x in group] for group in arrays],
                                  dtype=np.int64)  # (4, arrays)
        self.sizes = np.array([p.size for p in ps], dtype=np.int64)
        table = [(k, lo, min(p.size, lo + _BLOCK))
                 for k, p in enumerate(ps) for lo in range(0, p.size, _BLOCK)]
        self.blocks = tuple(np.array(column, dtype=np.int64) for column in zip(*table,
                                                                             strict=True))

    def update(self, decay: np.ndarray, l2: np.ndarray, w1, beta2, w2, bc2_sqrt, eps,
               neg_step) -> None:
        """One Adam/AdamW step of every array, in place.

        ``decay`` and ``l2`` hold one value per parameter; the other scalars are shared. All
        are of the arrays' dtype (see ``functional.adam.adam_update`` for what each means).
        """
        n = self.sizes.size
        for name, values in (("decay", decay), ("l2", l2)):
            if not (isinstance(values, np.ndarray) and values.shape == (n,)
                    and values.dtype == self.dtype):
                raise ValueError(f"{name} must be a {self.dtype} array of shape ({n},), one "
                                 f"value per parameter, got {getattr(values, 'shape', values)}")
        for name, value in (("w1", w1), ("beta2", beta2), ("w2", w2), ("bc2_sqrt", bc2_sqrt),
                            ("eps", eps), ("neg_step", neg_step)):
            check_scalar(name, value)
        _adam_kernel(self.addresses, self.sizes, decay, l2, *self.blocks, w1, beta2, w2,
                     bc2_sqrt, eps, neg_step)


def _check_arrays(ps, gs, ms, vs) -> None:
    """Raise ``ValueError`` unless ps, gs, ms, vs hold as many arrays, at least one, the k-th
    of each of ps[k]'s shape, all of one dtype the kernel is compiled for."""
    lengths = [len(group) for group in (ps, gs, ms, vs)]
    if len(set(lengths)) != 1 or lengths[0] == 0:
        raise ValueError(f"ps, gs, ms, vs must hold as many arrays, at least one, got {lengths}")
    dtype = check_kernel_float("ps[0]", ps[0]).dtype
    for group_name, group in zip("pgmv", (ps, gs, ms, vs), strict=True):
        for k, (x, p) in enumerate(zip(group, ps, strict=True)):
            name = f"{group_name}s[{k}]"
            check_kernel_float(name, x)
            if x.shape != p.shape or x.dtype != dtype:
                raise ValueError(f"{name} must be {dtype} of shape {p.shape} like ps[{k}], got "
                                 f"{x.dtype} {x.shape}")


_sets: OrderedDict = OrderedDict()  # identity of the arrays -> their ParameterSet


def _parameter_set(ps, gs, ms, vs) -> ParameterSet:
    """The ParameterSet of these arrays, built once while they stay the same objects (the
    set keeps them alive, so their identities cannot be reused meanwhile)."""
    key = tuple(id(x) for group in (ps, gs, ms, vs) for x in group)
    found = _sets.get(key)
    if found is None:
        found = _sets[key] = ParameterSet(ps, gs, ms, vs)
        if len(_sets) > _KEPT_SETS:
            _sets.popitem(last=False)
    _sets.move_to_end(key)
    return found


def adam_update_group(ps: Sequence[np.ndarray], gs: Sequence[np.ndarray],
                      ms: Sequence[np.ndarray], vs: Sequence[np.ndarray], decays: np.ndarray,
                      l2s: np.ndarray, w1, beta2, w2, bc2_sqrt, eps, neg_step) -> None:
    """Every parameter of one dtype in one parallel call; see
    ``functional.adam.adam_update_group``. Arrays that are not all C-contiguous go to the
    reference."""
    if not all(isinstance(x, np.ndarray) and x.flags.c_contiguous
               for group in (ps, gs, ms, vs) for x in group):
        _check_arrays(ps, gs, ms, vs)
        reference.adam_update_group(ps, gs, ms, vs, decays, l2s, w1, beta2, w2, bc2_sqrt, eps,
                                    neg_step)
        return
    _parameter_set(ps, gs, ms, vs).update(decays, l2s, w1, beta2, w2, bc2_sqrt, eps, neg_step)


def adam_update(p, g, m, v, decay, l2, w1, beta2, w2, bc2_sqrt, eps, neg_step) -> None:
    """One parameter's update; see ``functional.adam.adam_update``."""
    dtype = check_kernel_float("p", p).dtype
    check_scalar("decay", decay)
    check_scalar("l2", l2)
    adam_update_group([p], [g], [m], [v], np.array([decay], dtype), np.array([l2], dtype), w1,
                      beta2, w2, bc2_sqrt, eps, neg_step)

"""Adam's update in Numba: all the parameters of a model in one parallel call per dtype.

Same names, signatures and numbers as ``functional/adam.py`` (the readable reference, read it
first): its equations run here entry by entry, in the parameters' dtype and without fastmath,
on the same scalars (computed in Python floats, rounded once to the dtype), so the two agree
bit for bit (``tests/test_optim.py``):

* :func:`adam_update_group`: every parameter of a model, one call of the compiled loop per
  dtype. The wrapper folds the hyperparameters into the scalars the loop takes (``1 - β1``,
  ``√(1 - β2^t)``, ``-α / (1 - β1^t)``, per parameter ``1 - αλ`` or ``λ``). It keeps the
  :class:`ParameterSet` of the last few models it saw, so a training loop that hands it the
  same arrays every step builds them once.
* :func:`adam_update`: the same for one parameter.
* :class:`ParameterSet`: the addresses of same-dtype parameters, gradients and moments, and a
  table of blocks that shares their entries out over the threads; ``update(...)`` applies
  one step to all of them, from the folded scalars.

Why one call for all: the chapter's model has 37 parameter arrays, most of them small. One
parallel call per array spent several times the update's arithmetic in start-up and
dispatch; one call over a table of blocks costs little more than the arithmetic
(``benchmarks/README.md``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numba
import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from .._checks import check_number, check_scalar
from ..functional import adam as reference
from ._jit import jit_options
from ._validate import check_kernel_float

# The operations this module gives the numba backend (numpy_transformer.backend)
__all__ = ['adam_update', 'adam_update_group']

_BLOCK = 8192  # entries per work item: large enough to amortise, small enough to balance
_KEPT = 4  # models whose ParameterSets adam_update_group remembers


@intrinsic
def _pointer_to(typingctx, address, like):
    # the integer address as a pointer to numbers of like's dtype (like: an array)
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

    return types.CPointer(like.dtype)(address, like), codegen


@njit(parallel=True, **jit_options())
def _adam_kernel(addresses, sizes, decay, l2, block_array, block_start, block_stop, w1, beta2,
                 w2, bc2_sqrt, eps, neg_step):  # pragma: no cover - compiled
    # addresses: (4, arrays) int64, the data of the k-th p, g, m, v in column k, each
    # C-contiguous with sizes[k] entries of decay's dtype; decay, l2: (arrays,); block b
    # covers entries block_start[b]:block_stop[b] of array block_array[b]. The scalars arrive
    # in the arrays' dtype, so float32 computes in float32 as the reference. No fastmath:
    # LLVM neither fuses a*b+c into an FMA nor reorders, so each line rounds at the same
    # points as the reference. The reference's equation numbers:
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
                gi = gi + wd * p[i]  # (1)
            mi = m[i] + w1 * (gi - m[i])  # (3)
            vi = v[i] * beta2 + w2 * gi * gi  # (4)
            denom = np.sqrt(vi) / bc2_sqrt + eps  # (6)
            m[i] = mi
            v[i] = vi
            p[i] = p[i] * dec + neg_step * (mi / denom)  # (2), (5), (7)


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
        dtypes = sorted({str(p.dtype) for p in ps})
        if len(dtypes) != 1:
            raise ValueError(f"ps must all have one dtype, got {dtypes}")
        for group_name, group in zip("pgmv", arrays, strict=True):
            for k, x in enumerate(group):  # (one Numba type for all: writeable, C order)
                if not (x.flags.c_contiguous and x.flags.writeable):
                    raise ValueError(f"{group_name}s[{k}] must be C-contiguous and writeable")
        self.dtype = ps[0].dtype
        # the kernel reaches the arrays by address (a typed List of them would compile
        # Numba's list code, which is not cached, in every new process); these
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
        are of the arrays' dtype; :func:`_folded` says what each is.
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
    """The reference's checks (``functional.adam.check_adam_arrays``), and each parameter
    float32 or float64, the dtypes the loop is compiled for."""
    reference.check_adam_arrays(ps, gs, ms, vs)
    for k, p in enumerate(ps):
        check_kernel_float(f"ps[{k}]" if len(ps) > 1 else "p", p)


_kept: OrderedDict = OrderedDict()  # identity of the arrays -> their _dtype_groups


def _dtype_groups(ps, gs, ms, vs) -> list[tuple[list[int], ParameterSet | None, tuple]]:
    """``(indices, set, arrays)`` per dtype of the parameters: their indices in ps, the
    ParameterSet of their arrays (None if they are not all C-contiguous and writeable: they
    go to the reference) and the four lists of those arrays. Built, after checking every
    array, once while the arrays stay the same objects (kept alive here, so their identities
    cannot be reused meanwhile)."""
    key = tuple(tuple(map(id, group)) for group in (ps, gs, ms, vs))
    found = _kept.get(key)
    if found is None:
        _check_arrays(ps, gs, ms, vs)
        by_dtype: dict[np.dtype, list[int]] = {}
        for k, p in enumerate(ps):
            by_dtype.setdefault(p.dtype, []).append(k)
        found = []
        for ks in by_dtype.values():
            arrays = tuple([group[k] for k in ks] for group in (ps, gs, ms, vs))
            fast = all(x.flags.c_contiguous and x.flags.writeable for group in arrays
                       for x in group)
            found.append((ks, ParameterSet(*arrays) if fast else None, arrays))
        _kept[key] = found
        if len(_kept) > _KEPT:
            _kept.popitem(last=False)
    _kept.move_to_end(key)
    return found


def _folded(dtype: np.dtype, lr: float, beta1: float, beta2: float, eps: float,
            weight_decays: np.ndarray, t: int, decoupled: bool) -> tuple:
    """The arguments of :meth:`ParameterSet.update` for parameters of one dtype: per
    parameter ``decay = 1 - αλ`` (AdamW; Adam: 1) and ``l2 = λ`` (Adam; AdamW: 0), then
    ``1 - β1, β2, 1 - β2, √(1 - β2^t), ε, -α / (1 - β1^t)``; each computed in float64, as
    the reference's scalars, then rounded once to ``dtype``."""
    f = dtype.type
    decay = 1.0 - lr * weight_decays if decoupled else np.ones_like(weight_decays)
    l2 = np.zeros_like(weight_decays) if decoupled else weight_decays
    return (decay.astype(dtype), l2.astype(dtype), f(1.0 - beta1), f(beta2), f(1.0 - beta2),
            f((1.0 - beta2 ** t) ** 0.5), f(eps), f(-(lr / (1.0 - beta1 ** t))))


def adam_update_group(ps: Sequence[np.ndarray], gs: Sequence[np.ndarray],
                      ms: Sequence[np.ndarray], vs: Sequence[np.ndarray], *, lr: float,
                      beta1: float, beta2: float, eps: float, weight_decays: Sequence[float],
                      t: int, decoupled: bool) -> None:
    """Every parameter, one parallel call per dtype; see
    ``functional.adam.adam_update_group`` (same arguments, same numbers). A dtype whose arrays
    are not all C-contiguous and writeable goes to the reference."""
    groups = _dtype_groups(ps, gs, ms, vs)  # everything checked before the first update
    lr, beta1, beta2, eps, t = reference.check_adam_hyperparameters(lr, beta1, beta2, eps,
                                                                    t, decoupled)
    weight_decays = reference.check_weight_decays(weight_decays, len(ps))
    for ks, parameter_set, arrays in groups:
        wds = [weight_decays[k] for k in ks]
        if parameter_set is None:
            reference.adam_update_group(*arrays, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                                        weight_decays=wds, t=t, decoupled=decoupled)
        else:
            parameter_set.update(*_folded(parameter_set.dtype, lr, beta1, beta2, eps,
                                          np.array(wds), t, decoupled))


def adam_update(p: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, *, lr: float,
                beta1: float, beta2: float, eps: float, weight_decay: float, t: int,
                decoupled: bool) -> None:
    """One parameter's update; see ``functional.adam.adam_update`` (same arguments, same
    numbers)."""
    check_number("weight_decay", weight_decay, 0.0)
    adam_update_group([p], [g], [m], [v], lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                      weight_decays=[weight_decay], t=t, decoupled=decoupled)

"""Comparing our forward and backward with a PyTorch twin, tensor by tensor, by name.

The relative error of a tensor is ``max |ours - torch| / max(max |ours|, max |torch|)``, the
measure of ``numpy_transformer.gradcheck``: the worst entry error against the tensor's own
scale. A gradient that is zero in theory (an attention key bias without RoPE: softmax ignores
a shift shared by a whole row) is pure rounding noise on both sides; it is measured against
the scale of the module's other gradients instead of its own.

In float32 a parameter's gradient also passes when its absolute error is within
:data:`FLOW_UNITS` units of float32 roundoff at the scale of its module's gradients (the
largest of them). Rounding in a backward pass is an absolute error at the size of the gradient
flowing through the module: a tensor that cancels down to a small fraction of its module's
others carries the rounding of that flow, not of its own size. Under a nearly saturated softmax
the query and key projections' gradients were 1/200 of the value and output projections' in
one of the models below; ours and PyTorch's float32 each differed from the float64 truth by
1.3e-5 and 1.6e-6 of that small size (0.07 and 0.008 roundoff units at the module's scale),
and which of the two lands further off depends on the BLAS kernel (OpenBLAS's Haswell kernels
put ours past 1e-5 relative, its SkylakeX kernels did not). Over 3,536 float32 gradient
tensors (every family and variant below, four seeds each) the two implementations were equally
accurate against the float64 truth (median error ratio 0.9) and never differed by more than
1.1 units of roundoff at their module's scale where the 1e-5 relative bar did not already hold.

Every comparison is recorded in :data:`WORST` by (family, dtype); ``conftest.py`` prints the
table at the end of a run.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from numpy_transformer.gradcheck import zero_gradient_names

TOL = {np.dtype(np.float64): 1e-10, np.dtype(np.float32): 1e-5}
FLOW_UNITS = 32  # float32: the absolute floor, in units of eps(float32) x the module's scale
WORST: dict[tuple[str, str], tuple[float, str]] = defaultdict(lambda: (0.0, ""))


def rel_err(ours, ref, scale: float | None = None) -> float:
    """``max |ours - ref| / scale``, the scale defaulting to the larger of the two max-abs."""
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if ours.shape != ref.shape:
        raise AssertionError(f"shape {ours.shape} differs from PyTorch's {ref.shape}")
    if scale is None:
        scale = max(np.abs(ours).max(initial=0.0), np.abs(ref).max(initial=0.0))
    return 0.0 if scale == 0 else float(np.abs(ours - ref).max(initial=0.0) / scale)


def assert_close(family: str, name: str, ours, ref, dtype, tol: float | None = None,
                 scale: float | None = None, atol: float = 0.0) -> float:
    """Assert ``rel_err(ours, ref) <= tol`` (default by dtype), or an absolute error of at
    most ``atol``, naming the tensor; record the relative error."""
    dtype = np.dtype(dtype)
    tol = TOL[dtype] if tol is None else tol
    err = rel_err(ours, ref, scale)
    key = (family, dtype.name)
    if err > WORST[key][0]:
        WORST[key] = (err, name)
    if err > tol and atol > 0:
        err_abs = float(np.abs(np.asarray(ours, np.float64) - np.asarray(ref, np.float64)).max())
        assert err_abs <= atol, (f"[{family} {dtype.name}] {name}: relative error {err:.3e} "
                                 f"exceeds {tol:.0e} and absolute error {err_abs:.3e} exceeds "
                                 f"{atol:.3e} (shape {np.shape(ours)})")
        return err
    assert err <= tol, (f"[{family} {dtype.name}] {name}: relative error {err:.3e} exceeds "
                        f"{tol:.0e} (shape {np.shape(ours)})")
    return err


def flow_floors(pairs, dtype) -> dict[str, float]:
    """The absolute float32 floor of each parameter gradient: :data:`FLOW_UNITS` eps times the
    largest gradient (PyTorch's) of the module that owns the parameter; 0 in float64."""
    if np.dtype(dtype) != np.float32:
        return {}
    scale: dict[str, float] = defaultdict(float)
    for name, _, theirs in pairs:
        owner = name.rsplit(".", 1)[0] if "." in name else ""
        scale[owner] = max(scale[owner], float(np.abs(theirs).max(initial=0.0)))
    eps = float(np.finfo(np.float32).eps)
    return {name: FLOW_UNITS * eps * scale[name.rsplit(".", 1)[0] if "." in name else ""]
            for name, _, _ in pairs}


def _torch_arg(a, twins, grad: bool):
    if isinstance(a, np.ndarray):
        return twins.tensor_of(a, requires_grad=grad and a.dtype.kind == "f")
    return a


def check_module(family: str, module, args: tuple, kwargs: dict | None = None, *,
                 seed: int = 0, tol: float | None = None, grad_args: tuple[str, ...] = ()):
    """Forward ours and the twin on the same inputs, backward a random upstream gradient G,
    and compare the output, the gradient of every float input and of every parameter.

    Parameters
    ----------
    family : str
        Label for the failure message and the summary table.
    module : Module
        Ours; its twin is built by ``twins.to_torch`` (weights copied).
    args : tuple
        Positional inputs (NumPy arrays or None). Float arrays get gradients, compared with
        what ``module.backward`` returns (an array, a tuple in argument order, or None).
    kwargs : dict, optional
        Keyword inputs (masks, lengths), given to both sides; never differentiated.
    grad_args : tuple of str
        Names of the float positional inputs, for the messages.
    """
    from numpy_transformer import torch_twins as twins

    kwargs = kwargs or {}
    twin = twins.to_torch(module)
    dtype = twins.dtype_of(module)
    out = module(*args, **kwargs)
    g = np.random.default_rng(seed).standard_normal(out.shape).astype(out.dtype)
    module.zero_grad()
    dins = module.backward(g)
    dins = () if dins is None else (dins,) if isinstance(dins, np.ndarray) else tuple(dins)

    targs = [_torch_arg(a, twins, grad=True) for a in args]
    tkwargs = {k: _torch_arg(v, twins, grad=False) for k, v in kwargs.items()}
    tout = twin(*targs, **tkwargs)
    (tout * twins.tensor_of(g)).sum().backward()

    float_targs = [t for t in targs if hasattr(t, "requires_grad") and t.requires_grad]
    assert len(dins) == len(float_targs), "backward returned a different number of gradients"
    names = grad_args or tuple(f"input {i}" for i in range(len(dins)))
    pairs = list(twins.gradient_pairs(module, twin))
    floor = _float32_floor(module, twin, args, kwargs, g, pairs) if dtype == np.float32 else {}
    bar = TOL[dtype] if tol is None else tol

    def tol_of(name: str) -> float:
        return max(bar, 2.0 * floor.get(name, 0.0))

    assert_close(family, "output", out, tout.detach().numpy(), dtype, tol_of("output"))
    for name, d, t in zip(names, dins, float_targs, strict=True):
        assert_close(family, "d" + name, d, t.grad.numpy(), dtype, tol)
    zero = zero_gradient_names(module)
    scale = max((np.abs(tg).max(initial=0.0) for _, _, tg in pairs), default=0.0)
    atol = flow_floors(pairs, dtype)
    for name, ours, theirs in pairs:
        assert_close(family, "d" + name, ours, theirs, dtype, tol_of(name),
                     scale=scale if name in zero else None, atol=atol.get(name, 0.0))
    return out, tout


def _float32_floor(module, twin, args, kwargs, g, pairs) -> dict[str, float]:
    """PyTorch's own float32 error, per tensor, against the same twin run in float64.

    Two float32 implementations cannot be expected to agree more closely than each agrees
    with the exact result. Where PyTorch's float32 gradient is itself further than 1e-5 from
    its float64 value (a gradient that sums many cancelling terms), the bar for ours becomes
    twice that distance; everywhere else it stays 1e-5.
    """
    import copy

    import torch

    twin64 = copy.deepcopy(twin).double()
    for p in twin64.parameters():
        p.grad = None

    def to64(a, grad):
        if isinstance(a, np.ndarray) and a.dtype.kind == "f":
            return torch.tensor(a.astype(np.float64), requires_grad=grad)
        return torch.as_tensor(a) if isinstance(a, np.ndarray) else a

    out64 = twin64(*[to64(a, True) for a in args],
                   **{k: to64(v, False) for k, v in kwargs.items()})
    (out64 * torch.tensor(g.astype(np.float64))).sum().backward()
    from numpy_transformer import interop

    params64 = dict(twin64.named_parameters())
    floor = {"output": rel_err(twin(*[_torch_arg(a, _twins(), False) for a in args],
                                    **{k: _torch_arg(v, _twins(), False)
                                       for k, v in kwargs.items()}).detach().numpy(),
                               out64.detach().numpy())}
    names = interop.torch_names(module)
    for name, _, theirs in pairs:
        torch_name, transpose = names[name]
        grad64 = params64[torch_name].grad
        if grad64 is not None:
            grad64 = grad64.numpy()
            floor[name] = rel_err(theirs, grad64.T if transpose else grad64)
    return floor


def _twins():
    from numpy_transformer import torch_twins as twins

    return twins

"""The one seam between the readable references and the fast kernels.

:func:`get_backend` turns a backend's name (``numpy_transformer.config.BACKENDS``) into a
:class:`Backend`: a namespace holding every operation under its functional name,
``ops.layer_norm_forward``, ``ops.sdpa_backward``, ``ops.adam_update_group``, ... Every module
takes it once, when it is built (a model from its config), and calls the operations through
it; nothing else in the library chooses an implementation.

* ``"numpy"``: every operation is the readable reference of ``numpy_transformer/functional``
  (every name of its files' ``__all__``), the compositions the kernels fuse included
  (``feed_forward_forward``, ``embeddings_forward``). Nothing here imports Numba.
* ``"numba"``: the same namespace, with the operations that ``numpy_transformer/kernels``
  implements (the ``__all__`` of each module of ``config.KERNEL_MODULES``) in place of their
  references. A kernel has its reference's name and signature and returns what it returns;
  the tests hold every kernel to that, and to its reference's numbers.

The environment variable ``NUMPY_TRANSFORMER_KERNELS`` limits the ``"numba"`` backend to the
kernels it names, comma-separated: a kernel module takes all its operations (``attention``),
a module and one of its operations takes that one alone (``lstm.lstm_backward``); the other
operations keep their references. It must be set before the first model is built. It narrows
a disagreement between the two backends down to one kernel.

Building the ``"numba"`` backend runs its one hook into the process, :func:`start_numba`, before
any kernel runs: the kernels' thread settings. The kernels themselves were compiled when the
package was installed (``numpy_transformer/compile_kernels.py``), or compile on their first
call; nothing at run time decides which.

Examples
--------
>>> ops = get_backend("numpy")
>>> ops.layer_norm_forward.__module__
'numpy_transformer.functional.norms'
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable
from types import ModuleType, SimpleNamespace

from . import functional
from ._checks import check_choice
from .config import BACKENDS, DEFAULT_BACKEND, KERNEL_MODULES, KERNELS_VARIABLE

# The kernels that cannot run beside their partner's reference, each with that partner and
# why: a kernel forward whose cache only its kernel backward reads, a kernel backward that
# reads what only its kernel forward keeps (tests/test_environment.py finds them all).
NEEDS_ITS_PARTNER = {
    "attention.sdpa_forward": ("attention.sdpa_backward",
                               "its cache (with the softmax's log-sum-exp) is the kernel's own"),
    "attention.sdpa_backward": ("attention.sdpa_forward",
                                "it reads the softmax's log-sum-exp, which only the kernel "
                                "forward keeps"),
    "linear.linear_heads_forward": ("linear.linear_heads_backward",
                                    "its cache (the weights side by side) is the kernel's own"),
    "feedforward.feed_forward_forward": ("feedforward.feed_forward_backward",
                                         "its cache leaves out the activation's output, which "
                                         "only the kernel backward makes again"),
    "head_loss.linear_cross_entropy_forward": ("head_loss.linear_cross_entropy_backward",
                                               "its cache (the gradients themselves) is the "
                                               "kernel's own"),
}


class Backend(SimpleNamespace):
    """The operations of one backend, as attributes named like their functional references.

    Attributes
    ----------
    name : str
        ``"numpy"`` or ``"numba"``.
    """

    name: str

    def activation(self, name: str) -> tuple[Callable, Callable]:
        """``(forward, backward)`` of the elementwise activation ``name`` (for example
        ``"gelu"`` -> ``gelu_forward``, ``gelu_backward``)."""
        return getattr(self, f"{name}_forward"), getattr(self, f"{name}_backward")

    def __repr__(self) -> str:
        return f"Backend({self.name!r})"


def kernel_selection() -> tuple[str, ...]:
    """The kernels the ``"numba"`` backend takes: every module of ``KERNEL_MODULES``, or the
    modules and operations (``module.operation``) named by ``NUMPY_TRANSFORMER_KERNELS``.

    Raises
    ------
    ValueError
        If the variable names a module that is not one of ``KERNEL_MODULES``, an operation
        that its module does not have, or a kernel of ``NEEDS_ITS_PARTNER`` without its
        partner.
    """
    value = os.environ.get(KERNELS_VARIABLE)
    if value is None:
        return KERNEL_MODULES
    return _checked(tuple(name.strip() for name in value.split(",") if name.strip()))


def _checked(names: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` if each is a kernel module or ``module.operation`` with its partner (see
    :func:`kernel_selection`), else ``ValueError``."""
    for name in names:
        module_name, dot, operation = name.partition(".")
        if module_name not in KERNEL_MODULES or "." in operation or (dot and not operation):
            raise ValueError(f"{KERNELS_VARIABLE} names {name!r}, not a kernel module or "
                             f"module.operation; the modules: {', '.join(KERNEL_MODULES)}")
        ops = importlib.import_module(f"{__package__}.kernels.{module_name}").__all__
        if operation and operation not in ops:
            raise ValueError(f"{KERNELS_VARIABLE} names {name!r}: kernels/{module_name}.py has "
                             f"no operation {operation!r}; it has {', '.join(ops)}")
        partner, why = NEEDS_ITS_PARTNER.get(name, (None, None))
        if partner is not None and not {partner, module_name} & set(names):
            raise ValueError(f"{KERNELS_VARIABLE} names {name!r} without {partner!r}: {why}; "
                             f"name {partner!r} too, or the module {module_name!r}")
    return names


def _kernels(names: tuple[str, ...]) -> dict[str, Callable]:
    """The kernels of the modules ``names``: a module's ``__all__``, or for an entry
    ``module.operation`` that one operation."""
    ops = {}
    for name in names:
        module_name, _, operation = name.partition(".")
        module: ModuleType = importlib.import_module(f"{__package__}.kernels.{module_name}")
        ops.update((op, getattr(module, op)) for op in ((operation,) if operation
                                                        else module.__all__))
    return ops


@functools.cache
def _build(name: str) -> Backend:
    """The backend ``name``; for ``"numba"``, with the kernels of :func:`kernel_selection`."""
    ops = {op: getattr(functional, op) for op in functional.__all__}
    if name == "numba":  # imported only now: Numba loads with the first kernel module
        start_numba()
        ops.update(_kernels(kernel_selection()))
    return Backend(name=name, **ops)


def start_numba() -> None:
    """The numba backend's one hook into the process, run when the backend is first built,
    before any kernel runs: Numba's threads wait for work asleep, and there are as many as
    the cores this process may use (:func:`numpy_transformer.threads.use_cores`)."""
    from .threads import use_cores

    use_cores()


def get_backend(backend: str | Backend = DEFAULT_BACKEND) -> Backend:
    """The :class:`Backend` called ``backend`` (a :class:`Backend` is returned as it is).

    Raises
    ------
    ValueError
        If ``backend`` names no backend of ``numpy_transformer.config.BACKENDS``.
    """
    if isinstance(backend, Backend):
        return backend
    name = check_choice("backend", backend, BACKENDS)
    return _build(name)

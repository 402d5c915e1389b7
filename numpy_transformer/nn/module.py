"""The ``Module`` base class: parameters, their gradients, child modules, one cache.

The contract every module in ``numpy_transformer.nn`` follows:

* ``params`` and ``grads`` are dicts with identical keys; ``grads[name]`` has the shape and
  dtype of ``params[name]`` and starts at zero.
* ``forward(...)`` computes the output and keeps exactly one cache (a second forward
  overwrites it), so a backward always belongs to the latest forward.
* ``backward(dout)`` *adds* into ``grads`` (``+=``, through :meth:`Module.add_grad`) and
  returns the gradient of the input(s). Zeroing is a separate, explicit step
  (:meth:`Module.zero_grad`). Accumulation is what lets one table receive gradient from two
  places (tied embeddings) and what makes gradient accumulation over micro-batches a loop of
  backwards. Inside ``with model.replacing_grads():`` (a training step's) the first value
  added to a gradient replaces it instead: the numbers of ``zero_grad()`` then the backward,
  without a pass that writes zeros over every gradient, nor one that reads them back.
* Children are registered by name, in order, so every parameter has a dotted name such as
  ``blocks.0.attn.wq``.
* A model's ``loss_and_backward`` runs its forward and its backward in one call, inside
  ``with self.ops.forward_and_backward(self):`` (``numpy_transformer/backend.py``): the numba
  backend's caches may keep the weights uncopied for the block, and when it ends
  :meth:`Module.let_go` takes them out again and marks every forward spent (a backward of
  that forward afterwards raises ``ValueError``).
* A forward keeps its cache in training mode, and not in evaluation mode
  (:attr:`Module.keeps_cache`): evaluation is inference (generation, a held-out loss), which
  keeps nothing and copies no weight, and a backward after it raises ``ValueError``. Inside
  ``with model.no_grad():`` no forward keeps one; inside ``with model.enable_grad():`` every
  forward does, evaluation mode included: the gradient of the model without dropout.
* ``backward`` before any ``forward``, or with a gradient not shaped like the last forward's
  output (or not of its dtype), raises ``ValueError``. Every module says so in its own code:
  its ``forward`` returns ``self.expect_grad_like(out)``, which records the output's shape and
  dtype in ``grad_like``, and its ``backward`` starts with ``self.check_grad(name, dout)``.
  Nothing is added to a subclass's methods behind the reader's back.

``buffers`` holds fixed arrays that move with the module (``astype``) but are neither trained
nor saved: the sinusoidal table and the RoPE angles follow from a formula, as the chapter's
non-persistent position buffer does.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator

import numpy as np

# grad_like of a module whose last forward's backward already ran inside loss_and_backward
_SPENT = "spent"
# grad_like of a module whose last forward kept nothing (eval mode, or inside no_grad())
_INFERENCE = "inference"


def _without(value: object, ids: set[int]) -> object:
    """``value`` with every array whose id is in ``ids``, at any depth of its tuples and
    dataclasses, replaced by None; the same object where it holds none of them."""
    if isinstance(value, np.ndarray):
        return None if id(value) in ids else value
    if isinstance(value, tuple):
        items = [_without(item, ids) for item in value]
        if all(new is old for new, old in zip(items, value, strict=True)):
            return value
        return type(value)._make(items) if hasattr(value, "_fields") else tuple(items)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changed = {f.name: _without(getattr(value, f.name), ids)
                   for f in dataclasses.fields(value)}
        changed = {name: new for name, new in changed.items()
                   if new is not getattr(value, name)}
        return dataclasses.replace(value, **changed) if changed else value
    return value


_DRAWN_BLOCK = 1 << 16  # numbers of one draw of drawn(): its float64 temporary stays small


def drawn(shape: tuple, dtype, draw: Callable[[tuple], np.ndarray]) -> np.ndarray:
    """``draw(shape).astype(dtype)``, the same numbers, drawn a block of rows at a time.

    A generator's stream cut in pieces gives the numbers of one draw, so the values do not
    change; only no float64 array of the whole shape is made (at GPT-2's size a (50304, 768)
    one for the token table, whose freed memory would stay in the heap between the weights).
    """
    out = np.empty(shape, dtype=dtype)
    rows = max(1, _DRAWN_BLOCK // max(1, int(np.prod(shape[1:], dtype=np.int64))))
    for i in range(0, out.shape[0], rows):
        out[i:i + rows] = draw((min(rows, out.shape[0] - i),) + tuple(shape[1:]))
    return out


class Module:
    """Base class: parameter and gradient dicts, ordered children, a train/eval flag."""

    def __init__(self) -> None:
        self.params: dict[str, np.ndarray] = {}
        self.grads: dict[str, np.ndarray] = {}
        self.buffers: dict[str, np.ndarray] = {}
        self.children: dict[str, Module] = {}
        self.training = True
        self.grad_enabled: bool | None = None  # None: as the mode says; no_grad(), enable_grad()
        # (shape, dtype) of the last forward's output: what backward's gradient must be
        # (expect_grad_like). None before any forward; a shape entry "B" matches any length
        # (a module whose rows another module adds, positions.addend)
        self.grad_like: tuple | str | None = None
        # inside replacing_grads(): the gradients no backward has written yet, by id (one dict
        # shared by every module of the block); None outside
        self.unwritten: dict[int, np.ndarray] | None = None

    # ------------------------------------------------------------------ registration
    def add_param(self, name: str, value: np.ndarray) -> np.ndarray:
        """Register a trainable array and its zero gradient; returns the array."""
        self.params[name] = value
        # np.zeros, not zeros_like: its pages are the system's zero pages until a backward
        # writes them, so a model that only infers holds no memory for its gradients
        self.grads[name] = np.zeros(value.shape, dtype=value.dtype)
        return value

    def add(self, name: str, module: Module) -> Module:
        """Register a child module under ``name``; returns it (``self.attn = self.add(...)``)."""
        self.children[name] = module
        return module

    # ------------------------------------------------------------------ forward / backward
    def __call__(self, *args, **kwargs):
        """``module(x)`` is ``module.forward(x)``."""
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not define forward")

    def backward(self, dout):
        raise NotImplementedError(f"{type(self).__name__} does not define backward")

    def expect_grad_like(self, out: np.ndarray) -> np.ndarray:
        """``out``, the forward's output, after noting what its backward takes: a gradient of
        ``out``'s shape and dtype, or none at all when the forward kept nothing (evaluation
        mode, ``no_grad()``). Every forward returns through it; :meth:`check_grad` reads it.
        """
        self.grad_like = (out.shape, out.dtype) if self.keeps_cache else _INFERENCE
        return out

    def check_grad(self, name: str, dout: object) -> None:
        """Raise ``ValueError`` unless a forward ran and ``dout`` is shaped like its output
        (as :meth:`expect_grad_like` noted it).

        Every ``backward`` calls it first; ``name`` is its argument (``dout``, ``dlogits``,
        ...).
        """
        what = type(self).__name__
        if self.grad_like is None:
            raise ValueError(f"{what}.backward needs a forward first")
        if self.grad_like is _SPENT:
            raise ValueError(f"{what}.backward: the backward of its last forward already ran "
                             "in loss_and_backward; run a forward first")
        if self.grad_like is _INFERENCE:
            raise ValueError(f"{what}.backward: its last forward ran in evaluation mode or "
                             f"inside no_grad() and kept nothing for a backward; run it in "
                             f"training mode, or inside enable_grad()")
        shape, dtype = self.grad_like
        if not (isinstance(dout, np.ndarray) and dout.ndim == len(shape) and all(
                want in ("B", got) for want, got in zip(shape, dout.shape, strict=True))):
            raise ValueError(f"{name} must have shape ({', '.join(map(str, shape))}) like the "
                             f"output of {what}'s last forward, got "
                             f"{getattr(dout, 'shape', type(dout).__name__)}")
        if dout.dtype != dtype:
            raise ValueError(f"{name} must be {dtype} like the output of {what}'s last "
                             f"forward, got {dout.dtype}")

    def let_go(self, ids: set[int]) -> None:
        """End a forward-and-backward call (``Backend.forward_and_backward``): in this module
        and every descendant, replace the arrays of these ``ids`` (the weights a backend's
        caches kept uncopied) by None wherever a cache holds them, and mark the last forward
        spent, its backward having run. The activations stay for a reader to look at."""
        for _, module in self.named_modules():
            for name in ("cache", "loss_cache"):
                if getattr(module, name, None) is not None:
                    setattr(module, name, _without(getattr(module, name), ids))
            if module.grad_like is not None:
                module.grad_like = _SPENT

    # ------------------------------------------------------------------ parameters
    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
        """Yield ``(dotted name, param, grad)`` for this module's parameters, then each child's.

        A parameter shared by two modules (a tied embedding) is registered in one of them only,
        so it appears here once.
        """
        for name, param in self.params.items():
            yield prefix + name, param, self.grads[name]
        for child_name, child in self.children.items():
            yield from child.named_parameters(prefix + child_name + ".")

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """Yield ``(dotted name, module)`` for this module (name ``""``) and every descendant."""
        yield prefix.rstrip("."), self
        for child_name, child in self.children.items():
            yield from child.named_modules(prefix + child_name + ".")

    def submodule(self, name: str) -> Module:
        """The descendant called ``name`` (e.g. ``"decoder.blocks.0.attn"``).

        After a training step its ``cache`` holds the activations of the last forward and its
        ``grads`` the gradients of the last backward: the named access a reader needs to look
        inside a step.

        Raises
        ------
        ValueError
            If there is no such module; the message lists the children at the failing level.
        """
        module = self
        for part in name.split(".") if name else []:
            if part not in module.children:
                raise ValueError(f"no module {name!r}: {part!r} is not one of "
                                 f"{list(module.children)}")
            module = module.children[part]
        return module

    def parameters(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield ``(param, grad)`` pairs in the order of :meth:`named_parameters`.

        Pairs rather than bare arrays: in this library a parameter always travels with its
        gradient, and an optimizer needs both.
        """
        for _, param, grad in self.named_parameters():
            yield param, grad

    def num_parameters(self) -> int:
        """Number of trainable scalars."""
        return sum(param.size for param, _ in self.parameters())

    def zero_grad(self) -> None:
        """Set every gradient to zero, in place (the arrays stay the same objects)."""
        for _, grad in self.parameters():
            grad[...] = 0

    def add_grad(self, name: str, value: np.ndarray, index: object = ...) -> None:
        """``grads[name][index] += value``: how every backward hands over a parameter's
        gradient. Inside :meth:`replacing_grads`, the first value a gradient receives replaces
        what it held (the rest of it, outside ``index``, becomes zero)."""
        grad = self.grads[name]
        if self.unwritten is not None and self.unwritten.pop(id(grad), None) is not None:
            if index is ...:
                np.copyto(grad, value)  # 0 + value, without writing the 0 and reading it back
                return
            grad[...] = 0
        grad[index] += value

    @contextlib.contextmanager
    def replacing_grads(self) -> Iterator[Module]:
        """A block in which backwards replace this module's gradients instead of adding to
        them: the first value :meth:`add_grad` gives a gradient replaces it, later ones add.

        The gradients then end as ``zero_grad()`` before the block would leave them, bit for
        bit, without its pass that writes zeros over every gradient, nor the first ``+=``'s
        reading them back (PyTorch's ``zero_grad(set_to_none=True)`` spares the same
        passes). A gradient that no backward wrote in the block is zeroed when it ends.
        ``Trainer`` runs each step's backward in one.
        """
        unwritten = {id(grad): grad for _, grad in self.parameters()}
        modules = [module for _, module in self.named_modules()]
        for module in modules:
            module.unwritten = unwritten
        try:
            yield self
        finally:
            for module in modules:
                module.unwritten = None
            for grad in unwritten.values():
                grad[...] = 0

    # ------------------------------------------------------------------ saving and loading
    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of every parameter by dotted name (buffers are not saved: they are formulas)."""
        return {name: param.copy() for name, param, _ in self.named_parameters()}

    def load_state_dict(self, state: dict[str, np.ndarray], strict: bool = True) -> None:
        """Copy ``state`` into the parameters, in place, casting to each parameter's dtype.

        Raises
        ------
        ValueError
            If a shape differs, or (when ``strict``) a key is missing or unexpected. Nothing
            is copied unless every check passes.
        """
        own = {name: param for name, param, _ in self.named_parameters()}
        missing = [name for name in own if name not in state]
        unexpected = [name for name in state if name not in own]
        if strict and (missing or unexpected):
            raise ValueError(f"state dict does not match the module: missing keys {missing}, "
                             f"unexpected keys {unexpected}")
        misshapen = [f"{name}: expected {own[name].shape}, got {np.shape(state[name])}"
                     for name in own if name in state and np.shape(state[name]) != own[name].shape]
        if misshapen:
            raise ValueError(f"state dict has misshapen entries: {'; '.join(misshapen)}")
        for name, param in own.items():
            if name in state:
                param[...] = state[name]

    # ------------------------------------------------------------------ modes and dtype
    @property
    def keeps_cache(self) -> bool:
        """Whether a forward now keeps what its backward needs: in training mode, or inside
        :meth:`enable_grad`, and never inside :meth:`no_grad`. Every module's forward passes
        it on as its operations' ``keep``."""
        return self.training if self.grad_enabled is None else self.grad_enabled

    def no_grad(self) -> contextlib.AbstractContextManager[Module]:
        """Within the block, no forward of this module or its children keeps a cache or
        copies a weight, in either mode (as ``torch.no_grad()``, for this model only and
        visible in the code that uses it); dropout still follows the mode.

        Examples
        --------
        >>> with model.no_grad():  # doctest: +SKIP
        ...     logits = model(tokens)
        """
        return self._grad(False)

    def enable_grad(self) -> contextlib.AbstractContextManager[Module]:
        """Within the block, every forward keeps what its backward needs, evaluation mode
        included: ``model.eval()`` and ``with model.enable_grad():`` is the gradient of the
        model without dropout (a finite-difference check, a comparison with PyTorch).

        Examples
        --------
        >>> with model.eval().enable_grad():  # doctest: +SKIP
        ...     model.backward(dlogits_of(model(tokens)))
        """
        return self._grad(True)

    @contextlib.contextmanager
    def _grad(self, enabled: bool) -> Iterator[Module]:
        modules = [module for _, module in self.named_modules()]
        before = [module.grad_enabled for module in modules]
        for module in modules:
            module.grad_enabled = enabled
        try:
            yield self
        finally:
            for module, previous in zip(modules, before, strict=True):
                module.grad_enabled = previous

    def train(self, mode: bool = True) -> Module:
        """Set training mode here and in every child (dropout is active only in training)."""
        self.training = mode
        for child in self.children.values():
            child.train(mode)
        return self

    def eval(self) -> Module:
        """Evaluation mode: ``train(False)``."""
        return self.train(False)

    def astype(self, dtype) -> Module:
        """Convert parameters, gradients and buffers (here and in children) to ``dtype``.

        The arrays are replaced by new ones: an optimizer holding the old arrays must be
        rebuilt afterwards.
        """
        dtype = np.dtype(dtype)
        for store in (self.params, self.grads, self.buffers):
            for name, value in store.items():
                store[name] = value.astype(dtype)
        for child in self.children.values():
            child.astype(dtype)
        return self


class ModuleList(Module):
    """An ordered list of modules named ``"0"``, ``"1"``, ...; iterate it, index it."""

    def __init__(self, modules: list[Module]) -> None:
        super().__init__()
        for i, module in enumerate(modules):
            self.add(str(i), module)

    def __iter__(self) -> Iterator[Module]:
        return iter(self.children.values())

    def __len__(self) -> int:
        return len(self.children)

    def __getitem__(self, i: int) -> Module:
        return list(self.children.values())[i]

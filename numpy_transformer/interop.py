"""Weight exchange with PyTorch: our parameters under the names and layouts of ``torch.nn``.

The PyTorch side is the twin of every model in ``numpy_transformer.torch_twins``: a
``torch.nn.Module`` tree whose children carry exactly our child names (``decoder.blocks.0.attn``,
``...ffn.up``, ``head``), built from standard layers (``nn.Linear``, ``nn.Embedding``,
``nn.LayerNorm``, ``nn.RMSNorm``). Only the last part of each name, and the layout of the
linear weights, follow PyTorch's conventions:

===================  =========================  ==============================  =========
our module           our name (shape)           torch name (shape)              layout
===================  =========================  ==============================  =========
Linear               ``w`` (C_in, C_out)        ``weight`` (C_out, C_in)        transpose
Linear               ``b`` (C_out,)             ``bias`` (C_out,)               same
Embedding            ``table`` (V, C)           ``weight`` (V, C)               same
LearnedPositions     ``table`` (max_len, C)     ``weight`` (max_len, C)         same
LayerNorm            ``w``, ``b`` (C,)          ``weight``, ``bias`` (C,)       same
RMSNorm              ``w`` (C,)                 ``weight`` (C,)                 same
MultiHeadAttention   ``wq`` (C, C)              ``q_proj.weight`` (C, C)        transpose
MultiHeadAttention   ``bq`` (C,)                ``q_proj.bias`` (C,)            same
MultiHeadAttention   ``wk``, ``bk``             ``k_proj.weight``, ``.bias``    as q
MultiHeadAttention   ``wv``, ``bv``             ``v_proj.weight``, ``.bias``    as q
MultiHeadAttention   ``wo``, ``bo``             ``out_proj.weight``, ``.bias``  as q
LSTM                 ``w_ih_l0`` (C_in, 4H)     ``weight_ih_l0`` (4H, C_in)     transpose
LSTM                 ``w_hh_l0`` (H, 4H)        ``weight_hh_l0`` (4H, H)        transpose
LSTM                 ``b_ih_l0``, ``b_hh_l0``   ``bias_ih_l0``, ``bias_hh_l0``  same
===================  =========================  ==============================  =========

An LSTM has one such group per layer (``_l0``, ``_l1``, ...), as ``torch.nn.LSTM``; the
gate blocks (i, f, g, o) are in PyTorch's order on both sides, so the transposition is all
that changes.

Queries, keys and values keep three separate ``nn.Linear`` projections (as Hugging Face's
LLaMA port does), not the fused ``in_proj_weight`` of ``nn.MultiheadAttention``:
one of our matrices is then one torch matrix, transposed. (To fill an ``nn.MultiheadAttention``
instead, concatenate: ``in_proj_weight = cat(wq.T, wk.T, wv.T)``, see ``docs/pytorch.md``.)

A tied head (``tie_embeddings``) owns no parameter on either side: the table is exported once,
under the decoder's token embedding. Buffers (sinusoidal table, RoPE angles) are formulas and
are exported by neither side. Without biases (``config.bias=False``) the ``b``/``bias``
entries are simply absent on both sides. Adam's moments have their parameter's shape and move
with the same map (:func:`to_torch_layout`, :func:`from_torch_layout`).

This module does not import torch: it hands out and takes NumPy arrays, and accepts torch
tensors by converting them with ``np.asarray(t.detach().cpu())``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from .nn.attention import MultiHeadAttention
from .nn.layers import Embedding, LayerNorm, Linear, RMSNorm
from .nn.lstm import LSTM
from .nn.module import Module
from .nn.positional import LearnedPositions

__all__ = ["torch_names", "to_torch_layout", "from_torch_layout", "to_torch_state_dict",
           "from_torch_state_dict"]

# (our module type, our parameter name) -> (torch name relative to the module, transpose?)
_LEAVES: dict[type, dict[str, tuple[str, bool]]] = {
    Linear: {"w": ("weight", True), "b": ("bias", False)},
    Embedding: {"table": ("weight", False)},
    LearnedPositions: {"table": ("weight", False)},
    LayerNorm: {"w": ("weight", False), "b": ("bias", False)},
    RMSNorm: {"w": ("weight", False)},
    MultiHeadAttention: {
        "wq": ("q_proj.weight", True), "bq": ("q_proj.bias", False),
        "wk": ("k_proj.weight", True), "bk": ("k_proj.bias", False),
        "wv": ("v_proj.weight", True), "bv": ("v_proj.bias", False),
        "wo": ("out_proj.weight", True), "bo": ("out_proj.bias", False),
    },
}


def _leaves(module: Module) -> dict[str, tuple[str, bool]] | None:
    """The ``_LEAVES`` entry of the module's type; an LSTM's depends on its layer count."""
    if isinstance(module, LSTM):  # w_ih_l0 -> weight_ih_l0 (transposed), b_ih_l0 -> bias_ih_l0
        return {name: (name.replace("w_", "weight_", 1).replace("b_", "bias_", 1),
                       name.startswith("w_")) for name in module.params}
    return _LEAVES.get(type(module))


def _walk(module: Module, prefix: str = "") -> Iterator[tuple[str, Module, str]]:
    """Yield ``(prefix, module, param name)`` in the order of ``named_parameters``."""
    for name in module.params:
        yield prefix, module, name
    for child_name, child in module.children.items():
        yield from _walk(child, prefix + child_name + ".")


def torch_names(model: Module) -> dict[str, tuple[str, bool]]:
    """Map each of our dotted parameter names to ``(torch name, transposed)``.

    Parameters
    ----------
    model : Module
        Any module of ``numpy_transformer.nn`` (a layer, a block or a whole model).

    Returns
    -------
    names : dict of str to (str, bool)
        ``{"decoder.blocks.0.attn.wq": ("decoder.blocks.0.attn.q_proj.weight", True), ...}``
        in the order of ``model.named_parameters()``. ``True`` means the torch array is the
        transpose of ours.

    Raises
    ------
    ValueError
        If a module type with parameters has no PyTorch counterpart in the table above.
    """
    names = {}
    for prefix, module, name in _walk(model):
        leaves = _leaves(module)
        if leaves is None or name not in leaves:
            raise ValueError(f"no PyTorch name for parameter {prefix + name!r} of "
                             f"{type(module).__name__}")
        torch_leaf, transpose = leaves[name]
        names[prefix + name] = (prefix + torch_leaf, transpose)
    return names


def to_torch_layout(model: Module, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Arrays shaped like the model's parameters, renamed and laid out as the twin's.

    Parameters
    ----------
    model : Module
    arrays : dict of str to ndarray
        One array per parameter of ``model`` under our dotted name, in the parameter's shape:
        the parameters themselves, or Adam's moments of them.

    Returns
    -------
    state : dict of str to ndarray
        New C-contiguous arrays under the torch names, linear weights transposed to
        (C_out, C_in).

    Raises
    ------
    ValueError
        If ``arrays`` lacks a parameter of ``model`` (they are another model's).
    """
    missing = sorted(set(torch_names(model)) - set(arrays))
    if missing:
        raise ValueError(f"the arrays are not those of the {type(model).__name__}'s "
                         f"parameters: no {missing[0]!r} among them ({len(missing)} missing)")
    return {torch_name: np.array(arrays[ours].T if transpose else arrays[ours], order="C")
            for ours, (torch_name, transpose) in torch_names(model).items()}  # always copies


def to_torch_state_dict(model: Module) -> dict[str, np.ndarray]:
    """The model's parameters as NumPy arrays under the twin's torch names and layouts.

    Returns
    -------
    state : dict of str to ndarray
        New C-contiguous arrays (linear weights transposed to (C_out, C_in)); load them into
        the twin with ``twin.load_state_dict({k: torch.from_numpy(a) for k, a in
        state.items()})``.
    """
    return to_torch_layout(model, {name: p for name, p, _ in model.named_parameters()})


def _as_numpy(value: object) -> np.ndarray:
    """A NumPy array from an array or a torch tensor (duck-typed: no torch import here)."""
    if hasattr(value, "detach"):
        value = value.detach().cpu()
    return np.asarray(value)


def from_torch_layout(model: Module, state: Mapping[str, object]) -> dict[str, np.ndarray]:
    """The inverse of :func:`to_torch_layout`: torch-named arrays under our names and layouts.

    Parameters
    ----------
    model : Module
    state : dict of str to ndarray or torch.Tensor
        Exactly one entry per parameter of the twin.

    Returns
    -------
    arrays : dict of str to ndarray
        In the order of ``model.named_parameters()``; transposed ones are views.

    Raises
    ------
    ValueError
        If a key is missing or unexpected.
    """
    names = torch_names(model)
    wanted = {torch_name for torch_name, _ in names.values()}
    missing = sorted(wanted - set(state))
    unexpected = sorted(set(state) - wanted)
    if missing or unexpected:
        raise ValueError(f"torch state dict does not match the model: missing keys {missing}, "
                         f"unexpected keys {unexpected}")
    ours = {}
    for our_name, (torch_name, transpose) in names.items():
        array = _as_numpy(state[torch_name])
        ours[our_name] = array.T if transpose else array
    return ours


def from_torch_state_dict(model: Module, state: Mapping[str, object]) -> None:
    """Copy a torch-named state dict into ``model``, in place (the inverse of
    :func:`to_torch_state_dict`).

    Parameters
    ----------
    model : Module
    state : dict of str to ndarray or torch.Tensor
        As returned by ``twin.state_dict()`` or :func:`to_torch_state_dict`. Values are cast
        to each parameter's dtype.

    Raises
    ------
    ValueError
        If a key is missing or unexpected, or a shape does not match (nothing is copied then).
    """
    model.load_state_dict(from_torch_layout(model, state))  # checks every shape first

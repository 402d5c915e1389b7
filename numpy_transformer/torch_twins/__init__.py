"""PyTorch twins of every op, layer, block and model of ``numpy_transformer``.

A twin computes the same function as our code with PyTorch's own building blocks, so that
torch autograd can check every hand-written backward (``reference_checks/``), and so that a
model trained here can be trained further with PyTorch, and come back:

>>> from numpy_transformer.torch_twins import to_torch, from_torch       # doctest: +SKIP
>>> twin = to_torch(model)                     # a torch.nn.Module holding model's weights
>>> torch_opt = adam_to_torch(optimizer, model, twin)   # Adam's moments and step count too
>>> model = from_torch(twin)                   # one of our models, the twin's weights
>>> optimizer = adam_from_torch(torch_opt, twin, model)

* :mod:`.ops` -- functions of torch tensors with the signatures of our ``*_forward``
  functions (``linear(x, w, b)`` with ``w`` in our (C_in, C_out) layout, ``sdpa(q, k, v,
  mask, bias)`` with our mask convention, True = may attend, and our zero output for a fully
  masked row).
* :mod:`.modules` -- ``torch.nn.Module`` trees whose children carry exactly our child names
  (``decoder.blocks.0.attn``, ``...ffn.up``, ``head``), made of ``nn.Linear``,
  ``nn.Embedding``, ``nn.LayerNorm`` and ``nn.RMSNorm``. Our dotted name maps to the twin's by
  ``numpy_transformer.interop.torch_names`` (``attn.wq`` -> ``attn.q_proj.weight``,
  transposed).
* :mod:`.convert` -- :func:`to_torch`, :func:`from_torch`, and Adam's state both ways.

Positions, RoPE angles and ALiBi slopes are recomputed in :mod:`.ops` from their formulas,
not imported from our code, so a wrong table on our side shows up as a mismatch.

Importing this package does not import torch; the first name taken from it does, and without
torch that raises one ``ImportError`` line saying ``pip install "numpy_transformer[torch]"``.

The name is ``torch_twins``, not ``torch``: a subpackage called ``torch`` would shadow the
real one for any script run from inside ``numpy_transformer/`` (its folder is then first on
``sys.path``), and ``from numpy_transformer import torch`` would hide the real ``torch`` in
the reader's namespace.
"""

from __future__ import annotations

from importlib import import_module

# name -> the submodule that defines it
_HOMES = {
    **dict.fromkeys(("to_torch", "from_torch", "adam_to_torch", "adam_from_torch",
                     "build_twin", "twin_class", "dtype_of", "gradient_pairs"), "convert"),
    **dict.fromkeys(("EncoderClassifier", "DecoderLM", "EncoderDecoder", "Encoder", "Decoder",
                     "EncoderBlock", "DecoderBlock", "MultiHeadAttention", "FeedForward",
                     "Embeddings", "SinusoidalPositions", "LearnedPositions", "make_norm"),
                    "modules"),
    "TORCH_DTYPES": "ops",
    "tensor_of": "ops",
}
_SUBMODULES = ("ops", "modules", "convert")

__all__ = sorted([*_HOMES, *_SUBMODULES])


def __getattr__(name: str):
    """Import the submodule that holds ``name`` (and torch with it) on first use."""
    if name in _SUBMODULES:
        return import_module(f".{name}", __name__)
    if name in _HOMES:
        return getattr(import_module(f".{_HOMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

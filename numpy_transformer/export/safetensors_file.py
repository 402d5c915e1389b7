"""safetensors files: the weights in the PyTorch twin's names and layouts, and Adam's state.

The exchange format between this library, PyTorch and anything else that reads safetensors.
A weights file holds every parameter under the twin's name (``decoder.blocks.0.attn.q_proj.
weight``), linear weights in PyTorch's (C_out, C_in) layout, so PyTorch alone loads it::

    twin = numpy_transformer.torch_twins.DecoderLM(config)
    twin.load_state_dict(safetensors.torch.load_file("model.safetensors"), strict=True)

and its metadata (text, as the format allows) says what it is:

=================  ==========================================================================
key                value
=================  ==========================================================================
``format``         ``"numpy_transformer"``
``model``          the model family: ``"DecoderLM"``, ``"EncoderClassifier"``, ``"LSTMLM"``...
``config``         JSON: the model's config as a dict (``LSTMConfig`` for an ``LSTMLM``,
                   ``TransformerConfig`` for the others)
``tokenizer``      JSON: ``CharTokenizer.to_dict()`` (absent for models without one)
``info``           JSON: anything else, e.g. the run's training options and step
=================  ==========================================================================

An optimiser file (:func:`save_optimizer`) holds Adam's moments under ``exp_avg.<torch
name>`` and ``exp_avg_sq.<torch name>``, laid out as their weights, and in its metadata the
kind (``Adam``/``AdamW``), the step count, the hyperparameters and the decayed parameters.

Files are written and read by the ``safetensors`` package's NumPy API; this module never
builds the format by hand. Our ``.npz`` checkpoint (``checkpoint.py``) stays the format that
resumes a run bit for bit; this one is for leaving the library and coming back.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import interop
from .. import nn as ours
from ..config import DEFAULT_BACKEND, LSTMConfig, TransformerConfig
from ..data import CharTokenizer
from ..optim import Adam, AdamW
from ._require import require

FORMAT = "numpy_transformer"
OPTIMIZER_FORMAT = "numpy_transformer.optimizer"
MODELS = {"EncoderClassifier": TransformerConfig, "DecoderLM": TransformerConfig,
          "EncoderDecoder": TransformerConfig, "LSTMLM": LSTMConfig}  # family -> its config


@dataclass
class Exported:
    """What a weights file holds: the model, its tokenizer (or None) and the ``info`` dict."""

    model: ours.Module
    tokenizer: CharTokenizer | None
    info: dict = field(default_factory=dict)


def _numpy_api(purpose: str):
    return require("safetensors.numpy", purpose)


def _metadata(path: Path, purpose: str) -> dict[str, str]:
    safetensors = require("safetensors", purpose)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    try:
        with safetensors.safe_open(str(path), framework="np") as f:
            return f.metadata() or {}
    except Exception as e:  # the package raises its own error types for a foreign file
        raise ValueError(f"{path}: not a safetensors file ({type(e).__name__}: {e})") from None


def _json(path: Path, meta: dict[str, str], key: str):
    if key not in meta:
        raise ValueError(f"{path}: the metadata has no {key!r} entry")
    try:
        return json.loads(meta[key])
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: metadata entry {key!r} is not valid JSON ({e})") from None


def save_safetensors(path: str | Path, model: ours.Module,
                     tokenizer: CharTokenizer | None = None, info: dict | None = None) -> None:
    """Write the model's weights in the twin's names and layouts, with config and tokenizer.

    Parameters
    ----------
    path : path of the ``.safetensors`` file (overwritten)
    model : EncoderClassifier, DecoderLM, EncoderDecoder or LSTMLM
    tokenizer : CharTokenizer, optional
    info : dict, optional
        JSON-able; stored as the ``info`` metadata entry (the run's options, its step...).

    Raises
    ------
    ValueError
        If ``model`` is not one of the model families (:data:`MODELS`).
    """
    kind = type(model).__name__
    if kind not in MODELS:
        raise ValueError(f"save_safetensors takes a whole model ({', '.join(MODELS)}), "
                         f"got {kind}")
    meta = {"format": FORMAT, "model": kind, "config": json.dumps(asdict(model.config)),
            "info": json.dumps(info or {})}
    if tokenizer is not None:
        meta["tokenizer"] = json.dumps(tokenizer.to_dict())
    _numpy_api("the safetensors export").save_file(interop.to_torch_state_dict(model),
                                                   str(path), metadata=meta)


def load_safetensors(path: str | Path, backend: str | None = None) -> Exported:
    """Read a file written by :func:`save_safetensors` (or by PyTorch from the twin's
    ``state_dict()``, given the same metadata) back into one of our models.

    Parameters
    ----------
    path : path of the ``.safetensors`` file
    backend : str, optional
        The model's backend; default the one in the stored config.

    Returns
    -------
    exported : Exported
        The model in the dtype of the stored weights, its tokenizer (None if there is none)
        and the ``info`` dict.

    Raises
    ------
    ValueError
        One line naming the file: not a safetensors file, not ours (no metadata), a bad
        config or tokenizer, weights that are not float32/float64 or do not fit the config.
    """
    path = Path(path)
    meta = _metadata(path, "reading a safetensors file")
    if meta.get("format") != FORMAT or meta.get("model") not in MODELS:
        raise ValueError(f"{path}: not a numpy_transformer weights file (its metadata has "
                         f"format={meta.get('format')!r}, model={meta.get('model')!r})")
    state = _numpy_api("reading a safetensors file").load_file(str(path))
    dtypes = {a.dtype.name for a in state.values()}
    if len(dtypes) != 1 or not dtypes <= {"float32", "float64"}:
        raise ValueError(f"{path}: the weights must be all float32 or all float64, got "
                         f"{sorted(dtypes)}")
    fields = _json(path, meta, "config")
    if backend is not None:
        fields["backend"] = backend
    try:
        config = MODELS[meta["model"]](**{**fields, "dtype": dtypes.pop()}).validate()
        model = getattr(ours, meta["model"])(config)
        interop.from_torch_state_dict(model, state)
        tokenizer = None
        if "tokenizer" in meta:
            tokenizer = CharTokenizer.from_dict(_json(path, meta, "tokenizer"))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None
    info = _json(path, meta, "info") if "info" in meta else {}
    return Exported(model, tokenizer, info)


def save_optimizer(path: str | Path, optimizer: Adam, model: ours.Module) -> None:
    """Write Adam's state in the twin's names and layouts (see the module docstring).

    Parameters
    ----------
    path : path of the ``.safetensors`` file (overwritten)
    optimizer : Adam or AdamW
        Ours, training ``model``.
    model : Module
    """
    params = {name: p for name, p, _ in model.named_parameters()}
    names = interop.torch_names(model)
    tensors = {}
    if optimizer.t:
        for kind, moments in (("exp_avg", optimizer.m), ("exp_avg_sq", optimizer.v)):
            for torch_name, a in interop.to_torch_layout(model, moments).items():
                tensors[f"{kind}.{torch_name}"] = a
    decayed = [names[n][0] for n in names
               if optimizer.weight_decay and optimizer.decays(n, params[n])]
    meta = {"format": OPTIMIZER_FORMAT, "kind": "AdamW" if optimizer.decoupled else "Adam",
            "t": str(optimizer.t), "lr": repr(optimizer.lr), "beta1": repr(optimizer.betas[0]),
            "beta2": repr(optimizer.betas[1]), "eps": repr(optimizer.eps),
            "weight_decay": repr(optimizer.weight_decay), "decayed": json.dumps(decayed)}
    _numpy_api("the safetensors export").save_file(tensors, str(path), metadata=meta)


def load_optimizer(path: str | Path, model: ours.Module,
                   backend: str = DEFAULT_BACKEND) -> Adam:
    """Read a file written by :func:`save_optimizer` into a new optimiser of ours.

    Parameters
    ----------
    path : path of the ``.safetensors`` file
    model : Module
        The model the optimiser trains (the one the file's moments fit).
    backend : str, default ``config.DEFAULT_BACKEND``

    Returns
    -------
    optimizer : Adam or AdamW
        With the stored step count, moments and hyperparameters; its decay rule is the stored
        set of decayed parameters.

    Raises
    ------
    ValueError
        One line naming the file: not an optimiser file, or moments that do not fit ``model``.
    """
    path = Path(path)
    meta = _metadata(path, "reading a safetensors file")
    if meta.get("format") != OPTIMIZER_FORMAT or meta.get("kind") not in ("Adam", "AdamW"):
        raise ValueError(f"{path}: not a numpy_transformer optimiser file (its metadata has "
                         f"format={meta.get('format')!r}, kind={meta.get('kind')!r})")
    by_torch = {t: n for n, (t, _) in interop.torch_names(model).items()}
    try:
        decay = frozenset(by_torch[t] for t in _json(path, meta, "decayed"))
        state = {k: float(meta[k]) for k in ("lr", "beta1", "beta2", "eps", "weight_decay")}
        t = int(meta["t"])
    except (KeyError, ValueError) as e:
        raise ValueError(f"{path}: bad optimiser metadata ({type(e).__name__}: {e})") from None
    optimizer = (AdamW if meta["kind"] == "AdamW" else Adam)(
        lr=state["lr"], betas=(state["beta1"], state["beta2"]), eps=state["eps"],
        weight_decay=state["weight_decay"], decay=decay, backend=backend)
    tensors = _numpy_api("reading a safetensors file").load_file(str(path))
    moments = {"m": {}, "v": {}}
    try:
        if t:
            for key, kind in (("m", "exp_avg."), ("v", "exp_avg_sq.")):
                moments[key] = interop.from_torch_layout(
                    model, {k[len(kind):]: a for k, a in tensors.items() if k.startswith(kind)})
        optimizer.load_state_dict({**state, "t": t, **moments})
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return optimizer

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
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .. import interop
from .. import nn as ours
from ..bpe import tokenizer_from_dict
from ..config import DEFAULT_BACKEND, LSTMConfig, TransformerConfig
from ..data import CharTokenizer
from ..files import check_file
from ..memory import parameter_count
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


def write_tensors(path: Path, tensors: dict, metadata: dict[str, str], purpose: str) -> None:
    """``safetensors.numpy.save_file``, with a failed write raised as the ``OSError`` it is.

    The package reports a full disk, a file-size limit or a read-only folder as its own
    ``SafetensorError`` ("I/O error: File too large (os error 27)"); the command line answers
    an ``OSError`` naming the file with exit 74.
    """
    try:
        _numpy_api(purpose).save_file(tensors, str(path), metadata=metadata)
    except Exception as e:
        found = re.search(r"I/O error: (.*?) \(os error (\d+)\)", str(e))
        if found is None:
            raise
        raise OSError(int(found[2]), found[1], str(path)) from None


def read_header(path: Path, purpose: str) -> tuple[dict[str, str], dict[str, tuple]]:
    """The file's metadata and its tensors' ``(dtype, shape)`` by name, read from its header
    alone (no tensor is read yet)."""
    safetensors = require("safetensors", purpose)
    check_file(path)
    # Opened once here: a file we may not read raises the OSError it is (permission denied,
    # named: the command line's exit 74), where the package would say "No such file"
    open(path, "rb").close()
    try:
        with safetensors.safe_open(str(path), framework="np") as f:
            slices = {name: f.get_slice(name) for name in f.keys()}
            header = {name: (s.get_dtype(), tuple(s.get_shape())) for name, s in slices.items()}
            return f.metadata() or {}, header
    except Exception as e:  # the package raises its own error types for a foreign file
        raise ValueError(f"{path}: not a safetensors file ({type(e).__name__}: {e})") from None


def _json(path: Path, meta: dict[str, str], key: str, kind: type = dict):
    """Metadata entry ``key`` as JSON, which must be a ``kind``."""
    if key not in meta:
        raise ValueError(f"{path}: the metadata has no {key!r} entry")
    try:
        value = json.loads(meta[key])
    except (json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"{path}: metadata entry {key!r} is not valid JSON "
                         f"({type(e).__name__})") from None
    if not isinstance(value, kind):
        raise ValueError(f"{path}: metadata entry {key!r} must be a JSON "
                         f"{'object' if kind is dict else 'list'}, got {type(value).__name__}")
    return value


# The stored dtypes a file's tensors may have, and the one each is read as: half precision
# (float16, and bfloat16, the top 16 bits of a float32) as float32, which this library computes in
STORED = {"F32": ("<f4", "float32"), "F64": ("<f8", "float64"), "F16": ("<f2", "float32"),
          "BF16": ("<u2", "float32")}


def check_dtypes(path: Path, header: dict[str, tuple]) -> str:
    """The one float dtype the file's tensors are read as, ``"float32"`` or ``"float64"``
    (float16 and bfloat16 weights, as LLaMA's often are, are read as float32)."""
    dtypes = {dtype for dtype, _ in header.values()}
    read_as = {STORED[d][1] for d in dtypes if d in STORED}
    if not dtypes or not dtypes <= set(STORED) or len(read_as) != 1:
        raise ValueError(f"{path}: the weights must be all float32 or half precision (F16, "
                         f"BF16), or all float64, got {sorted(dtypes)}")
    return read_as.pop()


def read_tensors(path: Path, purpose: str) -> dict:
    """Every tensor of the file as :func:`check_dtypes` reads it, each checked finite.

    One tensor at a time, straight from the file into its array (the format: an 8-byte
    little-endian header length, the JSON header with each tensor's ``dtype``, ``shape`` and
    ``data_offsets``, the data): ``safetensors.numpy.load_file`` would hold the file's bytes
    beside the arrays, twice the weights at GPT-2's size.
    """
    _, header = read_header(path, purpose)  # the package's own checks of the header
    if header:  # (an optimiser's file before its first step holds no tensor)
        check_dtypes(path, header)
    tensors = {}
    try:
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            layout = json.loads(f.read(length))
            for name, (dtype, shape) in header.items():
                start, end = layout[name]["data_offsets"]
                stored, read_as = STORED[dtype]
                count = math.prod(shape)
                if end - start != count * np.dtype(stored).itemsize:
                    raise ValueError(f"its {shape} {dtype} data spans {end - start} bytes")
                f.seek(8 + length + start)
                a = np.fromfile(f, dtype=stored, count=count)
                if a.size != count:
                    raise ValueError("the file ends inside its data")
                if dtype == "BF16":  # the top half of a float32's bits
                    a = (a.astype(np.uint32) << 16).view(np.float32)
                tensors[name] = a.astype(read_as, copy=False).reshape(shape)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: cannot read its tensors ({type(e).__name__}: {e})") from None
    for name, a in tensors.items():
        if not np.isfinite(a).all():
            raise ValueError(f"{path}: tensor {name} holds NaN or infinite values")
    return tensors


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
    write_tensors(Path(path), interop.to_torch_state_dict(model), meta, "the safetensors export")


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
    meta, header = read_header(path, "reading a safetensors file")
    if meta.get("format") != FORMAT or meta.get("model") not in MODELS:
        raise ValueError(f"{path}: not a numpy_transformer weights file (its metadata has "
                         f"format={meta.get('format')!r}, model={meta.get('model')!r})")
    dtype = check_dtypes(path, header)
    fields = _json(path, meta, "config")
    if backend is not None:
        fields["backend"] = backend
    try:
        config = MODELS[meta["model"]](**{**fields, "dtype": dtype}).validate()
        tokenizer = None
        if "tokenizer" in meta:
            tokenizer = tokenizer_from_dict(_json(path, meta, "tokenizer"))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None
    # the config is held to the file before anything is built: sizes from a header cost no
    # memory, the model of a config does
    held, wanted = sum(math.prod(shape) for _, shape in header.values()), parameter_count(
        config, meta["model"])
    if held != wanted:
        raise ValueError(f"{path}: holds {held:,} weights, but the {meta['model']} of its "
                         f"config has {wanted:,}")
    if tokenizer is not None and tokenizer.vocab_size != config.vocab:
        raise ValueError(f"{path}: the tokenizer has {tokenizer.vocab_size} characters, the "
                         f"model's vocabulary {config.vocab}")
    state = read_tensors(path, "reading a safetensors file")
    try:
        model = getattr(ours, meta["model"])(config)
        interop.from_torch_state_dict(model, state)
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
    write_tensors(Path(path), tensors, meta, "the safetensors export")


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
    meta, header = read_header(path, "reading a safetensors file")
    if meta.get("format") != OPTIMIZER_FORMAT or meta.get("kind") not in ("Adam", "AdamW"):
        raise ValueError(f"{path}: not a numpy_transformer optimiser file (its metadata has "
                         f"format={meta.get('format')!r}, kind={meta.get('kind')!r})")
    by_torch = {t: n for n, (t, _) in interop.torch_names(model).items()}
    try:
        decay = frozenset(by_torch[t] for t in _json(path, meta, "decayed", list))
        state = {k: float(meta[k]) for k in ("lr", "beta1", "beta2", "eps", "weight_decay")}
        t = int(meta["t"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: bad optimiser metadata ({type(e).__name__}: {e})") from None
    if header:
        check_dtypes(path, header)
    optimizer = (AdamW if meta["kind"] == "AdamW" else Adam)(
        lr=state["lr"], betas=(state["beta1"], state["beta2"]), eps=state["eps"],
        weight_decay=state["weight_decay"], decay=decay, backend=backend)
    tensors = read_tensors(path, "reading a safetensors file")
    negative = [k for k, a in tensors.items() if k.startswith("exp_avg_sq.") and (a < 0).any()]
    if negative:
        raise ValueError(f"{path}: second moments below zero in {negative[0]}")
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

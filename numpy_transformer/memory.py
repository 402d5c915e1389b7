"""Memory: what a model or a training run will hold, and what the machine has, compared before
anything is allocated.

A size that cannot fit (``layers=10**12``, ``max_len=10**12``, a schedule of 10**12 steps)
would otherwise hang while the pages of its arrays are touched one by one, or end in a
``MemoryError`` deep inside NumPy. The estimates below are arithmetic on the sizes, in Python
integers (they cannot overflow), and count only what certainly stays allocated:

* the weights: every parameter and fixed table (sinusoidal, RoPE) of the model, exactly;
* training adds a gradient and Adam's two moments per parameter (three more copies);
* the activations one training step keeps for its backward pass, per position: the block's
  inputs, q, k, v, the attention output, the feed-forward network's hidden layer (twice: before
  and after the activation), the logits and their probabilities; with the NumPy backend also the
  attention probabilities (H by T per position; the numba kernel keeps one number per row).
  An LSTM keeps the embedding and, per layer, its four gates, c, tanh(c) and h (7H a position:
  ``functional/lstm.py``'s cache, the same on both backends), then the logits and their
  probabilities;
* inference (generation, a held-out loss, a forward in evaluation mode) keeps no activation:
  it holds the weights and, at its peak, one layer's temporaries and the logits with their
  probabilities (:func:`inference_count`); a held-out loss takes as many windows per call as
  keep the logits of a call near ``EVAL_LOGITS`` numbers (:func:`eval_batch`);
* the LM's window schedule, drawn up front: steps x batch int64 starts;
* the Python objects of each layer beside its numbers: the modules, their ``params`` and
  ``grads`` dicts, every array's header (``LAYER_OBJECT_BYTES``). At small widths they are
  what a model costs: a million layers of width 2 hold twenty times more bytes of objects than
  of weights.

NumPy's temporaries and the interpreter are not counted, so the estimate is a lower bound of
what a run allocates: when it exceeds the memory available, the run cannot fit and is refused
(:func:`check_fits`) with one line naming the size that matters most and the estimate.

This module is one of the foundations: it imports only the standard library.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

__all__ = ["available_memory", "format_bytes", "weight_count", "parameter_count",
           "activation_count", "inference_count", "eval_batch", "object_bytes",
           "training_bytes", "inference_bytes", "check_fits", "check_config_fits",
           "check_training_fits", "check_inference_fits"]

SIZES = ("vocab", "width", "heads", "layers", "ffn_width", "max_len")  # TransformerConfig's
LSTM_SIZES = ("vocab", "embed", "hidden", "layers", "max_len")  # LSTMConfig's
MODEL_KINDS = ("DecoderLM", "EncoderClassifier", "EncoderDecoder")  # of a TransformerConfig
LSTM_KIND = "LSTMLM"  # the one model of an LSTMConfig
SCHEDULE_ITEM = 8  # bytes of one window start (int64)
EVAL_BATCH = 64  # windows per call of a held-out loss, where their logits stay small
EVAL_LOGITS = 2 ** 24  # logits per call of a held-out loss beyond which it takes fewer windows
# Bytes of the Python objects of one layer (``layers`` counts one block of each stack), apart
# from its numbers: measured with tracemalloc, 300 layers of width 2 less one layer, NumPy
# backend, float32 (float64's are 1-20% more), rounded down so the estimate stays a lower bound
# (12.2, 12.2, 31.1 and 2.1 kB for float64).
LAYER_OBJECT_BYTES = {"DecoderLM": 11_000, "EncoderClassifier": 11_000,
                      "EncoderDecoder": 29_000, "LSTMLM": 1_500}


def available_memory() -> int | None:
    """Bytes the machine can give this process now: Linux's ``MemAvailable``, else the physical
    memory (``sysconf``), else ``None`` (unknown: nothing is refused)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the file counts kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def format_bytes(n: int) -> str:
    """``1536`` -> ``"1.5 kB"``; an astronomical count as a power of ten."""
    if n >= 1000 ** 7:  # float(n) may overflow past 1e308: count digits instead
        return f"10^{int(n.bit_length() * 0.30103)} bytes"
    for unit in ("bytes", "kB", "MB", "GB", "TB", "PB"):
        if n < 1000:
            return f"{n:.3g} {unit}" if unit != "bytes" else f"{n} bytes"
        n /= 1000
    return f"{n:.3g} EB"


# --------------------------------------------------------------------------------------------
# What a model and a step hold, in numbers (multiply by the dtype's item size for bytes)
# --------------------------------------------------------------------------------------------

def _itemsize(config) -> int:
    return 4 if config.dtype == "float32" else 8


def _sizes(config, model: str) -> dict[str, int]:
    """The sizes of ``config`` the estimates of ``model`` depend on, by name (an LSTM's
    ``embed=None`` means ``hidden`` and is left out)."""
    names = LSTM_SIZES if model == LSTM_KIND else SIZES
    return {k: getattr(config, k) for k in names if getattr(config, k) is not None}


def weight_count(config, model: str = "DecoderLM") -> int:
    """Numbers in the parameters and fixed tables of ``model`` built from ``config``.

    Parameters
    ----------
    config : TransformerConfig or LSTMConfig
        Its sizes are read as they are (not validated).
    model : {"DecoderLM", "EncoderClassifier", "EncoderDecoder", "LSTMLM"}
        The last for an LSTMConfig, the others for a TransformerConfig.
    """
    return parameter_count(config, model) + _table_count(config, model)


def parameter_count(config, model: str = "DecoderLM") -> int:
    """Numbers in the parameters of ``model`` built from ``config``: what its weights file
    holds, and ``model.num_parameters()`` (arguments as :func:`weight_count`)."""
    if model == LSTM_KIND:
        v, e, h = config.vocab, config.embed_width, config.hidden
        # layer k: w_ih (C_k, 4H), w_hh (H, 4H), b_ih and b_hh (4H,), with C_0 = E, C_k = H
        lstm = config.layers * (4 * h * h + 8 * h) + 4 * h * (e + (config.layers - 1) * h)
        return v * e + lstm + h * v + v  # embedding table, the LSTM, the head with its bias
    c, f, v, t = config.width, config.ffn_width, config.vocab, config.max_len
    b = 1 if config.bias else 0  # every linear layer's bias, or none
    norm = 2 * c if config.norm == "layernorm" else c  # gain and bias, or gain only
    kv = c // max(config.heads, 1) * (config.kv_heads or config.heads)  # H_kv D
    attention = 2 * (c * c + b * c) + 2 * (c * kv + b * kv)  # q and out; k and v, H_kv D wide
    ffn = 2 * c * f + b * (f + c) + (c * f + b * f if config.activation == "swiglu" else 0)
    block = attention + ffn + 2 * norm
    table = t * c if config.positions == "learned" else 0
    stack = v * c + table + config.layers * block + (norm if config.norm_first else 0)
    if model == "EncoderClassifier":
        classes = config.num_classes or 0
        return stack + c * classes + b * classes
    head = 0 if config.tie_embeddings else c * v + b * v
    if model == "EncoderDecoder":  # a second stack whose blocks also cross-attend
        return 2 * stack + config.layers * (attention + norm) + head
    return stack + head


def _table_count(config, model: str) -> int:
    """Numbers in the fixed tables (buffers) of ``model``: the sinusoidal table of each stack,
    RoPE's cos and sin, (T, D/2) each, in every self-attention."""
    if model == LSTM_KIND:
        return 0
    c, t, stacks = config.width, config.max_len, 2 if model == "EncoderDecoder" else 1
    if config.positions == "sinusoidal":
        return stacks * t * c
    if config.positions == "rope":
        return stacks * config.layers * t * (c // max(config.heads, 1))
    return 0


def activation_count(config, batch: int, model: str = "DecoderLM") -> int:
    """Numbers one training step of ``batch`` sequences of ``max_len`` keeps for its backward
    pass (a lower bound; see the module docstring)."""
    if model == LSTM_KIND:
        per_position = config.embed_width + config.layers * 7 * config.hidden + 2 * config.vocab
        return batch * config.max_len * per_position
    c, f, t = config.width, config.ffn_width, config.max_len
    hidden = 3 * f if config.activation == "swiglu" else 2 * f
    probs = config.heads * t if config.backend == "numpy" else 0
    block = 6 * c + hidden + probs  # per position
    stacks = 2 if model == "EncoderDecoder" else 1
    out = (config.num_classes or 0) if model == "EncoderClassifier" else config.vocab
    return batch * t * (stacks * config.layers * block + c + 2 * out)


def inference_count(config, batch: int, length: int | None = None,
                    model: str = "DecoderLM") -> int:
    """Numbers a forward in evaluation mode of ``batch`` sequences of ``length`` positions
    (default ``max_len``) holds at its peak beyond the weights: the residual stream and one
    layer's temporaries (nothing is kept for a backward), then the logits and their
    probabilities (a lower bound, as :func:`activation_count`)."""
    t = config.max_len if length is None else length
    if model == LSTM_KIND:
        per_position = config.embed_width + 7 * config.hidden + 2 * config.vocab
        return batch * t * per_position
    c, f = config.width, config.ffn_width
    hidden = 3 * f if config.activation == "swiglu" else 2 * f
    probs = config.heads * t if config.backend == "numpy" else 0
    out = (config.num_classes or 0) if model == "EncoderClassifier" else config.vocab
    return batch * t * (6 * c + hidden + probs + 2 * out)


def eval_batch(config) -> int:
    """Windows of ``max_len`` per call of a held-out loss: ``EVAL_BATCH``, or fewer (at least
    one) where their logits would exceed ``EVAL_LOGITS`` numbers (GPT-2's vocabulary at 1,024
    positions: one window a call)."""
    per_window = max(1, config.max_len * config.vocab)
    return max(1, min(EVAL_BATCH, EVAL_LOGITS // per_window))


def object_bytes(config, model: str = "DecoderLM") -> int:
    """Bytes of the Python objects of ``model``'s layers apart from their numbers, at least
    (``LAYER_OBJECT_BYTES``)."""
    return config.layers * LAYER_OBJECT_BYTES[model]


def training_bytes(config, model: str, batch: int, steps: int, eval_batch: int = 0,
                   schedule: bool = True) -> dict[str, int]:
    """Bytes a training run of ``model`` holds, by part.

    ``eval_batch``: sequences per call of a held-out evaluation (in evaluation mode: see
    :func:`inference_count`); ``schedule``: whether the run draws its (steps, batch) window
    starts up front (the LM).
    """
    itemsize = _itemsize(config)
    activations = max(activation_count(config, batch, model),
                      inference_count(config, eval_batch, model=model))
    return {"weights, gradients and Adam's moments": 4 * weight_count(config, model) * itemsize,
            "the layers' Python objects": object_bytes(config, model),
            "activations of a step": activations * itemsize,
            "window schedule": steps * batch * SCHEDULE_ITEM if schedule else 0}


def inference_bytes(config, model: str, batch: int, length: int | None = None,
                    copies: int = 1) -> dict[str, int]:
    """Bytes an inference of ``model`` holds, by part: ``copies`` of the weights (two while
    one model's weights are copied into another, as ``import`` does) and a forward of
    ``batch`` sequences of ``length`` positions (:func:`inference_count`)."""
    itemsize = _itemsize(config)
    return {"weights": copies * weight_count(config, model) * itemsize,
            "the layers' Python objects": copies * object_bytes(config, model),
            "a forward": inference_count(config, batch, length, model) * itemsize}


# --------------------------------------------------------------------------------------------
# The check
# --------------------------------------------------------------------------------------------

def _label(name: str, value: int) -> str:
    return f"{name}={value}"


def check_fits(needs: Callable[[dict[str, int]], dict[str, int]], sizes: dict[str, int],
               label: Callable[[str, int], str] = _label,
               adjustable: tuple[str, ...] | None = None, hint: str = "") -> None:
    """Raise ``ValueError`` if what ``needs(sizes)`` estimates exceeds the memory available.

    Parameters
    ----------
    needs : callable
        Maps the sizes to the bytes of each part (e.g. :func:`training_bytes`).
    sizes : dict of str to int
        The sizes the estimate depends on, by name.
    label : callable (name, value) -> str
        How the message names a size (``"max_len=100"``; the command line: ``"--context 100"``).
    adjustable : tuple of str, optional
        The sizes the caller may change (default: all). The one named in the message is the
        one of these that matters most: set to 1, it shrinks the estimate the most; the
        message also gives the largest value of it that fits, where one does.
    hint : str, optional
        Appended to the message (how to change that size, where the command cannot).
    """
    parts = needs(sizes)
    total = sum(parts.values())
    available = available_memory()
    if available is None or total <= available:
        return
    detail = ", ".join(f"{part} {format_bytes(n)}" for part, n in parts.items() if n)
    needed = f"at least {format_bytes(total)} of memory ({detail}) and " \
             f"{format_bytes(available)} is available"
    names = [name for name in sizes if adjustable is None or name in adjustable]
    if not names:
        raise ValueError(f"this needs {needed}{hint}")

    def total_with(name: str, value: int) -> int:
        return sum(needs({**sizes, name: value}).values())

    culprit = min(names, key=lambda name: total_with(name, 1))
    fits = ""
    if total_with(culprit, 1) <= available:  # the largest value that fits, by bisection
        lo, hi = 1, sizes[culprit]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if total_with(culprit, mid) <= available else (lo, mid)
        fits = f"; {label(culprit, lo)} fits"
    raise ValueError(f"{label(culprit, sizes[culprit])} is too large: it needs {needed}"
                     f"{fits}{hint}")


def check_config_fits(config, models: tuple[str, ...] = MODEL_KINDS) -> None:
    """:func:`check_fits` for the weights of the smallest of ``models`` that ``config`` can
    build (``(LSTM_KIND,)`` for an LSTMConfig).

    Raises
    ------
    ValueError
        If the weights and their objects alone exceed the memory available.
    """
    def needs(sizes: dict[str, int]) -> dict[str, int]:
        sized = dataclasses.replace(config, **sizes)
        return {"weights": min(weight_count(sized, m) * _itemsize(config)
                               + object_bytes(sized, m) for m in models)}

    check_fits(needs, _sizes(config, models[0]))


def check_training_fits(config, model: str, batch: int, steps: int, eval_batch: int = 0,
                        schedule: bool = True, label: Callable[[str, int], str] = _label,
                        adjustable: tuple[str, ...] | None = None, hint: str = "") -> None:
    """:func:`check_fits` for a training run (:func:`training_bytes`); ``batch`` and ``steps``
    are sizes like the config's; ``adjustable`` and ``hint`` as :func:`check_fits` takes them.

    Raises
    ------
    ValueError
        If the run cannot fit in the memory available.
    """
    model_sizes = _sizes(config, model)

    def needs(sizes: dict[str, int]) -> dict[str, int]:
        sized = dataclasses.replace(config, **{k: sizes[k] for k in model_sizes})
        return training_bytes(sized, model, sizes["batch"], sizes["steps"], eval_batch, schedule)

    check_fits(needs, {**model_sizes, "batch": batch, "steps": steps}, label, adjustable, hint)


def check_inference_fits(config, model: str, batch: int, length: int | None = None,
                         copies: int = 1, label: Callable[[str, int], str] = _label,
                         adjustable: tuple[str, ...] = ("batch", "length"),
                         hint: str = "") -> None:
    """:func:`check_fits` for an inference (:func:`inference_bytes`): the weights and one
    forward of ``batch`` sequences of ``length`` positions.

    Raises
    ------
    ValueError
        If it cannot fit in the memory available.
    """
    model_sizes = _sizes(config, model)

    def needs(sizes: dict[str, int]) -> dict[str, int]:
        sized = dataclasses.replace(config, **{k: sizes[k] for k in model_sizes})
        return inference_bytes(sized, model, sizes["batch"], sizes["length"], copies)

    sizes = {**model_sizes, "batch": batch,
             "length": config.max_len if length is None else length}
    check_fits(needs, sizes, label, adjustable, hint)

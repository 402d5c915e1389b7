"""Checkpoints: one plain ``.npz`` file that can resume a run bit for bit and never runs code.

What a checkpoint holds (every key of the ``.npz``)::

    format_version        int, the format it was written in (FORMAT_VERSION)
    step                  int, updates made so far = the position in the data schedule
    param.<dotted name>   every model parameter (its own dtype)
    adam_m.<name>         Adam's first moments     } absent before the first update
    adam_v.<name>         Adam's second moments    }
    optimizer             JSON: {"kind", "t", "lr", "beta1", "beta2", "eps", "weight_decay"}
    rng                   JSON: {name: bit_generator.state} of every generator of the run
                          (each Dropout layer's, the task's data generator, the sampler's)
    config                JSON: the model's TransformerConfig as a dict
    options               JSON: the training options (task, steps, lr, ...)
    tokenizer             JSON: CharTokenizer.to_dict() or BPETokenizer.to_dict() (bpe.py),
                          or null for the synthetic tasks
    meta                  JSON: anything else the trainer wants back (e.g. "finished")

JSON travels as a 0-d unicode array (``np.array(json_str)``) so the file is read with
``np.load(allow_pickle=False)``: a checkpoint holds numbers and text only, and loading one
can never execute code (a pickled object array is refused by NumPy itself).

Writes are atomic (``files.py``): a crash or a kill at any moment leaves either the old
checkpoint or the new one, never half of one.

Format versions: 1, the first; 2, the run folder's ``config.json`` records its version too, and
every option of ``numpy-transformer train`` is recorded (``runs/options.py``: a version-1 run
may lack ``model``); 3, ``early_stop`` is recorded (an older run never stopped early); 4, the
config's ``norm_eps`` (an older run's norms had their defaults) and ``kv_heads`` (an older
run had one kv head per query head); 5, ``init_from``, ``tokenizer``, ``vocab_size`` and
``stats_every`` are recorded (an older run started from its seed, on characters, without
tensor statistics); 6, the config's ``attn_dropout`` (an older run dropped no attention
weights). The layout above is the same in all. A file of an older version is read
as it is; ``runs.stored.read_run`` brings its run to today's format (each option a version did
not record takes the value that reproduces what it did). A file of a newer version is
refused, naming both versions.

Every problem found on loading raises :class:`CheckpointError` (a ``ValueError``) with one
line naming the file and the problem.
"""

from __future__ import annotations

import json
import math
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .files import atomic_write, check_file, os_error_naming
from .memory import check_fits, format_bytes
from .train import NonFiniteError

__all__ = ["FORMAT_VERSION", "CheckpointError", "Checkpoint", "save_checkpoint",
           "restamp_checkpoint", "load_checkpoint", "check_format_version", "dropout_layers",
           "rng_states", "set_rng_states"]

FORMAT_VERSION = 6  # what this version writes; it reads 1 to FORMAT_VERSION (see above)
JSON_KEYS = ("optimizer", "rng", "config", "options", "tokenizer", "meta")
REQUIRED_KEYS = ("format_version", "step") + JSON_KEYS
OPTIMIZER_KEYS = {"kind", "t", "lr", "beta1", "beta2", "eps", "weight_decay"}


class CheckpointError(ValueError):
    """A checkpoint file is missing, foreign, truncated, of another version or inconsistent."""


@dataclass
class Checkpoint:
    """The contents of a checkpoint file, decoded.

    ``params``, ``adam_m`` and ``adam_v`` map dotted parameter names to arrays; ``optimizer``
    holds Adam's scalars; ``rng`` maps a generator's name to its ``bit_generator.state``;
    ``version`` is the format version the file was written in.
    """

    step: int
    params: dict[str, np.ndarray]
    optimizer: dict
    adam_m: dict[str, np.ndarray]
    adam_v: dict[str, np.ndarray]
    rng: dict[str, dict]
    config: dict
    options: dict
    tokenizer: dict | None
    meta: dict = field(default_factory=dict)
    version: int = FORMAT_VERSION

    def optimizer_state(self) -> dict:
        """The dict ``Adam.load_state_dict`` takes."""
        o = self.optimizer
        return {"t": o["t"], "lr": o["lr"], "beta1": o["beta1"], "beta2": o["beta2"],
                "eps": o["eps"], "weight_decay": o["weight_decay"],
                "m": self.adam_m, "v": self.adam_v}


# --------------------------------------------------------------------------------------------
# Random generators of a model
# --------------------------------------------------------------------------------------------

def dropout_layers(module, prefix: str = "") -> dict:
    """Every Dropout module below ``module`` by dotted name (each owns a Generator)."""
    from .nn.layers import Dropout

    found = {prefix.rstrip("."): module} if isinstance(module, Dropout) else {}
    for name, child in module.children.items():
        found.update(dropout_layers(child, prefix + name + "."))
    return found


def rng_states(generators: dict[str, np.random.Generator]) -> dict[str, dict]:
    """``{name: generator.bit_generator.state}``: plain dicts of ints and strings (JSON-able;
    Python's ints carry PCG64's 128-bit state exactly)."""
    return {name: g.bit_generator.state for name, g in generators.items()}


def set_rng_states(generators: dict[str, np.random.Generator], states: dict[str, dict],
                   source: str = "checkpoint") -> None:
    """Restore every generator from ``states``; the names must match exactly.

    Raises
    ------
    CheckpointError
        If a generator has no saved state, a saved state has no generator, or a state is not
        one the generator's bit generator accepts.
    """
    missing = sorted(set(generators) - set(states))
    unexpected = sorted(set(states) - set(generators))
    if missing or unexpected:
        raise CheckpointError(f"{source}: random generator states do not match the run: "
                              f"missing {missing}, unexpected {unexpected}")
    for name, g in generators.items():
        try:
            g.bit_generator.state = states[name]
        except (TypeError, ValueError, KeyError) as e:
            raise CheckpointError(f"{source}: bad random generator state for {name!r}: {e}") \
                from None


# --------------------------------------------------------------------------------------------
# Saving
# --------------------------------------------------------------------------------------------

def first_non_finite(arrays: dict[str, np.ndarray]) -> str | None:
    """The name of the first float array of ``arrays`` holding a NaN or an infinity, or None."""
    return next((name for name, a in arrays.items()
                 if a.dtype.kind == "f" and not np.isfinite(a).all()), None)


def _json_array(value) -> np.ndarray:
    return np.array(json.dumps(value, sort_keys=True))  # 0-d '<U...' array, no pickle


def save_checkpoint(path: str | Path, *, step: int, model, optimizer, rng: dict[str, dict],
                    config: dict, options: dict, tokenizer: dict | None,
                    meta: dict | None = None) -> None:
    """Write a checkpoint atomically (see the module docstring for the layout).

    Parameters
    ----------
    path : path of the ``.npz`` file
    step : int
        Updates made so far.
    model : Module
        Its ``named_parameters`` are saved.
    optimizer : Adam or AdamW
        Its ``state_dict()`` is saved (moments as arrays, scalars as JSON).
    rng : dict of str to dict
        ``bit_generator.state`` of every generator (see :func:`rng_states`).
    config, options, meta : dict
        JSON-able dicts.
    tokenizer : dict or None
        ``CharTokenizer.to_dict()``.

    Raises
    ------
    NonFiniteError
        If a parameter or a moment holds a NaN or an infinity: such a checkpoint is never
        written (the file at ``path``, if any, is left as it was).
    OSError
        If the file cannot be written (``path`` is left as it was).
    """
    arrays: dict[str, np.ndarray] = {"format_version": np.array(FORMAT_VERSION),
                                     "step": np.array(int(step))}
    for name, param, _ in model.named_parameters():
        arrays["param." + name] = param
    state = optimizer.state_dict()
    for name, a in state["m"].items():
        arrays["adam_m." + name] = a
    for name, a in state["v"].items():
        arrays["adam_v." + name] = a
    bad = first_non_finite(arrays)
    if bad is not None:
        raise NonFiniteError(f"step {step}: {bad} holds NaN or infinity; not saved to {path}")
    scalars = {k: state[k] for k in ("t", "lr", "beta1", "beta2", "eps", "weight_decay")}
    scalars["kind"] = type(optimizer).__name__
    for key, value in (("optimizer", scalars), ("rng", rng), ("config", config),
                       ("options", options), ("tokenizer", tokenizer), ("meta", meta or {})):
        arrays[key] = _json_array(value)
    atomic_write(Path(path), lambda f: np.savez(f, **arrays))


def restamp_checkpoint(path: str | Path, options: dict, meta: dict) -> None:
    """Rewrite the checkpoint at ``path`` with the training options ``options`` and its meta
    entry updated by ``meta``; every array and every other entry stays as it was. An extended
    run (``train --resume RUN --steps N``) does this to the checkpoints it keeps, so they say
    what the run of N steps says.

    Raises
    ------
    CheckpointError
        As :func:`load_checkpoint`, for a file that is not a checkpoint.
    OSError
        If it cannot be read or written (the file is left as it was).
    """
    path = Path(path)
    arrays, _ = _read_arrays(path)
    old = _decode_json(path, "meta", arrays["meta"])
    if not isinstance(old, dict):
        raise CheckpointError(f"{path}: entry 'meta' should be a JSON object")
    arrays.update(options=_json_array(options), meta=_json_array({**old, **meta}))
    atomic_write(path, lambda f: np.savez(f, **arrays))


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------

def _decode_json(path: Path, key: str, a: np.ndarray):
    if a.shape != () or a.dtype.kind != "U":
        raise CheckpointError(f"{path}: entry {key!r} should be a JSON string, got "
                              f"{a.dtype} {a.shape}")
    return decode_json(a.item(), f"{path}: entry {key!r}")


def decode_json(text: str, source: str):
    """``json.loads(text)``; anything it cannot decode (invalid, nested 100,000 deep, an
    integer of 5,000 digits) raises :class:`CheckpointError` naming ``source``."""
    try:
        return json.loads(text)
    except ValueError as e:  # json.JSONDecodeError is one
        raise CheckpointError(f"{source} is not valid JSON ({e})") from None
    except RecursionError:
        raise CheckpointError(f"{source} is JSON nested too deeply to read") from None


def _scalar_int(path: Path, key: str, a: np.ndarray) -> int:
    if a.shape != () or a.dtype.kind not in "iu":
        raise CheckpointError(f"{path}: entry {key!r} should be an integer scalar, got "
                              f"{a.dtype} {a.shape}")
    return int(a)


def _check_members(path: Path, archive: zipfile.ZipFile) -> None:
    """Read only the headers: every member must be an ``.npy`` array of numbers or text whose
    header fits the bytes it holds, and all of them together must fit in memory; a header
    claiming 10^12 floats is refused before anything is allocated."""
    names = [info.filename for info in archive.infolist()]
    if "format_version.npy" not in names:
        raise CheckpointError(f"{path}: not a numpy_transformer checkpoint (no "
                              f"'format_version' entry)")
    total = 0
    for info in archive.infolist():
        if not info.filename.endswith(".npy"):
            raise CheckpointError(f"{path}: member {info.filename!r} is not an .npy array")
        key = info.filename[:-len(".npy")]
        with archive.open(info) as f:
            try:
                version = np.lib.format.read_magic(f)
                read = {(1, 0): np.lib.format.read_array_header_1_0,
                        (2, 0): np.lib.format.read_array_header_2_0}.get(version)
                if read is None:
                    raise ValueError(f"npy format version {version}")
                shape, _, dtype = read(f)
            except ValueError as e:
                raise CheckpointError(f"{path}: entry {key!r} has no valid .npy header "
                                      f"({e})") from None
        if dtype.kind not in "fiuU":
            raise CheckpointError(f"{path}: entry {key!r} holds {dtype} values; a checkpoint "
                                  f"holds numbers and text only")
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > info.file_size:
            raise CheckpointError(f"{path}: entry {key!r} claims shape {shape} "
                                  f"({format_bytes(nbytes)}) but holds {info.file_size} bytes")
        total += nbytes
    try:
        check_fits(lambda s: {"arrays": s["bytes"]}, {"bytes": total},
                   label=lambda _, n: f"{path} ({format_bytes(n)} of arrays)")
    except ValueError as e:
        raise CheckpointError(str(e)) from None


def check_format_version(version: object, source: str) -> int:
    """``version`` if this version of the library reads that format (1 to FORMAT_VERSION).

    Raises
    ------
    CheckpointError
        Naming ``source`` and, for a newer format, both versions.
    """
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CheckpointError(f"{source}: unknown format version {version!r}")
    if version > FORMAT_VERSION:
        raise CheckpointError(f"{source}: written in format version {version}, newer than "
                              f"this numpy_transformer reads (1 to {FORMAT_VERSION}); upgrade "
                              f"numpy_transformer to read it")
    return version


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read and check a checkpoint written by :func:`save_checkpoint`, of any format version
    from 1 to :data:`FORMAT_VERSION`.

    Only the file's own consistency is checked here (keys, version, JSON, shapes of the
    moments against the parameters); whether it fits a model is checked when it is loaded
    into one (``Module.load_state_dict``).

    Raises
    ------
    CheckpointError
        With one line naming the file and the problem: missing, not a ``.npz`` (or truncated),
        an ``.npz`` of someone else, a newer format version, a missing or malformed entry.
    """
    path = Path(path)
    arrays, version = _read_arrays(path)
    step = _scalar_int(path, "step", arrays["step"])
    decoded = _decode_entries(path, arrays)
    params, m, v = _parameter_groups(path, arrays)
    _check_values(path, arrays, decoded, m, v)
    return Checkpoint(step=step, params=params, optimizer=decoded["optimizer"], adam_m=m,
                      adam_v=v, rng=decoded["rng"], config=decoded["config"],
                      options=decoded["options"], tokenizer=decoded["tokenizer"],
                      meta=decoded["meta"], version=version)


def _read_arrays(path: Path) -> tuple[dict[str, np.ndarray], int]:
    """Every entry of the ``.npz`` at ``path`` and its format version, once the file, its
    members' headers, the version and the required keys are checked.

    The file is opened here, once: one that cannot be read raises the ``OSError`` it is
    (permission denied, named), which ``zipfile.is_zipfile`` would take for "not a zip"."""
    try:
        check_file(path, "checkpoint file")
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    try:
        with open(path, "rb") as f:
            return _read_open_archive(path, f)
    except OSError as e:  # opening or reading the file itself failed
        raise os_error_naming(path, e) from None


def _read_open_archive(path: Path, f) -> tuple[dict[str, np.ndarray], int]:
    """:func:`_read_arrays` of the file ``f``, open for reading."""
    if not zipfile.is_zipfile(f):
        raise CheckpointError(f"{path}: not a checkpoint (not an .npz archive, or truncated)")
    try:
        with zipfile.ZipFile(f) as archive:
            _check_members(path, archive)
        f.seek(0)
        with np.load(f, allow_pickle=False) as npz:
            names = list(npz.files)
            missing = [k for k in REQUIRED_KEYS if k not in names]
            version = check_format_version(
                _scalar_int(path, "format_version", npz["format_version"]), str(path))
            if missing:
                raise CheckpointError(f"{path}: checkpoint is missing entries {missing}")
            return {k: npz[k] for k in names}, version
    except CheckpointError:
        raise
    except (ValueError, EOFError, zipfile.BadZipFile, zlib.error, RuntimeError,
            NotImplementedError, OSError) as e:  # RuntimeError: encrypted; NotImplementedError:
        # packed. A truncated member, a pickled (object) array refused by allow_pickle=False,
        # an OSError of NumPy's without an errno... An OSError with one is the file's: exit 74.
        if isinstance(e, OSError) and e.errno:
            raise
        raise CheckpointError(f"{path}: unreadable checkpoint ({type(e).__name__}: {e})") \
            from None


def _decode_entries(path: Path, arrays: dict[str, np.ndarray]) -> dict:
    """The JSON entries, decoded; all but the tokenizer are objects, the optimizer's with
    its keys."""
    decoded = {k: _decode_json(path, k, arrays[k]) for k in JSON_KEYS}
    for k in ("optimizer", "rng", "config", "options", "meta"):
        if not isinstance(decoded[k], dict):
            raise CheckpointError(f"{path}: entry {k!r} should be a JSON object")
    if set(decoded["optimizer"]) != OPTIMIZER_KEYS:
        raise CheckpointError(f"{path}: entry 'optimizer' should have keys "
                              f"{sorted(OPTIMIZER_KEYS)}, got {sorted(decoded['optimizer'])}")
    return decoded


def _parameter_groups(path: Path, arrays: dict[str, np.ndarray]) -> tuple[dict, dict, dict]:
    """``(params, adam_m, adam_v)`` by parameter name: float arrays, the moments (if any)
    shaped like the parameters."""
    groups: dict[str, dict[str, np.ndarray]] = {"param": {}, "adam_m": {}, "adam_v": {}}
    for key, a in arrays.items():
        if key in REQUIRED_KEYS:
            continue
        prefix, _, name = key.partition(".")
        if prefix not in groups or not name:
            raise CheckpointError(f"{path}: unexpected entry {key!r}")
        if a.dtype not in (np.float32, np.float64):
            raise CheckpointError(f"{path}: entry {key!r} should be float32 or float64, got "
                                  f"{a.dtype}")
        groups[prefix][name] = a
    params, m, v = groups["param"], groups["adam_m"], groups["adam_v"]
    if not params:
        raise CheckpointError(f"{path}: checkpoint holds no parameters")
    if set(m) != set(v) or (m and set(m) != set(params)):
        odd = sorted((set(m) ^ set(params)) | (set(v) ^ set(params)))
        raise CheckpointError(f"{path}: optimizer moments do not match the parameters "
                              f"(differing names: {odd})")
    for name in m:
        for label, a in (("adam_m", m[name]), ("adam_v", v[name])):
            if a.shape != params[name].shape or a.dtype != params[name].dtype:
                raise CheckpointError(f"{path}: {label}.{name} is {a.dtype} {a.shape} but the "
                                      f"parameter is {params[name].dtype} {params[name].shape}")
    return params, m, v


def _check_values(path: Path, arrays: dict[str, np.ndarray], decoded: dict, m: dict,
                  v: dict) -> None:
    """The optimizer's step against its moments, finite arrays, second moments >= 0, and a
    tokenizer as large as the embedding table."""
    if (decoded["optimizer"]["t"] == 0) != (not m):
        raise CheckpointError(f"{path}: optimizer step t={decoded['optimizer']['t']} but "
                              f"{len(m)} moment arrays")
    bad = first_non_finite({k: a for k, a in arrays.items() if k not in REQUIRED_KEYS})
    if bad is not None:
        raise CheckpointError(f"{path}: {bad} holds NaN or infinity (did its run diverge?); "
                              f"such weights cannot be sampled from or trained on")
    negative = next((name for name, a in v.items() if (a < 0).any()), None)
    if negative is not None:
        raise CheckpointError(f"{path}: adam_v.{negative} holds negative second moments")
    tokenizer, vocab = decoded["tokenizer"], decoded["config"].get("vocab")
    size = None  # a CharTokenizer's characters, or what a BPETokenizer's dict says
    if isinstance(tokenizer, dict):
        size = len(tokenizer["chars"]) if isinstance(tokenizer.get("chars"), str) else \
            tokenizer.get("vocab_size") if isinstance(tokenizer.get("bpe"), str) else None
    # a BPE may have fewer ids than the table's rows (a vocabulary padded to a multiple, as
    # nanoGPT's 50,304 for GPT-2's 50,257); a character vocabulary is the table's
    padded = isinstance(tokenizer, dict) and "bpe" in tokenizer and isinstance(size, int) \
        and isinstance(vocab, int) and size <= vocab
    if tokenizer is not None and size != vocab and not padded:
        raise CheckpointError(f"{path}: the tokenizer does not match the embedding table of "
                              f"{vocab!r} tokens in the config")

"""Helpers shared by the experiment scripts: paths, threading, the backend, JSON, plots.

Every experiment is one command, ``python experiments/<name>.py``, run from anywhere. It
writes ``experiments/results/<name>.json`` and PNG figures next to it, and prints its numbers.

Importing this module first matters: it pins BLAS to one thread BEFORE numpy is imported.
On the shared 2-core machine a multi-threaded BLAS fighting another job was 5-10x slower
than one thread per process, and one thread per job keeps two jobs from stepping on each
other.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make the package importable without install
    sys.path.insert(0, str(ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = ROOT / "experiments" / "results"
DPI = 90  # with the figure sizes below this keeps each PNG around 30-100 KB


def pick_backend() -> str:
    """``"numba"`` when the fused attention kernel imports, else the NumPy reference.

    The kernel is checked against the reference in ``tests/test_nn_attention.py``; both
    compute the same function, the numba one is only faster.
    """
    try:
        import numpy_transformer.kernels.attention  # noqa: F401
    except Exception as e:  # numba missing or the kernel broken: fall back, say so
        print(f"numba backend unavailable ({type(e).__name__}: {e}); using numpy")
        return "numpy"
    return "numba"


class Timer:
    """Wall-clock seconds since construction: ``Timer().seconds``."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.start


def environment() -> dict:
    """What produced a result: Python, NumPy, machine, thread settings, and the load average
    (on a shared machine the wall time depends on it; ``cpu_seconds`` much less)."""
    return {"python": platform.python_version(), "numpy": np.__version__,
            "machine": platform.machine(), "cpus": os.cpu_count(),
            "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
            "load_average_1_5_15min": [round(x, 2) for x in os.getloadavg()]}


def save_json(name: str, payload: dict) -> Path:
    """Write ``results/<name>.json`` (with the environment added) and return its path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {**payload, "cpu_seconds": round(time.process_time(), 1),  # of this process
               "environment": environment()}
    path.write_text(json.dumps(payload, indent=2, default=_jsonable) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")
    return path


def _jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON-serialisable: {type(x).__name__}")


def save_figure(fig, name: str, dpi: int = DPI) -> Path:
    """Write ``results/<name>.png`` at a modest resolution and close the figure."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.png"
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    # A 256-colour palette is visually lossless for these plots and halves smooth heatmaps.
    from PIL import Image

    with Image.open(path) as im:
        small = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)
    print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size // 1024} KB)")
    return path


def smooth(y: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average (the first values average what exists so far)."""
    y = np.asarray(y, dtype=float)
    c = np.cumsum(np.insert(y, 0, 0.0))
    n = np.arange(1, len(y) + 1)
    lo = np.maximum(n - window, 0)
    return (c[n] - c[lo]) / (n - lo)


def plot_curves(ax, curves: dict[str, np.ndarray], window: int = 1, title: str = "",
                ylabel: str = "training loss") -> None:
    """Loss curves by step on one axis; with ``window > 1`` the raw curve is drawn faintly
    under its moving average."""
    for label, y in curves.items():
        steps = np.arange(1, len(y) + 1)
        if window > 1:
            line, = ax.plot(steps, y, alpha=0.2, lw=0.6)
            ax.plot(steps, smooth(y, window), color=line.get_color(), lw=1.4,
                    label=f"{label} ({window}-step mean)")
        else:
            ax.plot(steps, y, lw=1.2, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()


def plot_attention(ax, weights: np.ndarray, query_labels=None, key_labels=None,
                   title: str = "", vmax: float | None = 1.0):
    """One (T_q, T_k) attention map; rows are queries, columns keys. Returns the image."""
    im = ax.imshow(weights, cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto")
    for labels, set_ticks, set_labels, n in (
            (query_labels, ax.set_yticks, ax.set_yticklabels, weights.shape[0]),
            (key_labels, ax.set_xticks, ax.set_xticklabels, weights.shape[1])):
        if labels is not None:
            set_ticks(range(n))
            set_labels([str(s) for s in labels], fontsize=7)
    ax.set_title(title, fontsize=9)
    return im


def attention_grid(maps: np.ndarray, query_labels=None, key_labels=None,
                   row_names=None, suptitle: str = "", cell: float = 2.4):
    """A grid of maps (R, H, T_q, T_k): one row per block, one column per head."""
    rows, heads = maps.shape[:2]
    fig, axes = plt.subplots(rows, heads, figsize=(cell * heads, cell * rows + 0.4),
                             squeeze=False)
    for r in range(rows):
        for h in range(heads):
            name = f"{row_names[r]}, " if row_names else ""
            im = plot_attention(axes[r, h], maps[r, h], query_labels, key_labels,
                                title=f"{name}head {h}")
    fig.colorbar(im, ax=axes, shrink=0.6, label="attention weight")
    fig.suptitle(suptitle)
    return fig


def keep_attention(blocks, attr: str = "attn") -> None:
    """Ask every block's attention (``attr``: "attn" or "cross_attn") to keep its weights."""
    for block in blocks:
        getattr(block, attr).keep_weights = True


def collect_attention(blocks, attr: str = "attn") -> np.ndarray:
    """The kept weights of the last forward, stacked: (layers, B, H, T_q, T_k)."""
    return np.stack([getattr(block, attr).weights for block in blocks])

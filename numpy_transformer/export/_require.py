"""Optional packages of the exchange formats: a missing one is one line saying what to install."""

from __future__ import annotations

from importlib import import_module
from types import ModuleType


def require(module: str, purpose: str, extra: str = "hf") -> ModuleType:
    """Import ``module`` (e.g. ``"safetensors.numpy"``), or raise a one-line ``ImportError``.

    Parameters
    ----------
    module : str
        The dotted module name.
    purpose : str
        What it is needed for, for the message ("the safetensors export").
    extra : str
        The extra of ``setup.cfg`` that installs it.
    """
    try:
        return import_module(module)
    except ImportError:
        top = module.split(".")[0]
        raise ImportError(f"{purpose} needs the {top} package, which is not installed: "
                          f"pip install \"numpy_transformer[{extra}]\"") from None

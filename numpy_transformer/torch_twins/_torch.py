"""The one place the twins import torch: a missing torch is one line saying what to install."""

from __future__ import annotations

INSTALL_HINT = ('numpy_transformer.torch_twins needs PyTorch, which is not installed: '
                'pip install "numpy_transformer[torch]"')

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError:  # pragma: no cover - exercised by a subprocess test without torch
    raise ImportError(INSTALL_HINT) from None

__all__ = ["F", "nn", "torch"]

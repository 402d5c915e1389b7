"""Pure forward/backward pairs, no state: the math of the library, readable first.

Every ``*_forward`` returns ``(out, cache)`` and the matching ``*_backward(dout, cache)`` returns
one gradient per differentiable input. This package is NumPy and the standard library only:
nothing here is compiled, and nothing here knows the fast backend exists.

One file per concern: ``activations.py``, ``softmax.py`` (and cross-entropy), ``linear.py``,
``embedding.py``, ``norms.py``, ``positional.py`` (sinusoidal, RoPE, ALiBi), ``masks.py``,
``attention.py``, ``feedforward.py`` (linear, activation, linear), ``head_loss.py`` (the
output head and its cross-entropy), ``lstm.py``; ``adam.py``
holds the optimiser's update. Each file lists its public names in ``__all__``, and this
package is exactly those lists, read below (``F.layer_norm_forward`` is
``functional.norms.layer_norm_forward``); the ``"numpy"`` backend is the same names
(``numpy_transformer.backend``).
"""

import importlib
import pkgutil

__all__: list[str] = []
for _file in pkgutil.iter_modules(__path__):
    _module = importlib.import_module(f"{__name__}.{_file.name}")
    globals().update((name, getattr(_module, name)) for name in _module.__all__)
    __all__ += _module.__all__
__all__.sort()
del _file, _module, importlib, pkgutil

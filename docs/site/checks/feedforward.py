"""Check it yourself: the finite-difference check of functional/feedforward.py's pair.

Shown on the annotated reference with what it prints, run when the site is built
(``python docs/site/checks/feedforward.py`` runs it here).
"""

# %% feed_forward
import numpy as np

from numpy_transformer import functional as F
from numpy_transformer.gradcheck import check_op

rng = np.random.default_rng(0)
x = rng.normal(size=(2, 3, 4))
for activation in ("gelu", "swiglu"):  # an elementwise and a gated network
    names = ("gate", "up", "down") if activation == "swiglu" else ("up", "down")
    shapes = {"gate": (4, 8), "up": (4, 8), "down": (8, 4)}
    arrays = {"x": x, **{f"w_{n}": rng.normal(size=shapes[n]) for n in names},
              **{f"b_{n}": rng.normal(size=shapes[n][1]) for n in names}}

    def forward(x, *wb, names=names, activation=activation):
        weights = {n: (wb[i], wb[len(names) + i]) for i, n in enumerate(names)}
        return F.feed_forward_forward(x, weights, activation)

    def backward(dout, cache, names=names):
        dx, grads = F.feed_forward_backward(dout, cache)
        return (dx, *(grads[n][0] for n in names), *(grads[n][1] for n in names))

    print(check_op(forward, backward, arrays, title=f"feed-forward, {activation}"))

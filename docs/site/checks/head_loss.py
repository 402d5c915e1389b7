"""Check it yourself: the finite-difference check of functional/head_loss.py's pair.

Shown on the annotated reference with what it prints, run when the site is built
(``python docs/site/checks/head_loss.py`` runs it here).
"""

# %% linear_cross_entropy
import numpy as np

from numpy_transformer import functional as F
from numpy_transformer.gradcheck import check_op

rng = np.random.default_rng(0)
x, w, b = rng.normal(size=(2, 3, 6)), rng.normal(size=(6, 7)), rng.normal(size=7)
targets = rng.integers(0, 7, size=(2, 3))
targets[0, 0] = -100  # ignored: it counts neither in the mean nor in the gradient


def forward(x, w, b):  # the loss as a 0-d array: check_op multiplies it by a random G
    loss, cache = F.linear_cross_entropy_forward(x, w, b, targets)
    return np.array(loss), cache


print(check_op(forward, F.linear_cross_entropy_backward, {"x": x, "w": w, "b": b},
               title="output head and its loss (one target ignored)"))

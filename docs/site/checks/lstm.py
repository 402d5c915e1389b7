"""Check it yourself: the finite-difference check of functional/lstm.py's pair.

Shown on the annotated reference with what it prints, run when the site is built
(``python docs/site/checks/lstm.py`` runs it here).
"""

# %% lstm
import numpy as np

from numpy_transformer import functional as F
from numpy_transformer.gradcheck import check_op

rng = np.random.default_rng(0)
arrays = {"x": rng.normal(size=(2, 4, 3)), "h0": rng.normal(size=(2, 4)),
          "c0": rng.normal(size=(2, 4)), "w_ih": 0.5 * rng.normal(size=(3, 16)),
          "w_hh": 0.5 * rng.normal(size=(4, 16)), "b": rng.normal(size=16)}


def forward(*args):  # the output and the final state each get a random upstream gradient
    out, (h_t, c_t), cache = F.lstm_forward(*args)
    return (out, h_t, c_t), cache


print(check_op(forward, lambda g, cache: F.lstm_backward(*g, cache), arrays,
               title="lstm: 4 steps, an initial state, the final state used"))

"""Check it yourself: the finite-difference check of functional/positional.py's pair.

Shown on the annotated reference with what it prints, run when the site is built
(``python docs/site/checks/positional.py`` runs it here).
"""

# %% rope
import numpy as np

from numpy_transformer import functional as F
from numpy_transformer.gradcheck import check_op

x = np.random.default_rng(0).normal(size=(2, 2, 5, 4))  # (B, H, T, D)
cos, sin = F.rope_tables(5, 4)  # the rotation's tables are constants


def forward(x):  # rope_forward returns the rotated x alone: no cache to keep
    return F.rope_forward(x, cos, sin), None


print(check_op(forward, lambda dout, _: F.rope_backward(dout, cos, sin), {"x": x},
               title="rope"))

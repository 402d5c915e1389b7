"""Check it yourself: the finite-difference checks of functional/linear.py's pairs.

Shown on the annotated reference with what they print, run when the site is built
(``python docs/site/checks/linear.py`` runs them here).
"""

# %% linear
import numpy as np

from numpy_transformer import functional as F
from numpy_transformer.gradcheck import check_op

rng = np.random.default_rng(0)
x, w, b = rng.normal(size=(2, 3, 6)), rng.normal(size=(6, 5)), rng.normal(size=5)
print(check_op(F.linear_forward, F.linear_backward, {"x": x, "w": w, "b": b}, title="linear"))

# %% linear_heads
import numpy as np

from numpy_transformer import functional as F
from numpy_transformer.gradcheck import check_op

rng = np.random.default_rng(0)
x = rng.normal(size=(2, 3, 6))
wq, wk, bq, bk = (rng.normal(size=s) for s in ((6, 4), (6, 4), 4, 4))


def backward(dys, cache):
    dx, (dwq, dwk), (dbq, dbk) = F.linear_heads_backward(dys, cache)
    return dx, dwq, dwk, dbq, dbk


print(check_op(lambda x, wq, wk, bq, bk: F.linear_heads_forward(x, (wq, wk), (bq, bk), 2),
               backward, {"x": x, "wq": wq, "wk": wk, "bq": bq, "bk": bk},
               title="two projections split into 2 heads"))

"""Check it yourself: the finite-difference checks of functional/softmax.py's pairs.

Shown on the annotated reference with what they print, run when the site is built
(``python docs/site/checks/softmax.py`` runs them here).
"""

# %% softmax
import numpy as np

from numpy_transformer import functional as F
from numpy_transformer.gradcheck import check_op

x = np.random.default_rng(0).normal(size=(2, 3, 6))
print(check_op(F.softmax_forward, F.softmax_backward, {"x": x}, title="softmax"))

# %% cross_entropy
import numpy as np

from numpy_transformer import functional as F
from numpy_transformer.gradcheck import check_op

rng = np.random.default_rng(0)
logits, targets = rng.normal(size=(2, 3, 6)), rng.integers(0, 6, size=(2, 3))
targets[0, 0] = -100  # ignored


def forward(logits):  # the loss as a 0-d array: check_op multiplies it by a random G
    loss, cache = F.cross_entropy_forward(logits, targets)
    return np.array(loss), cache


print(check_op(forward, F.cross_entropy_backward, {"logits": logits},
               title="cross-entropy (one target ignored)"))

"""Check it yourself: the finite-difference checks of functional/norms.py's pairs.

Shown on the annotated reference with what they print, run when the site is built
(``python docs/site/checks/norms.py`` runs them here).
"""

# %% layer_norm
import numpy as np

from numpy_transformer import functional as F
from numpy_transformer.gradcheck import check_op

rng = np.random.default_rng(0)
x, w, b = rng.normal(size=(2, 3, 6)), rng.normal(size=6), rng.normal(size=6)
print(check_op(F.layer_norm_forward, F.layer_norm_backward, {"x": x, "w": w, "b": b},
               title="layernorm"))

# %% rms_norm
import numpy as np

from numpy_transformer import functional as F
from numpy_transformer.gradcheck import check_op

rng = np.random.default_rng(0)
x, w = rng.normal(size=(2, 3, 6)), rng.normal(size=6)
print(check_op(F.rms_norm_forward, F.rms_norm_backward, {"x": x, "w": w}, title="rmsnorm"))

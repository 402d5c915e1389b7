"""Check it yourself: the finite-difference checks of functional/activations.py's pairs.

Each ``# %% <stem>`` cell is shown on the annotated reference of the pair ``<stem>_forward`` /
``<stem>_backward`` with what it prints, run when the site is built. Run this file to see them
all: ``python docs/site/checks/activations.py``.
"""

# %% relu
import numpy as np

from numpy_transformer import functional as F
from numpy_transformer.gradcheck import check_op

x = np.random.default_rng(0).normal(size=(2, 3, 6))  # float64: the check differences in it
print(check_op(F.relu_forward, F.relu_backward, {"x": x}, title="relu"))

# %% gelu
import numpy as np

from numpy_transformer import functional as F
from numpy_transformer.gradcheck import check_op

x = np.random.default_rng(0).normal(size=(2, 3, 6))
print(check_op(F.gelu_forward, F.gelu_backward, {"x": x}, title="gelu (erf)"))

# %% gelu_tanh
import numpy as np

from numpy_transformer import functional as F
from numpy_transformer.gradcheck import check_op

x = np.random.default_rng(0).normal(size=(2, 3, 6))
print(check_op(F.gelu_tanh_forward, F.gelu_tanh_backward, {"x": x}, title="gelu (tanh)"))

# %% silu
import numpy as np

from numpy_transformer import functional as F
from numpy_transformer.gradcheck import check_op

x = np.random.default_rng(0).normal(size=(2, 3, 6))
print(check_op(F.silu_forward, F.silu_backward, {"x": x}, title="silu"))

# %% swiglu
import numpy as np

from numpy_transformer import functional as F
from numpy_transformer.gradcheck import check_op

rng = np.random.default_rng(0)
gate, up = rng.normal(size=(2, 3, 6)), rng.normal(size=(2, 3, 6))
print(check_op(F.swiglu_forward, F.swiglu_backward, {"gate": gate, "up": up}, title="swiglu"))

# %% dropout
import numpy as np

from numpy_transformer import functional as F
from numpy_transformer.gradcheck import check_op

x = np.random.default_rng(0).normal(size=(2, 3, 6))
# one mask for every call: the forward of the check must be the same function each time
print(check_op(lambda x: F.dropout_forward(x, 0.3, np.random.default_rng(1)),
               F.dropout_backward, {"x": x}, title="dropout, p = 0.3"))

"""Check it yourself: the finite-difference checks of functional/embedding.py's pairs.

Shown on the annotated reference with what they print, run when the site is built
(``python docs/site/checks/embedding.py`` runs them here).
"""

# %% embedding
import numpy as np

from numpy_transformer import functional as F
from numpy_transformer.gradcheck import check_op

ids = np.array([[0, 2, 2], [4, 2, 1]])  # id 2 three times: its rows of dout add up
table = np.random.default_rng(0).normal(size=(5, 4))
print(check_op(lambda t: F.embedding_forward(ids, t), F.embedding_backward,
               {"table": table}, title="embedding (repeated ids)"))

# %% embeddings
import numpy as np

from numpy_transformer import functional as F
from numpy_transformer.gradcheck import check_op

ids = np.array([[0, 2, 2], [4, 2, 1]])
table = np.random.default_rng(0).normal(size=(5, 4))
positions = F.sinusoidal_table(3, 4)
print(check_op(lambda t: F.embeddings_forward(ids, t, 2.0, positions),
               lambda d, cache: F.embeddings_backward(d, cache, 2.0),
               {"table": table}, title="embeddings, scaled by 2, sinusoidal positions"))

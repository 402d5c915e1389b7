"""Check it yourself: the finite-difference check of functional/attention.py's pair.

Shown on the annotated reference with what it prints, run when the site is built
(``python docs/site/checks/attention.py`` runs it here).
"""

# %% sdpa
import numpy as np

from numpy_transformer import functional as F
from numpy_transformer.gradcheck import check_op

rng = np.random.default_rng(0)
q = rng.normal(size=(2, 4, 5, 3))  # (B, H, T_q, D): 4 query heads
k, v = rng.normal(size=(2, 2, 5, 3)), rng.normal(size=(2, 2, 5, 3))  # 2 kv heads (GQA)
mask = F.combine_masks(F.causal_mask(5), F.key_padding_mask(np.array([5, 3]), 5))
bias = F.alibi_bias(4, 5, 5)  # (0)-(5) all at work: groups, scale, bias, mask, softmax
print(check_op(lambda q, k, v: F.sdpa_forward(q, k, v, mask, bias), F.sdpa_backward,
               {"q": q, "k": k, "v": v}, title="attention: causal + padding + ALiBi, GQA"))

"""Pure forward/backward pairs, no state: the math of the library, readable first.

Every ``*_forward`` returns ``(out, cache)`` and the matching ``*_backward(dout, cache)`` returns
one gradient per differentiable input. This package is NumPy and the standard library only:
nothing here is compiled, and nothing here knows the fast backend exists.

``fused.py`` writes out, as plain compositions of these pairs, the operations the compiled
backend fuses into one pass; ``adam.py`` holds the optimiser's update arithmetic.
"""

from .activations import (
    dropout_backward,
    dropout_forward,
    erf,
    gelu_backward,
    gelu_forward,
    gelu_tanh_backward,
    gelu_tanh_forward,
    relu_backward,
    relu_forward,
    silu_backward,
    silu_forward,
    swiglu_backward,
    swiglu_forward,
)
from .adam import adam_update, adam_update_group
from .attention import attention_weights, sdpa_backward, sdpa_forward
from .embedding import embedding_backward, embedding_forward
from .fused import (
    add_into,
    embeddings_backward,
    embeddings_forward,
    layer_norm_backward_residual,
    relu_ffn_backward,
    relu_ffn_forward,
    rms_norm_backward_residual,
)
from .linear import linear_backward, linear_forward, linear_heads_forward
from .lstm import lstm_backward, lstm_forward
from .masks import causal_mask, combine_masks, from_torch_ignore_mask, key_padding_mask
from .norms import layer_norm_backward, layer_norm_forward, rms_norm_backward, rms_norm_forward
from .positional import (
    alibi_bias,
    alibi_slopes,
    rope_backward,
    rope_forward,
    rope_tables,
    sinusoidal_table,
)
from .softmax import (
    cross_entropy_backward,
    cross_entropy_forward,
    log_softmax,
    softmax_backward,
    softmax_forward,
)

__all__ = [
    "adam_update", "adam_update_group", "add_into", "alibi_bias", "alibi_slopes",
    "attention_weights", "causal_mask", "combine_masks", "cross_entropy_backward",
    "cross_entropy_forward", "dropout_backward", "dropout_forward", "embedding_backward",
    "embedding_forward", "embeddings_backward", "embeddings_forward", "erf",
    "from_torch_ignore_mask", "gelu_backward", "gelu_forward", "gelu_tanh_backward",
    "gelu_tanh_forward", "key_padding_mask", "layer_norm_backward",
    "layer_norm_backward_residual", "layer_norm_forward", "linear_backward", "linear_forward",
    "linear_heads_forward", "log_softmax", "lstm_backward", "lstm_forward", "relu_backward",
    "relu_ffn_backward",
    "relu_ffn_forward", "relu_forward", "rms_norm_backward", "rms_norm_backward_residual",
    "rms_norm_forward", "rope_backward", "rope_forward", "rope_tables", "sdpa_backward",
    "sdpa_forward", "silu_backward", "silu_forward", "sinusoidal_table", "softmax_backward",
    "softmax_forward", "swiglu_backward", "swiglu_forward",
]

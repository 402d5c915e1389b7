"""Checkpoints made and initialised by ``transformers`` import with their own configs: the
same logits and the same gradients of the loss with respect to every weight.

GPT-2 with its stock config (``GPT2Config()``'s dropouts of 0.1 on the residuals, the
embeddings and the attention weights, ``gelu_new``, epsilon 1e-5; only the sizes made small),
in float64: they act in training only, so the imported model, in eval mode as
``from_pretrained`` returns it, agrees to float64 rounding (1e-12;
measured 3.4e-16 in the logits, 9.4e-16 in the worst gradient), and in training mode its
dropout acts. The loss is computed in float64 on both sides: ``transformers``' own
(``labels=``) casts the logits to float32 first.

``LlamaForCausalLM`` with ``num_key_value_heads`` < ``num_attention_heads`` (4 query heads, 2
kv heads: two groups, so which query head reads which kv head matters), saved with
``save_pretrained`` and read by ``load_hf``. Both sides compute in float32 (``transformers``
computes its RMSNorm, RoPE angles and softmax in float32 whatever the dtype), so they agree to
float32's error, which :func:`float32_tolerance` derives from the computation's sizes. A
negative control reads the kv heads in the other order (query head h reading kv head
h mod H_kv, ``np.tile`` instead of ``np.repeat``) and must miss that tolerance by far.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the Hugging Face checks need PyTorch")
transformers = pytest.importorskip("transformers", reason="the Hugging Face checks need "
                                   "transformers")
pytest.importorskip("safetensors", reason="the Hugging Face import needs safetensors")

from numpy_transformer import functional as F  # noqa: E402
from numpy_transformer.export import load_hf, to_hf_state  # noqa: E402
from numpy_transformer.functional import attention  # noqa: E402

B, T, V = 2, 12, 23
SIZES = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=48, num_hidden_layers=2)
U = np.finfo(np.float32).eps / 2  # float32's unit roundoff, 2^-24


def float32_tolerance(backward: bool) -> float:
    """A first-order bound on the normwise relative error of one float32 evaluation.

    Each matrix product or reduction of at most n terms has a relative error of at most
    gamma_n = n u / (1 - n u) (Higham, "Accuracy and Stability of Numerical Algorithms",
    section 3.1), and along a chain of ``depth`` such steps the errors add to first order.
    n is the longest reduction: the feed-forward width, or the B (T - 1) positions a weight
    gradient sums over; ``depth`` counts the steps in sequence: per block the norm, the q/k/v
    projection, the scores, their softmax, p v, the output projection, the gate and up
    projections with SiLU, and the down projection (8), plus the embedding, the final norm,
    the head and the loss; the backward walks the chain once more. Two implementations each
    within the bound of the truth are within twice it of each other. The bound is
    independent of the processor and its BLAS kernels (unlike a tolerance read off one
    machine), and it still lies orders of magnitude below the error of a wrong model (the
    negative control below).
    """
    n = max(SIZES["intermediate_size"], SIZES["hidden_size"], B * (T - 1))
    depth = SIZES["num_hidden_layers"] * 8 + 4
    depth *= 2 if backward else 1
    return 2 * depth * n * U / (1 - n * U)


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A random LlamaForCausalLM with grouped-query attention, saved; its norm gains moved
    off their init of ones (a gain swapped or dropped would otherwise hide)."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=V, max_position_embeddings=T, tie_word_embeddings=False,
        rms_norm_eps=1e-6,  # LLaMA's usual epsilon, which the import takes as norm_eps
        bos_token_id=None, eos_token_id=None, pad_token_id=None, **SIZES)
    model = transformers.LlamaForCausalLM(config).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    directory = tmp_path_factory.mktemp("llama-gqa")
    model.save_pretrained(directory)
    return model.eval(), directory


def tokens():
    return np.random.default_rng(1).integers(0, V, size=(B, T))


def hf_logits_and_grads(model, ids, loss_in_model_dtype: bool = False):
    """transformers' logits, loss and gradients. Its own loss (``labels=``) upcasts the
    logits to float32 (``ForCausalLMLoss``); ``loss_in_model_dtype`` computes the same loss
    in the model's dtype instead (float64 for GPT-2)."""
    model.zero_grad()
    ids_t = torch.from_numpy(ids)
    if loss_in_model_dtype:
        logits = model(ids_t).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V),
                                                 ids_t[:, 1:].reshape(-1))
    else:
        out = model(ids_t, labels=ids_t)
        logits, loss = out.logits, out.loss
    loss.backward()
    grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
    return logits.detach().numpy(), float(loss.detach()), grads


def our_logits_and_grads(model, ids, family: str = "llama"):
    """Logits, the loss of transformers' labels (position t predicts token t + 1), and every
    weight's gradient in transformers' names and layouts."""
    model.zero_grad()
    with model.enable_grad():  # in evaluation mode, as transformers': no dropout
        logits = model.forward(ids)
    targets = np.concatenate([ids[:, 1:], np.full((B, 1), -100)], axis=1)  # last: none
    loss, cache = F.cross_entropy_forward(logits, targets)
    model.backward(F.cross_entropy_backward(1.0, cache))
    for _, p, g in model.named_parameters():  # a gradient maps as its weight does
        p[...] = g
    return logits, float(loss), to_hf_state(model, family)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_a_grouped_query_llama_imports_with_its_logits_and_gradients(llama, backend):
    """Measured on one machine: logits 2.4e-7 (numpy) and 2.9e-7 (numba) apart, the worst
    gradient 8.5e-7, against bounds of 1.1e-4 and 2.3e-4."""
    hf_model, directory = llama
    imported = load_hf(directory, backend=backend)
    config = imported.model.config
    assert (config.heads, config.kv_heads, config.dtype) == (4, 2, "float32")
    assert config.norm_eps == 1e-6
    assert imported.model.decoder.blocks[0].attn.params["wk"].shape == (32, 16)  # (C, H_kv D)
    ids = tokens()
    theirs, their_loss, their_grads = hf_logits_and_grads(hf_model, ids)
    ours, our_loss, our_grads = our_logits_and_grads(imported.model, ids)
    forward_tol, backward_tol = float32_tolerance(False), float32_tolerance(True)
    assert rel(ours, theirs) <= forward_tol, f"logits: {rel(ours, theirs):.2e}"
    assert abs(our_loss - their_loss) <= forward_tol * their_loss
    assert set(our_grads) == set(their_grads)
    errors = {name: rel(our_grads[name], g) for name, g in their_grads.items()}
    worst = max(errors, key=errors.get)
    assert errors[worst] <= backward_tol, f"{worst}: {errors[worst]:.2e} > {backward_tol:.2e}"


def test_negative_control_kv_heads_read_in_the_other_order(llama, monkeypatch):
    """Query head h reading kv head h mod H_kv (``np.tile``) instead of h // G: the logits
    miss the tolerance a hundredfold, so agreeing above shows the grouping is LLaMA's."""
    hf_model, directory = llama
    imported = load_hf(directory, backend="numpy")
    ids = tokens()
    with torch.no_grad():
        theirs = hf_model(torch.from_numpy(ids)).logits.numpy()
    assert rel(imported.model.forward(ids), theirs) <= float32_tolerance(False)
    monkeypatch.setattr(attention, "repeat_kv", lambda x, heads: np.tile(
        x, (1, heads // x.shape[1], 1, 1)))
    assert rel(imported.model.forward(ids), theirs) > 100 * float32_tolerance(False)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A random GPT2LMHeadModel of the stock config but for its sizes, in float64, saved; its
    LayerNorm gains and shifts moved off their init."""
    torch.manual_seed(1)
    config = transformers.GPT2Config(vocab_size=V, n_positions=T, n_embd=32, n_layer=2,
                                     n_head=4, bos_token_id=None, eos_token_id=None)
    assert config.attn_pdrop == config.resid_pdrop == config.embd_pdrop == 0.1  # stock
    model = transformers.GPT2LMHeadModel(config).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln_" in name:
                p.add_(0.3 * torch.randn_like(p))
    directory = tmp_path_factory.mktemp("gpt2-stock")
    model.save_pretrained(directory)
    return model.eval(), directory


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_a_stock_gpt2_imports_with_its_dropouts_logits_and_gradients(gpt2, backend):
    hf_model, directory = gpt2
    imported = load_hf(directory, backend=backend)
    model, config = imported.model, imported.model.config
    assert (config.dropout, config.attn_dropout, config.dtype) == (0.1, 0.1, "float64")
    assert not model.training  # eval mode, as from_pretrained returns it
    ids = tokens()
    theirs, their_loss, their_grads = hf_logits_and_grads(hf_model, ids, True)
    ours, our_loss, our_grads = our_logits_and_grads(model, ids, "gpt2")
    assert rel(ours, theirs) <= 1e-12, f"logits: {rel(ours, theirs):.2e}"
    assert abs(our_loss - their_loss) <= 1e-12 * their_loss
    assert set(our_grads) == set(their_grads)
    errors = {name: rel(our_grads[name], g) for name, g in their_grads.items()}
    worst = max(errors, key=errors.get)
    assert errors[worst] <= 1e-12, f"{worst}: {errors[worst]:.2e}"
    # the dropouts act in training: logits move by far more than rounding
    assert rel(load_hf(directory, backend=backend).model.train().forward(ids), theirs) > 1e-2


def test_the_attention_dropout_goes_out_and_comes_back(gpt2, tmp_path):
    """Exported as attn_pdrop (GPT-2) and attention_dropout (LLaMA), read back as ours."""
    from numpy_transformer.export import save_hf

    imported = load_hf(gpt2[1], backend="numpy")
    save_hf(tmp_path / "gpt2", imported.model)
    assert transformers.AutoConfig.from_pretrained(tmp_path / "gpt2").attn_pdrop == 0.1
    assert load_hf(tmp_path / "gpt2").model.config.attn_dropout == 0.1
    llama = load_hf(saved_llama(tmp_path), backend="numpy").model
    assert llama.config.attn_dropout == 0.25
    save_hf(tmp_path / "llama", llama)
    assert transformers.AutoConfig.from_pretrained(tmp_path / "llama").attention_dropout == 0.25


def saved_llama(tmp_path):  # noqa: N802
    """A small LLaMA saved with attention_dropout=0.25."""
    config = transformers.LlamaConfig(vocab_size=V, max_position_embeddings=T,
                                      attention_dropout=0.25, bos_token_id=None,
                                      eos_token_id=None, pad_token_id=None, **SIZES)
    transformers.LlamaForCausalLM(config).float().save_pretrained(tmp_path / "llama-in")
    return tmp_path / "llama-in"

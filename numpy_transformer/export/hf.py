"""Hugging Face ``transformers`` directories: a ``DecoderLM`` as ``GPT2LMHeadModel`` or
``LlamaForCausalLM``, and back.

A model of GPT-2's shape or of LLaMA's shape is that architecture exactly, so a directory with
the family's ``config.json``, the weights under its names in ``model.safetensors`` and a
tokenizer is all ``transformers`` needs::

    AutoModelForCausalLM.from_pretrained(directory)     # GPT2LMHeadModel / LlamaForCausalLM
    pipeline("text-generation", model=directory)

========================  ==========================  =====================================
field of the config       GPT-2's shape               LLaMA's shape
========================  ==========================  =====================================
positions                 ``"learned"``               ``"rope"``
norm                      ``"layernorm"`` (eps 1e-5)  ``"rmsnorm"`` (eps: the dtype's)
activation                ``"gelu_tanh"`` (gelu_new)  ``"swiglu"`` (SiLU-gated)
norm_first                True (and a final norm)     True (and a final norm)
tie_embeddings            True                        either
bias                      True                        False
embed_scale               False                       False
dropout                   any (resid/embd_pdrop)      0
attn_dropout              any (``attn_pdrop``)        any (``attention_dropout``)
kv_heads                  None (multi-head)           any (``num_key_value_heads``)
========================  ==========================  =====================================

Where the two conventions differ, the export converts:

* **Weights.** GPT-2's ``Conv1D`` stores (C_in, C_out) as ours do, and its ``c_attn`` is our
  ``[wq | wk | wv]`` side by side; LLaMA's ``nn.Linear`` stores (C_out, C_in), transposed.
* **RoPE's pairs.** Ours rotates the feature pairs (2i, 2i+1) of each head (RoFormer, GPT-J);
  LLaMA in ``transformers`` rotates (i, i + D/2) ("rotate half"). Putting the rows of wq and
  wk of each head in the order 0, 2, 4, ..., 1, 3, 5, ... (:func:`rope_half_order`) turns one
  into the other: feature 2i becomes feature i and 2i+1 becomes i + D/2 in both queries and
  keys, and q . k is a sum over features, the same in any order. Values and outputs keep
  their order.
* **Grouped-query attention.** ``num_key_value_heads`` is our ``kv_heads``, and both read kv
  head h // (H / H_kv) for query head h (``transformers``' ``repeat_kv``): k_proj and v_proj
  are (H_kv D, C), k_proj's rows reordered per kv head as above.
* **Epsilons.** GPT-2's ``layer_norm_epsilon`` and LLaMA's ``rms_norm_eps`` are our config's
  ``norm_eps``; an import keeps the default (None) where the checkpoint's equals it (LayerNorm
  1e-5, RMSNorm ``np.finfo(dtype).eps``, as ``torch.nn.RMSNorm(eps=None)``).
  ``LlamaRMSNorm`` normalises in float32 whatever the dtype, so a float64 LLaMA agrees to
  float32 precision only.

Importing a directory (:func:`load_hf`) checks that its config is one of these shapes, with
the RoPE base of ours, and refuses it otherwise, naming the fields.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np

from .. import nn as ours
from ..allocator import release_freed_memory
from ..config import TransformerConfig
from ..data import CharTokenizer
from ..memory import parameter_count
from ..nn.layers import make_norm
from ._require import require
from .hf_tokenizer import load_tokenizer, save_tokenizer
from .safetensors_file import Exported, check_dtypes, read_header, read_tensors, write_tensors

ROPE_THETA = 10000.0  # the base of functional.positional.rope_tables, which attention uses
FAMILIES = {  # the config fields that make a DecoderLM one of the two architectures
    "gpt2": dict(positions="learned", norm="layernorm", activation="gelu_tanh",
                 norm_first=True, tie_embeddings=True, bias=True, embed_scale=False,
                 kv_heads=None),
    "llama": dict(positions="rope", norm="rmsnorm", activation="swiglu", norm_first=True,
                  bias=False, embed_scale=False, dropout=0.0),
}
_TITLES = {"gpt2": "GPT-2", "llama": "LLaMA"}
_ARCHITECTURES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}


def hf_family(model: ours.Module) -> str:
    """``"gpt2"`` or ``"llama"``: the ``transformers`` architecture ``model`` is.

    Raises
    ------
    ValueError
        If ``model`` is not a ``DecoderLM``, or its config fits neither family: one line
        listing, for each family, the fields that differ and the values it needs.
    """
    if not isinstance(model, ours.DecoderLM):
        raise ValueError(f"a Hugging Face export takes a DecoderLM, got {type(model).__name__}")
    config, differences = model.config, []
    for family, needs in FAMILIES.items():
        wrong = [f"{k}={v!r} (has {getattr(config, k)!r})" for k, v in needs.items()
                 if getattr(config, k) != v]
        if not wrong:
            return family
        differences.append(f"{_TITLES[family]} needs {', '.join(wrong)}")
    raise ValueError(f"this DecoderLM fits no Hugging Face family: {'; '.join(differences)}")


def rope_half_order(heads: int, head_width: int) -> np.ndarray:
    """Row order that turns our interleaved RoPE pairs into LLaMA's "rotate half" ones.

    Returns
    -------
    order : ndarray of int, shape (heads * head_width,)
        ``hf_rows = our_rows[order]`` for the rows of q_proj/k_proj: within each head the even
        features first, then the odd ones. ``np.argsort(order)`` undoes it.
    """
    within = np.concatenate([np.arange(0, head_width, 2), np.arange(1, head_width, 2)])
    return (np.arange(heads)[:, None] * head_width + within).reshape(-1)


def _norm_eps(norm: ours.LayerNorm | ours.RMSNorm, dtype: np.dtype) -> float:
    return float(np.finfo(dtype).eps) if norm.eps is None else float(norm.eps)


# ============================================================================ weights
def _renames(family: str, config: TransformerConfig) -> list[tuple[str, str, bool]]:
    """``(our name, HF name, transposed?)`` of every tensor that maps one to one."""
    if family == "gpt2":
        pairs = [("decoder.embed.tokens.table", "transformer.wte.weight"),
                 ("decoder.embed.positions.table", "transformer.wpe.weight"),
                 ("decoder.final_norm.w", "transformer.ln_f.weight"),
                 ("decoder.final_norm.b", "transformer.ln_f.bias")]
        for i in range(config.layers):
            ours_, hf = f"decoder.blocks.{i}.", f"transformer.h.{i}."
            pairs += [(ours_ + a, hf + b) for a, b in (
                ("norm1.w", "ln_1.weight"), ("norm1.b", "ln_1.bias"),
                ("attn.wo", "attn.c_proj.weight"), ("attn.bo", "attn.c_proj.bias"),
                ("norm2.w", "ln_2.weight"), ("norm2.b", "ln_2.bias"),
                ("ffn.up.w", "mlp.c_fc.weight"), ("ffn.up.b", "mlp.c_fc.bias"),
                ("ffn.down.w", "mlp.c_proj.weight"), ("ffn.down.b", "mlp.c_proj.bias"))]
        return [(a, b, False) for a, b in pairs]  # Conv1D: (C_in, C_out), as ours
    pairs = [("decoder.embed.tokens.table", "model.embed_tokens.weight", False),
             ("decoder.final_norm.w", "model.norm.weight", False)]
    if not config.tie_embeddings:
        pairs.append(("head.w", "lm_head.weight", True))
    for i in range(config.layers):
        ours_, hf = f"decoder.blocks.{i}.", f"model.layers.{i}."
        pairs += [(ours_ + a, hf + b, t) for a, b, t in (
            ("norm1.w", "input_layernorm.weight", False),
            ("attn.wq", "self_attn.q_proj.weight", True),
            ("attn.wk", "self_attn.k_proj.weight", True),
            ("attn.wv", "self_attn.v_proj.weight", True),
            ("attn.wo", "self_attn.o_proj.weight", True),
            ("norm2.w", "post_attention_layernorm.weight", False),
            ("ffn.gate.w", "mlp.gate_proj.weight", True),
            ("ffn.up.w", "mlp.up_proj.weight", True),
            ("ffn.down.w", "mlp.down_proj.weight", True))]
    return pairs


def _rope_rows(family: str, config: TransformerConfig) -> dict[str, np.ndarray]:
    """HF name -> the row order of that tensor (LLaMA's q and k projections, of H and H_kv
    heads)."""
    if family != "llama":
        return {}
    d = config.width // config.heads
    orders = {"q": rope_half_order(config.heads, d),
              "k": rope_half_order(config.kv_heads or config.heads, d)}
    return {f"model.layers.{i}.self_attn.{p}_proj.weight": order
            for i in range(config.layers) for p, order in orders.items()}


def to_hf_state(model: ours.DecoderLM, family: str) -> dict[str, np.ndarray]:
    """The model's weights under the family's ``transformers`` names and layouts."""
    params = {name: p for name, p, _ in model.named_parameters()}
    config = model.config
    state = {hf: np.ascontiguousarray(params[name].T if t else params[name])
             for name, hf, t in _renames(family, config)}
    for hf, order in _rope_rows(family, config).items():
        state[hf] = np.ascontiguousarray(state[hf][order])
    if family == "gpt2":  # c_attn = [wq | wk | wv], (C, 3C), and its bias likewise
        for i in range(config.layers):
            a = f"decoder.blocks.{i}.attn."
            state[f"transformer.h.{i}.attn.c_attn.weight"] = np.concatenate(
                [params[a + "wq"], params[a + "wk"], params[a + "wv"]], axis=1)
            state[f"transformer.h.{i}.attn.c_attn.bias"] = np.concatenate(
                [params[a + "bq"], params[a + "bk"], params[a + "bv"]])
    return state


def from_hf_state(state: dict[str, np.ndarray], config: TransformerConfig,
                  family: str) -> dict[str, np.ndarray]:
    """The inverse of :func:`to_hf_state`: our dotted names and layouts.

    Raises
    ------
    ValueError
        If a tensor is missing or unexpected (a tied ``lm_head.weight`` is allowed and
        ignored: it is the token table).
    """
    pairs = _renames(family, config)
    expected = {hf for _, hf, _ in pairs}
    if family == "gpt2":
        expected |= {f"transformer.h.{i}.attn.c_attn.{k}" for i in range(config.layers)
                     for k in ("weight", "bias")}
    given = set(state) - ({"lm_head.weight"} if config.tie_embeddings else set())
    missing, unexpected = sorted(expected - given), sorted(given - expected)
    if missing or unexpected:
        raise ValueError(f"the weights do not fit the config: missing {missing}, "
                         f"unexpected {unexpected}")
    state = dict(state)
    for hf, order in _rope_rows(family, config).items():
        state[hf] = state[hf][np.argsort(order)]
    params = {name: state[hf].T if t else state[hf] for name, hf, t in pairs}
    if family == "gpt2":
        for i in range(config.layers):
            a, h = f"decoder.blocks.{i}.attn.", f"transformer.h.{i}.attn.c_attn."
            for n, w, b in zip("qkv", np.split(state[h + "weight"], 3, axis=1),
                               np.split(state[h + "bias"], 3), strict=True):
                params[a + "w" + n], params[a + "b" + n] = w, b
    return params


# ============================================================================ configs
def _hf_config(model: ours.DecoderLM, family: str):
    """The ``transformers`` config object of the family for ``model``."""
    transformers = require("transformers", "the Hugging Face export")
    c, dtype = model.config, np.dtype(model.config.dtype)
    common = dict(vocab_size=c.vocab, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                  dtype=dtype.name, architectures=[_ARCHITECTURES[family]])
    if family == "gpt2":
        return transformers.GPT2Config(
            n_positions=c.max_len, n_embd=c.width, n_layer=c.layers, n_head=c.heads,
            n_inner=c.ffn_width, activation_function="gelu_new", resid_pdrop=c.dropout,
            embd_pdrop=c.dropout, attn_pdrop=c.attn_dropout,
            layer_norm_epsilon=_norm_eps(model.decoder.final_norm, dtype),
            tie_word_embeddings=True, **common)
    return transformers.LlamaConfig(
        hidden_size=c.width, intermediate_size=c.ffn_width, num_hidden_layers=c.layers,
        num_attention_heads=c.heads, num_key_value_heads=c.kv_heads or c.heads,
        head_dim=c.width // c.heads,
        max_position_embeddings=c.max_len, hidden_act="silu", attention_bias=False,
        mlp_bias=False, attention_dropout=c.attn_dropout,
        rms_norm_eps=_norm_eps(model.decoder.final_norm, dtype),
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        tie_word_embeddings=c.tie_embeddings, **common)


def _our_config(hf, dtype: str, backend: str | None) -> TransformerConfig:
    """The TransformerConfig of ``hf`` (a transformers config), its norm epsilon included;
    ValueError listing the fields of ``hf`` that no model of ours has."""
    family, odd = hf.model_type, []
    if family == "gpt2":
        fields = dict(vocab=hf.vocab_size, width=hf.n_embd, heads=hf.n_head, layers=hf.n_layer,
                      ffn_width=hf.n_inner or 4 * hf.n_embd, max_len=hf.n_positions,
                      dropout=hf.resid_pdrop, attn_dropout=hf.attn_pdrop)
        needs = dict(activation_function=("gelu_new", "gelu_pytorch_tanh"),
                     tie_word_embeddings=(True,),
                     embd_pdrop=(hf.resid_pdrop,), scale_attn_weights=(True,),
                     scale_attn_by_inverse_layer_idx=(False,), add_cross_attention=(False,))
        eps = hf.layer_norm_epsilon
    elif family == "llama":
        fields = dict(vocab=hf.vocab_size, width=hf.hidden_size, heads=hf.num_attention_heads,
                      layers=hf.num_hidden_layers, ffn_width=hf.intermediate_size,
                      max_len=hf.max_position_embeddings,
                      tie_embeddings=hf.tie_word_embeddings,
                      attn_dropout=float(hf.attention_dropout),
                      # as many kv heads as heads is multi-head attention: ours None
                      kv_heads=None if hf.num_key_value_heads == hf.num_attention_heads
                      else hf.num_key_value_heads)
        rope = dict(hf.rope_parameters or {})
        needs = dict(hidden_act=("silu",), attention_bias=(False,), mlp_bias=(False,),
                     head_dim=(hf.hidden_size // hf.num_attention_heads,),
                     pretraining_tp=(1,))
        if rope.get("rope_type", "default") != "default" or rope.get("rope_theta") != ROPE_THETA:
            odd.append(f"rope_parameters={rope!r} (ours: default RoPE, theta {ROPE_THETA})")
        eps = hf.rms_norm_eps
    else:
        raise ValueError(f"model_type {family!r} is neither 'gpt2' nor 'llama'")
    odd = [f"{k}={getattr(hf, k, None)!r} (ours: {' or '.join(map(repr, v))})"
           for k, v in needs.items() if getattr(hf, k, None) not in v] + odd
    if odd:
        raise ValueError(f"this {_TITLES[family]} config has no model here: {'; '.join(odd)}")
    overrides = {} if backend is None else {"backend": backend}
    config = TransformerConfig(**{**FAMILIES[family], **fields, "dtype": dtype, **overrides})
    default = _norm_eps(make_norm(config.norm, 1, dtype=np.dtype(dtype)), np.dtype(dtype))
    if not math.isclose(eps, default, rel_tol=1e-6):  # else the config keeps the default
        config = dataclasses.replace(config, norm_eps=float(eps))
    return config.validate()


# ============================================================================ directories
def save_hf(directory: str | Path, model: ours.DecoderLM,
            tokenizer: CharTokenizer | None = None) -> str:
    """Write a ``transformers`` directory: ``config.json``, ``model.safetensors`` and, with a
    tokenizer, ``tokenizer.json`` and ``tokenizer_config.json``.

    Parameters
    ----------
    directory : path (created if needed; these files in it are replaced)
    model : DecoderLM of GPT-2's or LLaMA's shape (see the module docstring)
    tokenizer : CharTokenizer, optional
        Without one, ``pipeline("text-generation")`` has nothing to read text with.

    Returns
    -------
    family : str
        ``"gpt2"`` or ``"llama"``.

    Raises
    ------
    ValueError
        If the model fits neither family (one line listing the fields that differ).
    """
    family = hf_family(model)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _hf_config(model, family).save_pretrained(str(directory))
    write_tensors(directory / "model.safetensors", to_hf_state(model, family),
                  {"format": "pt"}, "the Hugging Face export")  # transformers' own metadata
    if tokenizer is not None:
        save_tokenizer(directory, tokenizer)
    return family


def _transformers_config(directory: Path):
    """The ``transformers`` config of ``directory``'s ``config.json``, or ``ValueError`` in one
    line saying why it is none."""
    transformers = require("transformers", "the Hugging Face import")
    try:
        return transformers.AutoConfig.from_pretrained(str(directory))
    except Exception as e:  # transformers' own errors for a config it cannot read
        reason = " ".join(line.strip() for line in str(e).splitlines())  # one line
        raise ValueError(f"{directory / 'config.json'}: not a transformers config "
                         f"({type(e).__name__}: {reason})") from None


def load_hf(directory: str | Path, backend: str | None = None) -> Exported:
    """Read a ``transformers`` directory of GPT-2's or LLaMA's shape into a ``DecoderLM``.

    Parameters
    ----------
    directory : path
        Written by :func:`save_hf`, or by ``save_pretrained`` of such a model (fine-tuned
        with ``transformers``, say), with a single ``model.safetensors``.
    backend : str, optional
        The model's backend; default ``config.DEFAULT_BACKEND``.

    Returns
    -------
    exported : Exported
        The model, in evaluation mode (as ``from_pretrained`` returns one) and in the dtype of
        its float32/float64 weights; its tokenizer if the directory holds one: a character
        vocabulary as :func:`save_hf` writes it, or a byte-level BPE (GPT-2's, LLaMA's, ids
        unchanged; fewer ids than the model's embedding rows are fine), else None;
        ``info = {"family": ...}``.

    Raises
    ------
    ValueError
        One line naming the directory: no config or weights, a config of another shape (the
        fields are listed), weights of another dtype or that do not fit, a tokenizer that is
        neither characters nor byte-level BPE or has more ids than the model has rows.
    """
    directory = Path(directory)
    weights = directory / "model.safetensors"
    if not (directory / "config.json").is_file() or not weights.is_file():
        raise ValueError(f"{directory}: not a Hugging Face model directory with config.json "
                         f"and model.safetensors")
    _, header = read_header(weights, "the Hugging Face import")
    dtype = check_dtypes(weights, header)
    hf = _transformers_config(directory)
    try:
        config = _our_config(hf, dtype, backend)
        held, wanted = sum(math.prod(shape) for _, shape in header.values()), parameter_count(
            config)
        if wanted > held:  # before the model is built: the header's sizes cost no memory
            raise ValueError(f"model.safetensors holds {held:,} numbers, fewer than the "
                             f"{wanted:,} weights of its config's model")
        tokenizer = load_tokenizer(directory)
        if tokenizer is not None and tokenizer.vocab_size > config.vocab:
            raise ValueError(f"its tokenizer has {tokenizer.vocab_size:,} ids, more than the "
                             f"model's {config.vocab:,} embedding rows")
        model = ours.DecoderLM(config)
        release_freed_memory()  # the float64 draws of its init, before the weights come in
        model.load_state_dict(from_hf_state(read_tensors(weights, "the Hugging Face import"),
                                            config, hf.model_type))
    except (ValueError, TypeError, KeyError, AttributeError, json.JSONDecodeError) as e:
        raise ValueError(f"{directory}: {e}") from None
    model.eval()  # as transformers' from_pretrained returns it: dropout off
    return Exported(model, tokenizer, {"family": hf.model_type})

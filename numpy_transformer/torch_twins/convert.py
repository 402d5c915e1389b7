"""Our models to their twins and back, weights and Adam's state alike.

* :func:`to_torch` -- the twin of any of our modules, holding a copy of its weights.
* :func:`from_torch` -- one of our models from a model twin, holding the twin's weights.
* :func:`adam_to_torch`, :func:`adam_from_torch` -- Adam's moments, step count and
  hyperparameters into a ``torch.optim.Adam``/``AdamW`` over the twin's parameters, and back,
  so that training continues where it stopped: the next update is the same in both.

Names and layouts come from ``numpy_transformer.interop`` (one map, used for the weights and
for the moments, which have their parameter's shape).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .. import interop
from .. import nn as ours
from ..config import DEFAULT_BACKEND, LSTMConfig, TransformerConfig
from ..optim import Adam, AdamW
from . import modules
from ._torch import nn, torch
from .ops import TORCH_DTYPES

_MODELS = ("EncoderClassifier", "DecoderLM", "EncoderDecoder", "LSTMLM")


# ============================================================================ weights
def _norm_name(norm) -> str:
    return "layernorm" if isinstance(norm, ours.LayerNorm) else "rmsnorm"


def _block_kwargs(block) -> dict:
    attn = block.attn
    return dict(kv_heads=attn.kv_heads, norm=_norm_name(block.norm1),
                activation=block.ffn.activation,
                norm_first=block.norm_first, dropout=block.drop1.p,
                attn_dropout=0.0 if attn.drop is None else attn.drop.p, rope=attn.rope,
                alibi=attn.alibi, max_len=attn.max_len, bias=attn.bias)


def twin_class(name: str) -> type[nn.Module]:
    """The twin class of one of our model families, by its name (``"DecoderLM"``, ...).

    Raises
    ------
    ValueError
        If ``name`` is not one of the model families.
    """
    if name not in _MODELS:
        raise ValueError(f"no twin for a model of kind {name!r}; the kinds are {_MODELS}")
    return getattr(modules, name)


def build_twin(module: ours.Module) -> nn.Module:
    """An untrained twin with the architecture of ``module`` (weights not copied).

    Raises
    ------
    ValueError
        If ``module`` has no twin (a ``Dropout``, a ``ModuleList``, a ``TiedOutput``...).
    """
    if isinstance(module, (ours.EncoderClassifier, ours.DecoderLM, ours.EncoderDecoder,
                           ours.LSTMLM)):
        return twin_class(type(module).__name__)(module.config)
    if isinstance(module, ours.Linear):
        c_in, c_out = module.params["w"].shape
        return nn.Linear(c_in, c_out, bias="b" in module.params)
    if isinstance(module, ours.LSTM):
        c_in = module.params["w_ih_l0"].shape[0]
        return nn.LSTM(c_in, module.hidden, module.layers, batch_first=True)
    if isinstance(module, ours.Embedding):
        return nn.Embedding(*module.params["table"].shape)
    if isinstance(module, ours.LayerNorm):
        return nn.LayerNorm(module.params["w"].shape[0], eps=module.eps)
    if isinstance(module, ours.RMSNorm):
        return nn.RMSNorm(module.params["w"].shape[0], eps=module.eps)
    if isinstance(module, ours.FeedForward):
        width, hidden = module.up.params["w"].shape
        return modules.FeedForward(width, hidden, module.activation, "b" in module.up.params)
    if isinstance(module, ours.MultiHeadAttention):
        return modules.MultiHeadAttention(module.width, module.heads,
                                          kv_heads=module.kv_heads, rope=module.rope,
                                          alibi=module.alibi, max_len=module.max_len,
                                          bias=module.bias,
                                          dropout=0.0 if module.drop is None else module.drop.p)
    if isinstance(module, ours.SinusoidalPositions):
        return modules.SinusoidalPositions(module.max_len, module.width)
    if isinstance(module, ours.LearnedPositions):
        return modules.LearnedPositions(module.max_len, module.width)
    if isinstance(module, (ours.EncoderBlock, ours.DecoderBlock)):
        width, ffn_width = module.ffn.up.params["w"].shape
        heads = module.attn.heads
        if isinstance(module, ours.EncoderBlock):
            return modules.EncoderBlock(width, heads, ffn_width, **_block_kwargs(module))
        return modules.DecoderBlock(width, heads, ffn_width, cross=module.cross,
                                    **_block_kwargs(module))
    raise ValueError(f"no twin for {type(module).__name__}")


def dtype_of(module: ours.Module) -> np.dtype:
    """The dtype of the module's first parameter (or buffer; float64 if it has neither)."""
    for _, p, _ in module.named_parameters():
        return p.dtype
    for b in module.buffers.values():
        return b.dtype
    return np.dtype(np.float64)


def to_torch(module: ours.Module) -> nn.Module:
    """The twin of ``module`` in its dtype, holding a copy of its weights.

    Parameters
    ----------
    module : Module
        A model (``EncoderClassifier``, ``DecoderLM``, ``EncoderDecoder``, ``LSTMLM``), a
        block or a layer.

    Returns
    -------
    twin : torch.nn.Module
        On the CPU, in training mode. Move it as any module: ``twin.to("cuda")``.
    """
    twin = build_twin(module).to(TORCH_DTYPES[dtype_of(module)])
    state = {k: torch.from_numpy(a) for k, a in interop.to_torch_state_dict(module).items()}
    twin.load_state_dict(state, strict=True)
    return twin


def from_torch(twin: nn.Module, backend: str | None = None) -> ours.Module:
    """One of our models holding a copy of a model twin's weights (the inverse of
    :func:`to_torch` for models).

    Parameters
    ----------
    twin : EncoderClassifier, DecoderLM, EncoderDecoder or LSTMLM of this package
        Unwrap a ``DistributedDataParallel`` first (``ddp.module``).
    backend : str, optional
        The new model's backend; default the one in ``twin.config``.

    Returns
    -------
    model : Module
        Of the same family and config, in the dtype of the twin's parameters (float32 or
        float64), in training mode.

    Raises
    ------
    ValueError
        If ``twin`` is not a model twin, its ``config`` is not its family's (a
        ``TransformerConfig``, an ``LSTMConfig`` for an ``LSTMLM``), its parameters hold no
        values (the meta device), are not float32 or float64, or are not finite.
    """
    name = type(twin).__name__
    if name not in _MODELS or not isinstance(twin, twin_class(name)):
        raise ValueError(f"from_torch takes a model twin ({', '.join(_MODELS)}), got {name}; "
                         f"for a layer use interop.from_torch_state_dict(layer, "
                         f"twin.state_dict())")
    config_class = LSTMConfig if name == "LSTMLM" else TransformerConfig
    if not isinstance(getattr(twin, "config", None), config_class):
        raise ValueError(f"the {name} twin's config must be a {config_class.__name__}, got "
                         f"{type(getattr(twin, 'config', None)).__name__}")
    meta = next((n for n, p in twin.named_parameters() if p.is_meta), None)
    if meta is not None:
        raise ValueError(f"the twin's parameter {meta} is on the meta device and holds no "
                         f"values; materialise the twin first (twin.to_empty(device='cpu'), "
                         f"then load its weights)")
    dtypes = {p.dtype for p in twin.parameters()}
    by_torch = {t: np.dtype(d).name for d, t in TORCH_DTYPES.items()}
    if len(dtypes) != 1 or next(iter(dtypes)) not in by_torch:
        raise ValueError(f"the twin's parameters must all be float32 or all float64, got "
                         f"{sorted(str(d) for d in dtypes)}")
    bad = next((n for n, p in twin.named_parameters() if not p.detach().isfinite().all()),
               None)
    if bad is not None:
        raise ValueError(f"the twin's parameter {bad} holds NaN or infinite values")
    config = replace(twin.config, dtype=by_torch[next(iter(dtypes))],
                     backend=twin.config.backend if backend is None else backend)
    model = getattr(ours, name)(config)
    interop.from_torch_state_dict(model, twin.state_dict())
    return model


def _twin_parameters(twin: nn.Module, model: ours.Module) -> dict:
    """The twin's parameters by torch name, once every parameter of ``model`` has its
    namesake there (``ValueError`` naming the first that does not: a twin of another model)."""
    twin_params = dict(twin.named_parameters())
    absent = [t for t, _ in interop.torch_names(model).values() if t not in twin_params]
    if absent:
        raise ValueError(f"the twin ({type(twin).__name__}) has no parameter {absent[0]!r} of "
                         f"the {type(model).__name__}: pass the twin of this model "
                         f"(to_torch(model))")
    return twin_params


def gradient_pairs(module: ours.Module, twin: nn.Module):
    """Yield ``(our name, our grad, twin grad in our layout)`` for every parameter."""
    grads = {name: g for name, _, g in module.named_parameters()}
    twin_params = dict(twin.named_parameters())
    for name, (torch_name, transpose) in interop.torch_names(module).items():
        tg = twin_params[torch_name].grad
        tg = np.zeros(grads[name].shape[::-1] if transpose else grads[name].shape) \
            if tg is None else tg.detach().numpy()
        yield name, grads[name], tg.T if transpose else tg


# ============================================================================ Adam's state
def adam_to_torch(optimizer: Adam, model: ours.Module,
                  twin: nn.Module) -> torch.optim.Adam | torch.optim.AdamW:
    """A torch optimiser over ``twin``'s parameters that continues ``optimizer``'s run.

    Parameters
    ----------
    optimizer : Adam or AdamW
        Ours, after any number of steps on ``model``'s parameters.
    model : Module
        The model ``optimizer`` trains (for the names of its parameters).
    twin : torch.nn.Module
        ``to_torch(model)``, or any twin with the same parameters (after
        ``DistributedDataParallel``, pass ``ddp.module``).

    Returns
    -------
    torch_optimizer : torch.optim.Adam or torch.optim.AdamW
        Same class, learning rate, betas and eps. Our decay rule becomes two parameter groups:
        the decayed parameters with ``weight_decay``, the others with 0 (torch's own default
        decays every parameter of a group). Each parameter's state holds our moments (linear
        weights' transposed like the weights) and our step count, so torch's next update is
        the one ours would make.

    Raises
    ------
    ValueError
        If ``twin`` is not the twin of ``model`` (a parameter of it is absent), or the
        optimiser's moments are not those of ``model``'s parameters.
    """
    torch_class = torch.optim.AdamW if optimizer.decoupled else torch.optim.Adam
    names = interop.torch_names(model)
    params = {name: p for name, p, _ in model.named_parameters()}
    twin_params = _twin_parameters(twin, model)
    decayed = {n for n in names if optimizer.weight_decay and optimizer.decays(n, params[n])}
    groups = [{"params": [twin_params[names[n][0]] for n in names if (n in decayed) == d],
               "weight_decay": optimizer.weight_decay if d else 0.0} for d in (True, False)]
    torch_opt = torch_class([g for g in groups if g["params"]], lr=optimizer.lr,
                            betas=optimizer.betas, eps=optimizer.eps)
    if optimizer.t:
        m = interop.to_torch_layout(model, optimizer.m)
        v = interop.to_torch_layout(model, optimizer.v)
        for torch_name, p in twin_params.items():
            torch_opt.state[p] = {
                "step": torch.tensor(float(optimizer.t)),  # torch counts per parameter
                "exp_avg": torch.from_numpy(m[torch_name]).to(p.device),
                "exp_avg_sq": torch.from_numpy(v[torch_name]).to(p.device)}
    return torch_opt


def _shared(groups: list[dict], key: str):
    values = {repr(g[key]) for g in groups}
    if len(values) != 1:
        raise ValueError(f"the parameter groups of the torch optimiser differ in {key!r} "
                         f"({sorted(values)}); ours has one value for all parameters")
    return groups[0][key]


def _hyperparameters(torch_opt: torch.optim.Optimizer) -> dict:
    """``lr``, ``betas``, ``eps`` and ``weight_decay`` of a torch Adam or AdamW, one value each.

    The weight decay is the one of the groups that decay (0 if none does); which parameters
    those groups hold is the decay rule (:func:`_decayed`).
    """
    if type(torch_opt) not in (torch.optim.Adam, torch.optim.AdamW):
        raise ValueError(f"adam_from_torch takes torch.optim.Adam or AdamW, got "
                         f"{type(torch_opt).__name__}")
    groups = torch_opt.param_groups
    for flag in ("amsgrad", "maximize"):
        if any(g.get(flag) for g in groups):
            raise ValueError(f"the torch optimiser uses {flag}=True, which ours does not have")
    lr, betas, eps = (_shared(groups, k) for k in ("lr", "betas", "eps"))
    decaying = [g for g in groups if g["weight_decay"] > 0]
    weight_decay = _shared(decaying, "weight_decay") if decaying else 0.0
    return {"lr": float(lr), "betas": tuple(float(b) for b in betas), "eps": float(eps),
            "weight_decay": float(weight_decay)}


def _decayed(torch_opt: torch.optim.Optimizer, twin_params: dict,
             names: dict) -> frozenset[str]:
    """Our names of the parameters in a group with a positive weight decay.

    ``twin_params`` maps torch's names to the twin's parameters, ``names`` ours to
    (torch's, transposed); every parameter must be in some group.
    """
    group_of = {id(p): g for g in torch_opt.param_groups for p in g["params"]}
    ungrouped = sorted(t for t, _ in names.values() if id(twin_params[t]) not in group_of)
    if ungrouped:
        raise ValueError(f"parameters {ungrouped} are in no group of the torch optimiser")
    return frozenset(n for n, (t, _) in names.items()
                     if group_of[id(twin_params[t])]["weight_decay"] > 0)


def _step_and_moments(torch_opt: torch.optim.Optimizer, twin_params: dict,
                      torch_names: list[str]) -> tuple[int, dict, dict] | None:
    """The one step count and both moments (torch's name -> tensor); None before a step."""
    states = [torch_opt.state.get(twin_params[t], {}) for t in torch_names]
    for t, state in zip(torch_names, states, strict=True):
        absent = [k for k in ("step", "exp_avg", "exp_avg_sq") if state and k not in state]
        if absent:
            raise ValueError(f"the torch optimiser's state of {t} has no {absent[0]!r} "
                             f"(Adam's state is 'step', 'exp_avg', 'exp_avg_sq')")
    steps = {int(s["step"]) for s in states if s}
    if len(steps) > 1 or (steps and not all(states)):
        raise ValueError(f"the parameters' step counts differ ({sorted(steps)}, or some have "
                         f"no state); ours has one step count")
    if not steps:
        return None
    m = {t: s["exp_avg"] for t, s in zip(torch_names, states, strict=True)}
    v = {t: s["exp_avg_sq"] for t, s in zip(torch_names, states, strict=True)}
    for kind, moments in (("first", m), ("second", v)):
        bad = next((t for t, a in moments.items() if not a.isfinite().all()), None)
        if bad is not None:
            raise ValueError(f"the {kind} moment of {bad} holds NaN or infinite values")
    negative = next((t for t, a in v.items() if (a < 0).any()), None)
    if negative is not None:
        raise ValueError(f"the second moment of {negative} is below zero somewhere")
    return steps.pop(), m, v


def adam_from_torch(torch_opt: torch.optim.Optimizer, twin: nn.Module, model: ours.Module,
                    backend: str = DEFAULT_BACKEND) -> Adam:
    """Our optimiser continuing a torch ``Adam``/``AdamW`` run (the inverse of
    :func:`adam_to_torch`).

    Parameters
    ----------
    torch_opt : torch.optim.Adam or torch.optim.AdamW
        Over ``twin``'s parameters, every one in some group.
    twin : torch.nn.Module
    model : Module
        Ours, holding the twin's weights (``from_torch(twin)``).
    backend : str, default ``config.DEFAULT_BACKEND``

    Returns
    -------
    optimizer : Adam or AdamW
        Same hyperparameters; the decay rule is the set of parameters whose group has a
        positive ``weight_decay``; moments and step count from the torch state.

    Raises
    ------
    ValueError
        If the optimiser is another kind, uses amsgrad or maximize, its groups differ in lr,
        betas, eps or positive weight decay, ``twin`` is not the twin of ``model``, a
        parameter of the twin is in no group, a parameter's state lacks a moment or its step,
        the parameters' step counts differ, or a moment is not finite (or a second one
        negative).
    """
    hyperparameters = _hyperparameters(torch_opt)  # refuses another optimiser first
    names = interop.torch_names(model)  # ours -> (torch's, transposed)
    twin_params = _twin_parameters(twin, model)
    kind = AdamW if type(torch_opt) is torch.optim.AdamW else Adam
    optimizer = kind(**hyperparameters, decay=_decayed(torch_opt, twin_params, names),
                     backend=backend)
    state = _step_and_moments(torch_opt, twin_params, [t for t, _ in names.values()])
    if state is not None:
        t, m, v = state
        optimizer.load_state_dict({
            "t": t, "lr": optimizer.lr, "beta1": optimizer.betas[0],
            "beta2": optimizer.betas[1], "eps": optimizer.eps,
            "weight_decay": optimizer.weight_decay,
            "m": interop.from_torch_layout(model, m), "v": interop.from_torch_layout(model, v)})
    return optimizer

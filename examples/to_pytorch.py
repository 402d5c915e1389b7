"""Train here, continue in PyTorch, and come back: the weight (and Adam state) round trip.

1. Train the chapter's character model for a few steps with numpy_transformer.
2. Export the weights with ``interop.to_torch_state_dict`` and load them into the PyTorch twin
   (``reference_checks/twins.py``); both frameworks now compute the same logits.
3. Move Adam's moments as well, and keep training in PyTorch: the run continues as if it had
   never changed framework (compare with the same steps done here).
4. Import the PyTorch weights back with ``interop.from_torch_state_dict`` and evaluate here.

Run from the repository root (needs ``pip install torch==2.13.0``)::

    python examples/to_pytorch.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for reference_checks.twins

from numpy_transformer import interop  # noqa: E402
from numpy_transformer.corpus import load_corpus  # noqa: E402
from numpy_transformer.data import CharTokenizer, get_batch, window_schedule  # noqa: E402
from numpy_transformer.functional import cross_entropy_forward  # noqa: E402
from numpy_transformer.nn import DecoderLM, TransformerConfig  # noqa: E402
from numpy_transformer.optim import Adam  # noqa: E402
from numpy_transformer.schedules import constant_lr  # noqa: E402
from numpy_transformer.train import Batch, Trainer  # noqa: E402
from reference_checks import twins  # noqa: E402

LR, CLIP, BATCH, CONTEXT = 2e-3, 1.0, 16, 64
STEPS_HERE, STEPS_THERE = 20, 20


def adam_state_to_torch(ours: Adam, model, twin: torch.nn.Module, opt: torch.optim.Adam) -> None:
    """Copy our Adam moments into torch's optimiser, transposing as the weights are."""
    params = dict(twin.named_parameters())
    for name, (torch_name, transpose) in interop.torch_names(model).items():
        m, v = (a.T if transpose else a for a in (ours.m[name], ours.v[name]))
        opt.state[params[torch_name]] = {
            "step": torch.tensor(float(ours.t)),  # torch keeps the step count per parameter
            "exp_avg": torch.from_numpy(np.ascontiguousarray(m)),
            "exp_avg_sq": torch.from_numpy(np.ascontiguousarray(v))}


def adam_state_from_torch(opt: torch.optim.Adam, twin: torch.nn.Module, model) -> Adam:
    """A new Adam of ours holding torch's moments and step count."""
    params = dict(twin.named_parameters())
    group = opt.param_groups[0]
    m, v, t = {}, {}, 0
    for name, (torch_name, transpose) in interop.torch_names(model).items():
        state = opt.state[params[torch_name]]
        t = int(state["step"])
        m[name], v[name] = (np.ascontiguousarray(s.numpy().T if transpose else s.numpy())
                            for s in (state["exp_avg"], state["exp_avg_sq"]))
    ours = Adam(lr=group["lr"])
    ours.load_state_dict({"t": t, "lr": group["lr"], "beta1": group["betas"][0],
                          "beta2": group["betas"][1], "eps": group["eps"],
                          "weight_decay": group["weight_decay"], "m": m, "v": v})
    return ours


def torch_step(twin, opt, batch: Batch) -> float:
    logits = twin(torch.from_numpy(batch.inputs[0]))
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                           torch.from_numpy(batch.targets).reshape(-1))
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(twin.parameters(), CLIP)
    opt.step()
    return loss.item()


def main() -> None:
    text = load_corpus()
    ids = CharTokenizer(text).encode(text)
    schedule = window_schedule(len(ids), CONTEXT, BATCH, STEPS_HERE + STEPS_THERE + 1,
                               np.random.default_rng(0))
    batches = [Batch((x,), y) for x, y in (get_batch(ids, s, CONTEXT) for s in schedule)]
    config = TransformerConfig(vocab=104, width=84, heads=4, layers=2, ffn_width=168,
                               max_len=100, activation="relu", embed_scale=True,
                               dtype="float32")

    # 1. train here
    model = DecoderLM(config)
    trainer = Trainer(model, Adam(lr=LR), constant_lr(LR), clip=CLIP)
    print(f"1. {STEPS_HERE} steps in numpy_transformer ({model.num_parameters():,} parameters)")
    for batch in batches[:STEPS_HERE]:
        record = trainer.step(batch)
    print(f"   loss after step {record.step}: {record.loss:.4f}")

    # 2. export into the PyTorch twin
    state = interop.to_torch_state_dict(model)  # numpy arrays under torch names and layouts
    twin = twins.DecoderLM(config).to(torch.float32)
    twin.load_state_dict({name: torch.from_numpy(a) for name, a in state.items()})
    x = batches[-1].inputs[0]
    with torch.no_grad():
        diff = np.abs(model(x) - twin(torch.from_numpy(x)).numpy()).max()
    print(f"2. exported {len(state)} tensors; largest logit difference: {diff:.1e}")

    # 3. continue in PyTorch, with Adam's moments moved along
    opt = torch.optim.Adam(twin.parameters(), lr=LR)
    adam_state_to_torch(trainer.optimizer, model, twin, opt)
    reference = DecoderLM(config)  # the same run, never leaving numpy_transformer
    reference.load_state_dict(model.state_dict())
    ref_opt = Adam(lr=LR)
    ref_opt.load_state_dict(trainer.optimizer.state_dict())
    ref_trainer = Trainer(reference, ref_opt, constant_lr(LR), clip=CLIP)
    print(f"3. {STEPS_THERE} more steps in PyTorch (and the same steps here, for comparison)")
    print(f"   {'step':>4}  {'PyTorch':>10}  {'here':>10}")
    for i, batch in enumerate(batches[STEPS_HERE:STEPS_HERE + STEPS_THERE]):
        loss_torch, loss_here = torch_step(twin, opt, batch), ref_trainer.step(batch).loss
        if i % 5 == 4:
            print(f"   {STEPS_HERE + i + 1:>4}  {loss_torch:>10.6f}  {loss_here:>10.6f}")

    # 4. import back and evaluate here
    interop.from_torch_state_dict(model, twin.state_dict())  # torch tensors are accepted
    trainer.optimizer = adam_state_from_torch(opt, twin, model)  # to keep training here
    held_out = batches[-1]
    loss_here, _ = cross_entropy_forward(model(held_out.inputs[0]), held_out.targets)
    with torch.no_grad():
        logits = twin(torch.from_numpy(held_out.inputs[0]))
        loss_torch = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                     torch.from_numpy(held_out.targets).reshape(-1)).item()
    print(f"4. imported back; loss on an unseen batch: here {loss_here:.6f}, "
          f"PyTorch {loss_torch:.6f}")


if __name__ == "__main__":
    main()

"""Train here, continue in PyTorch, and come back: the weight (and Adam state) round trip.

1. Train the chapter's character model for a few steps with numpy_transformer.
2. Make its PyTorch twin with ``numpy_transformer.torch_twins.to_torch``: a ``torch.nn.Module``
   holding the same weights; both frameworks now compute the same logits.
3. Move Adam's moments and step count as well (``adam_to_torch``) and keep training in
   PyTorch: the run continues as if it had never changed framework (compare with the same
   steps done here).
4. Come back with ``from_torch`` and ``adam_from_torch``, and evaluate here.

Needs ``pip install "numpy_transformer[torch]"``::

    python examples/to_pytorch.py
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from numpy_transformer.corpus import load_corpus
from numpy_transformer.data import CharTokenizer, get_batch, window_schedule
from numpy_transformer.functional import cross_entropy_forward
from numpy_transformer.nn import DecoderLM, TransformerConfig
from numpy_transformer.optim import Adam
from numpy_transformer.schedules import constant_lr
from numpy_transformer.torch_twins import adam_from_torch, adam_to_torch, from_torch, to_torch
from numpy_transformer.train import Batch, Trainer

LR, CLIP, BATCH, CONTEXT = 2e-3, 1.0, 16, 64
STEPS_HERE, STEPS_THERE = 20, 20


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

    # 2. the PyTorch twin, holding the same weights
    twin = to_torch(model)
    x = batches[-1].inputs[0]
    with torch.no_grad():
        diff = np.abs(model(x) - twin(torch.from_numpy(x)).numpy()).max()
    print(f"2. {type(twin).__module__}.{type(twin).__name__} with "
          f"{len(twin.state_dict())} tensors; largest logit difference: {diff:.1e}")

    # 3. continue in PyTorch, with Adam's moments and step count moved along
    opt = adam_to_torch(trainer.optimizer, model, twin)
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

    # 4. back here, with Adam's state to keep training
    model = from_torch(twin)
    trainer = Trainer(model, adam_from_torch(opt, twin, model), constant_lr(LR), clip=CLIP)
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

"""Continue training an exported model with PyTorch's DistributedDataParallel, on the CPU.

    numpy-transformer export runs/char-lm            # -> runs/char-lm/safetensors/
    torchrun --nproc_per_node 2 examples/continue_ddp.py runs/char-lm/safetensors --steps 50

What each of the processes does:

1. Builds the PyTorch twin of the model (``numpy_transformer.torch_twins``) and loads
   ``model.safetensors`` into it with ``safetensors.torch.load_file`` and ``strict=True``:
   the file is an ordinary PyTorch state dict.
2. Gives ``torch.optim.Adam``/``AdamW`` the moments and step count of ``optimizer.safetensors``
   (when the export has one), so the first update is the one the run here would have made.
3. Wraps the twin in ``DistributedDataParallel`` (gloo backend). Every step draws one batch of
   windows of the training text (the same draws in every process); process r trains on the
   rows r, r + N, r + 2N, ... DDP averages the gradients of the N shares, which is the
   gradient of the whole batch: the update is the one a single process would make on it.
   Then global-norm clipping and the optimiser step, as here.

Before the first step, process 0 evaluates the exported model with numpy_transformer on the
first batch: the first DDP loss is that loss (to float precision; exactly so without dropout).
At the end every process prints a fingerprint of its weights (they are the same), and
process 0 writes the weights and Adam's state to ``OUT/`` in the format it read, which
``numpy_transformer.export.load_safetensors`` brings back (``examples/study_gradient.py``).

The learning rate is constant (``--lr``, default the optimiser's own); the run's schedule is
not continued. Needs ``pip install "numpy_transformer[torch,hf]"``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import safetensors.torch
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from numpy_transformer.corpus import load_corpus
from numpy_transformer.data import get_batch, load_text, window_schedule
from numpy_transformer.export import (
    OPTIMIZER_FILE,
    WEIGHTS_FILE,
    export_run,
    load_optimizer,
    load_safetensors,
)
from numpy_transformer.functional import cross_entropy_forward
from numpy_transformer.torch_twins import adam_from_torch, adam_to_torch, build_twin, from_torch
from numpy_transformer.torch_twins.ops import TORCH_DTYPES


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("export", type=Path, help="a folder written by numpy-transformer export")
    p.add_argument("--steps", type=int, default=20, help="updates [20]")
    p.add_argument("--batch", type=int, help="windows per step, over all processes [the run's]")
    p.add_argument("--lr", type=float, help="constant learning rate [the optimiser's]")
    p.add_argument("--clip", type=float, help="global gradient-norm clip, 0 = off [the run's]")
    p.add_argument("--text", type=Path, help="training text [the run's, or the embedded corpus]")
    p.add_argument("--seed", type=int, default=0, help="seed of the batch draws [0]")
    p.add_argument("--out", type=Path, help="where the weights go [EXPORT/ddp]")
    return p.parse_args()


def fingerprint(module: torch.nn.Module) -> str:
    """sha256 of every parameter's bytes, in order: equal fingerprints, equal weights."""
    h = hashlib.sha256()
    for p in module.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    say = print if rank == 0 else (lambda *a, **k: None)

    # 1. the twin, loaded by PyTorch alone; our model from the same file
    exported = load_safetensors(args.export / WEIGHTS_FILE, backend="numpy")
    model, tokenizer, options = exported.model, exported.tokenizer, exported.info.get("options",
                                                                                     {})
    if tokenizer is None:
        raise SystemExit(f"{args.export}: this example trains a character language model")
    twin = build_twin(model).to(TORCH_DTYPES[np.dtype(model.config.dtype)])
    twin.load_state_dict(safetensors.torch.load_file(args.export / WEIGHTS_FILE), strict=True)

    # 2. Adam's state (or a fresh Adam)
    opt_path = args.export / OPTIMIZER_FILE
    if opt_path.is_file():
        opt = adam_to_torch(load_optimizer(opt_path, model, backend="numpy"), model, twin)
    else:
        opt = torch.optim.Adam(twin.parameters(), lr=options.get("lr", 1e-3))
    if args.lr is not None:
        for group in opt.param_groups:
            group["lr"] = args.lr
    clip = options.get("clip", 1.0) if args.clip is None else args.clip
    ddp = DistributedDataParallel(twin)

    # 3. the batches: the same draws in every process, each takes its rows
    text_path = args.text or options.get("text")
    ids = tokenizer.encode(load_text(text_path) if text_path else load_corpus())
    batch, context = args.batch or options.get("batch", 16), model.config.max_len
    if batch % world:
        raise SystemExit(f"--batch {batch} must be a multiple of the {world} processes")
    starts = window_schedule(len(ids), context, batch, args.steps,
                             np.random.default_rng(args.seed))
    first_x, first_y = get_batch(ids, starts[0], context)
    ours, _ = cross_entropy_forward(model.eval()(first_x), first_y)
    say(f"numpy_transformer, exported model, first batch: loss {ours:.10f}")

    out = args.out or args.export / "ddp"
    log = []
    for step, window_starts in enumerate(starts, start=1):
        x, y = (torch.from_numpy(a[rank::world]) for a in get_batch(ids, window_starts, context))
        logits = ddp(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad()
        loss.backward()  # DDP: every process now holds the mean of the processes' gradients
        if clip:
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), clip)
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # the loss of the whole batch: the mean of equal shares
        log.append({"step": step, "loss": mean.item() / world})
        say(f"DDP step {step:>4}  loss {log[-1]['loss']:.10f}", flush=True)

    print(f"rank {rank}: weights {fingerprint(twin)}", flush=True)
    if rank == 0:
        back = from_torch(twin, backend="numpy")
        written = export_run(out, "safetensors", back, tokenizer,
                             adam_from_torch(opt, twin, back, backend="numpy"),
                             info={**exported.info, "ddp": {"world": world, "log": log}})
        log[0]["numpy_transformer_loss"] = float(ours)  # the exported model's, same batch
        (out / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
        print(f"wrote {', '.join(str(p) for p in written)}, {out / 'log.jsonl'}", flush=True)
    dist.barrier()  # every rank waits for rank 0's files
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # The work is done and written. Leave without the interpreter's teardown: in it, a
    # thread of torch's distributed runtime was sometimes destroyed while still joinable,
    # which aborts the rank ("terminate called without an active exception", SIGABRT) and
    # makes torchrun report a failure: 2 runs in 8 on a loaded machine, and still about 1 in
    # 20 after destroying the process group and DDP explicitly first.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

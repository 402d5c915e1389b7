"""Train the same model in both frameworks from the same weights on the same batches.

The chapter's 132,488-parameter character model (and the LSTM of the three-way comparison,
and one encoder-decoder on the reversal task) is built here, copied into its PyTorch twin,
and both are trained with Adam (lr 2e-3) and global-norm clipping at 1.0. Every step prints
both losses; at the end the largest difference of each parameter tensor.

Measured (batch 32 x context 100, 50 steps): float64 losses agree to 1e-15 at every step and
parameters to 1e-13 (the attention key biases, whose true gradient is zero and which Adam moves
by rounding noise alone, to 1e-11). float32 losses agree to 1e-6 until a ReLU input near zero
rounds to different sides of the kink in the two frameworks; the runs then drift apart slowly,
to 1.7e-5 by step 50 (torch float32 against torch float64 behaves the same way).

Run from the repository root (the matrices are small: on a busy machine one thread is faster)::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python -m reference_checks.end_to_end
    python -m reference_checks.end_to_end --batch 8 --context 32 --steps 20 --dtype float64
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

from numpy_transformer import interop
from numpy_transformer.corpus import load_corpus
from numpy_transformer.data import CharTokenizer, get_batch, window_schedule
from numpy_transformer.nn import LSTMLM, DecoderLM, EncoderDecoder, LSTMConfig, TransformerConfig
from numpy_transformer.optim import Adam
from numpy_transformer.schedules import constant_lr
from numpy_transformer.tasks import reverse_batch
from numpy_transformer.torch_twins import to_torch
from numpy_transformer.train import Batch, Trainer

LR, CLIP = 2e-3, 1.0


def char_lm_config(dtype: str) -> TransformerConfig:
    """The chapter's character model: 132,488 parameters."""
    return TransformerConfig(vocab=104, width=84, heads=4, layers=2, ffn_width=168, max_len=100,
                             activation="relu", embed_scale=True, dtype=dtype, seed=0)


def lstm_config(dtype: str) -> LSTMConfig:
    """The LSTM of the three-way comparison at the chapter's vocabulary: 132,336 parameters."""
    return LSTMConfig(vocab=104, embed=85, hidden=128, max_len=100, dtype=dtype, seed=0)


def encdec_config(dtype: str) -> TransformerConfig:
    """A small encoder-decoder for the reversal task (digits 0-9 and BOS)."""
    return TransformerConfig(vocab=11, width=32, heads=4, layers=2, ffn_width=64, max_len=16,
                             dtype=dtype, seed=0)


def char_batches(steps: int, batch: int, context: int, seed: int = 0) -> list[Batch]:
    """Next-character batches of the embedded corpus, all drawn up front."""
    ids = CharTokenizer(load_corpus()).encode(load_corpus())
    schedule = window_schedule(len(ids), context, batch, steps, np.random.default_rng(seed))
    return [Batch((x,), y) for x, y in (get_batch(ids, s, context) for s in schedule)]


def reverse_batches(steps: int, batch: int, length: int, seed: int = 0) -> list[Batch]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        src, tgt_in, tgt_out = reverse_batch(batch, rng, length=length)
        out.append(Batch((src, tgt_in), tgt_out))
    return out


def train_ours(model, batches: list[Batch]) -> list[float]:
    trainer = Trainer(model, Adam(lr=LR), constant_lr(LR), clip=CLIP)
    return [trainer.step(b).loss for b in batches]


def train_torch(twin: torch.nn.Module, batches: list[Batch]) -> list[float]:
    opt = torch.optim.Adam(twin.parameters(), lr=LR)
    losses = []
    for b in batches:
        logits = twin(*(torch.from_numpy(a) for a in b.inputs))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                               torch.from_numpy(b.targets).reshape(-1), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(twin.parameters(), CLIP)
        opt.step()
        losses.append(loss.item())
    return losses


def compare_training(model, batches: list[Batch]) -> dict:
    """Train ``model`` and its twin (made before the first step) on ``batches``.

    Returns
    -------
    result : dict
        ``ours``, ``torch``: per-step losses; ``loss_diff``: the largest |difference|;
        ``param_diff``: {torch name: max |ours - torch| / max |torch|} after training.
    """
    twin = to_torch(model)
    ours = train_ours(model, batches)
    theirs = train_torch(twin, batches)
    mine = interop.to_torch_state_dict(model)
    param_diff = {}
    for name, t in twin.state_dict().items():
        t = t.numpy().astype(np.float64)
        param_diff[name] = float(np.abs(mine[name] - t).max() / np.abs(t).max())
    return {"ours": ours, "torch": theirs, "param_diff": param_diff,
            "loss_diff": float(np.max(np.abs(np.array(ours) - np.array(theirs))))}


def run_char_lm(dtype: str, steps: int, batch: int, context: int) -> dict:
    return compare_training(DecoderLM(char_lm_config(dtype)), char_batches(steps, batch, context))


def run_encdec(dtype: str, steps: int, batch: int, length: int) -> dict:
    return compare_training(EncoderDecoder(encdec_config(dtype)),
                            reverse_batches(steps, batch, length))


def report(title: str, result: dict) -> None:
    print(f"\n{title}")
    print(f"  {'step':>4}  {'numpy_transformer':>18}  {'torch':>18}  {'|difference|':>12}")
    for i, (a, b) in enumerate(zip(result["ours"], result["torch"], strict=True), start=1):
        print(f"  {i:>4}  {a:>18.12f}  {b:>18.12f}  {abs(a - b):>12.2e}")
    print(f"  largest loss difference: {result['loss_diff']:.2e}")
    print("  largest relative difference per parameter tensor after training:")
    for name, diff in sorted(result["param_diff"].items(), key=lambda kv: -kv[1]):
        print(f"    {name:<48}{diff:10.2e}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=100, help="characters per window")
    parser.add_argument("--dtype", choices=["float32", "float64", "both"], default="both")
    args = parser.parse_args(argv)
    for dtype in (["float32", "float64"] if args.dtype == "both" else [args.dtype]):
        start = time.perf_counter()
        report(f"char model (132,488 parameters), {dtype}, batch {args.batch} x context "
               f"{args.context}, {args.steps} steps",
               run_char_lm(dtype, args.steps, args.batch, args.context))
        report(f"LSTM (132,336 parameters), {dtype}, batch {args.batch} x context "
               f"{args.context}, {args.steps} steps",
               compare_training(LSTMLM(lstm_config(dtype)),
                                char_batches(args.steps, args.batch, args.context)))
        report(f"encoder-decoder on the reversal task, {dtype}, batch {args.batch}, "
               f"{args.steps} steps", run_encdec(dtype, args.steps, args.batch, 8))
        print(f"  ({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()

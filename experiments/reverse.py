"""An encoder-decoder learns to reverse a digit string; its cross-attention is the anti-diagonal.

``EncoderDecoder`` (width 64, 4 heads, 2 pre-LN blocks in each stack, GELU FFN 256, learned
positions) is trained with teacher forcing on ``reverse_batch``: the decoder reads
``[BOS] + target[:-1]`` and must output ``target = source reversed``. Output t equals source
token T-1-t, which the decoder can only fetch through cross-attention, so a working model
should put its cross-attention on the anti-diagonal.

Testing does NOT use teacher forcing: greedy decoding starts from ``[BOS]`` alone, runs the
whole decoder on the growing prefix, appends the argmax of the last position, and repeats
T times (no KV cache: the prefix is recomputed each step, which is exact for a causal
decoder). Token and whole-sequence accuracy are reported for both the teacher-forced and
the greedy outputs.

Same optimiser as the sorter: AdamW lr 3e-3, weight decay 0.01 on every parameter, no
clipping; 800 steps of 128 sequences of length 8.

Run: ``python experiments/reverse.py`` (a few minutes).
"""

from __future__ import annotations

import common  # first: pins BLAS to one thread before numpy loads
import numpy as np

from numpy_transformer.nn import EncoderDecoder, TransformerConfig
from numpy_transformer.optim import AdamW
from numpy_transformer.schedules import constant_lr
from numpy_transformer.tasks import reverse_batch
from numpy_transformer.train import Batch, Trainer

MODEL_SEED, TRAIN_SEED, TEST_SEED = 0, 0, 123
STEPS, BATCH, LR, N_TEST, LENGTH, DIGITS = 800, 128, 3e-3, 2000, 8, 10
BOS = DIGITS  # reverse_batch's start token


def greedy_decode(model: EncoderDecoder, src: np.ndarray, steps: int) -> np.ndarray:
    """Decode ``steps`` tokens after BOS, feeding each argmax back in: (B, steps)."""
    tgt = np.full((src.shape[0], 1), BOS, dtype=np.int64)  # (B, 1)
    for _ in range(steps):
        logits = model.forward(src, tgt)  # (B, t, V): every position recomputed
        nxt = logits[:, -1].argmax(-1)  # (B,)
        tgt = np.concatenate([tgt, nxt[:, None]], axis=1)
    return tgt[:, 1:]


def main() -> None:
    timer = common.Timer()
    backend = common.pick_backend()
    print(f"seeds: model {MODEL_SEED}, training data {TRAIN_SEED}, test {TEST_SEED}; "
          f"backend {backend}")
    model = EncoderDecoder(TransformerConfig(
        vocab=DIGITS + 1, width=64, heads=4, layers=2, ffn_width=256, max_len=LENGTH,
        activation="gelu", positions="learned", dtype="float32", backend=backend,
        seed=MODEL_SEED))
    opt = AdamW(lr=LR, weight_decay=0.01, decay=lambda name, p: True, backend=backend)
    trainer = Trainer(model, opt, constant_lr(LR), clip=None)
    rng = np.random.default_rng(TRAIN_SEED)
    for _ in range(STEPS):
        src, tgt_in, tgt_out = reverse_batch(BATCH, rng, LENGTH, DIGITS)
        trainer.step(Batch((src, tgt_in), tgt_out))
    train_seconds = timer.seconds
    curve = np.array([r.loss for r in trainer.log])

    src, tgt_in, tgt_out = reverse_batch(N_TEST, np.random.default_rng(TEST_SEED), LENGTH,
                                         DIGITS)
    forced = model.forward(src, tgt_in).argmax(-1)
    greedy = greedy_decode(model, src, LENGTH)
    acc = {name: {"token": float((p == tgt_out).mean()),
                  "sequence": float((p == tgt_out).all(1).mean())}
           for name, p in (("teacher_forced", forced), ("greedy", greedy))}
    for name, a in acc.items():
        print(f"{name:15s} token accuracy {a['token']:.4f}, whole sequence {a['sequence']:.4f}")
    print(f"final training loss {curve[-1]:.4f}; training {train_seconds:.1f} s")

    # Cross-attention of every decoder block for one test example, on the greedy output.
    example_src, example_out = src[:1], greedy[:1]
    common.keep_attention(model.decoder.blocks, "cross_attn")
    model.forward(example_src, np.concatenate([[[BOS]], example_out[:, :-1]], axis=1))
    maps = common.collect_attention(model.decoder.blocks, "cross_attn")[:, 0]  # (L, H, Tt, Ts)
    anti = np.eye(LENGTH)[::-1].astype(bool)
    on_anti = [float(maps[layer].mean(0)[anti].mean()) for layer in range(maps.shape[0])]
    print(f"mean cross-attention on the anti-diagonal, per block (mean over heads): "
          f"{[round(v, 3) for v in on_anti]} (uniform would be {1 / LENGTH:.3f})")

    fig = common.attention_grid(maps, [f"out {d}" for d in example_out[0]],
                                [str(d) for d in example_src[0]],
                                row_names=["block 0", "block 1"], cell=2.6,
                                suptitle="Reverse: decoder cross-attention (rows = output "
                                         "positions, columns = source digits)")
    common.save_figure(fig, "reverse_cross_attention")
    fig, ax = common.plt.subplots(figsize=(5.5, 3.6))
    common.plot_curves(ax, {"teacher-forced loss": curve}, title="Reverse: training loss",
                       ylabel="cross-entropy")
    ax.set_yscale("log")
    common.save_figure(fig, "reverse_loss")

    common.save_json("reverse", {
        "command": "python experiments/reverse.py",
        "setup": {"steps": STEPS, "batch": BATCH, "lr": LR, "length": LENGTH,
                  "test_sequences": N_TEST,
                  "optimizer": "AdamW, weight_decay 0.01 on all parameters, no clipping",
                  "seeds": {"model": MODEL_SEED, "train": TRAIN_SEED, "test": TEST_SEED},
                  "backend": backend, "dtype": "float32"},
        "accuracy": acc,
        "final_loss": float(curve[-1]),
        "cross_attention_on_anti_diagonal_per_block": on_anti,
        "example": {"source": example_src[0], "greedy_output": example_out[0]},
        "curve": np.round(curve, 4),
        "train_seconds": round(train_seconds, 1),
        "wall_seconds": round(timer.seconds, 1),
    })


if __name__ == "__main__":
    main()

"""Copy-3-back with a causal decoder (chapter 001's exercise), and the impossible t+3 variant.

A ``DecoderLM`` over the 10 digits (the sorter's sizes: width 64, 4 heads, 2 pre-LN blocks,
GELU FFN 256, learned positions, max_len 10) reads 10 random digits and must output, at each
position t, the digit at t - 3. Positions 0-2 have no target: they hold the ignore index
(-100) and are masked out of the loss. The causal mask hides nothing this task needs.

The variant with shift -3 asks for the digit at t + 3, a FUTURE token that the causal mask
hides; no training can recover it, so test accuracy must stay at chance, 1/10.

Same optimiser and schedule as the sorter: AdamW lr 3e-3, weight decay 0.01 on every
parameter (torch's default), no clipping, 600 steps of 128 sequences; 2,000 test sequences
from a separate seeded generator.

Run: ``python experiments/copy_back.py`` (about a minute).
"""

from __future__ import annotations

import common  # first: pins BLAS to one thread before numpy loads
import numpy as np

from numpy_transformer.nn import DecoderLM, TransformerConfig
from numpy_transformer.optim import AdamW
from numpy_transformer.schedules import constant_lr
from numpy_transformer.tasks import copy_back_batch
from numpy_transformer.train import Batch, Trainer

MODEL_SEED, TRAIN_SEED, TEST_SEED = 0, 0, 1
STEPS, BATCH, LR, N_TEST, LENGTH = 600, 128, 3e-3, 2000, 10
CHAPTER = {"t-3": 1.0000, "t+3": "chance, about 0.10 (stated, not run)"}


def run(shift: int, backend: str) -> dict:
    model = DecoderLM(TransformerConfig(
        vocab=10, width=64, heads=4, layers=2, ffn_width=256, max_len=LENGTH,
        activation="gelu", positions="learned", dtype="float32", backend=backend,
        seed=MODEL_SEED))
    opt = AdamW(lr=LR, weight_decay=0.01, decay=lambda name, p: True, backend=backend)
    trainer = Trainer(model, opt, constant_lr(LR), clip=None)
    rng = np.random.default_rng(TRAIN_SEED)
    for _ in range(STEPS):
        x, y, mask = copy_back_batch(BATCH, rng, LENGTH, shift=shift)
        trainer.step(Batch((x,), y, mask))
    x, y, mask = copy_back_batch(N_TEST, np.random.default_rng(TEST_SEED), LENGTH, shift=shift)
    pred = model.forward(x).argmax(-1)
    return {"model": model, "curve": np.array([r.loss for r in trainer.log]),
            "accuracy": float((pred == y)[mask].mean()),
            "per_position": [float((pred[:, t] == y[:, t]).mean()) if mask[0, t] else None
                             for t in range(LENGTH)],
            "example": x[:1]}


def main() -> None:
    timer = common.Timer()
    backend = common.pick_backend()
    print(f"seeds: model {MODEL_SEED}, training data {TRAIN_SEED}, test {TEST_SEED}; "
          f"backend {backend}")
    runs = {}
    for name, shift in (("t-3", 3), ("t+3", -3)):
        t = common.Timer()
        runs[name] = run(shift, backend)
        runs[name]["seconds"] = t.seconds
        scored = "3-9" if shift > 0 else "0-6"
        print(f"target {name}: test accuracy on positions {scored} "
              f"{runs[name]['accuracy']:.4f} (chapter {CHAPTER[name]}), final loss "
              f"{runs[name]['curve'][-1]:.4f}, {t.seconds:.1f} s")

    # Attention of the working model on one test sequence: which key does each query read?
    model = runs["t-3"]["model"]
    x = runs["t-3"]["example"]
    common.keep_attention(model.decoder.blocks)
    model.forward(x)
    maps = common.collect_attention(model.decoder.blocks)[:, 0]  # (layers, H, T, T)
    offset3 = [float(np.mean([maps[layer, :, t, t - 3].mean() for t in range(3, LENGTH)]))
               for layer in range(maps.shape[0])]
    print(f"mean weight on key t-3 (over heads and t = 3..9), per block: "
          f"{[round(v, 3) for v in offset3]}")

    fig, axes = common.plt.subplots(1, 3, figsize=(14, 3.9))
    common.plot_curves(axes[0], {"target x[t-3]": runs["t-3"]["curve"],
                                 "target x[t+3]": runs["t+3"]["curve"]},
                       title="Causal decoder: training loss", ylabel="cross-entropy")
    axes[0].axhline(np.log(10), color="gray", ls="--", lw=0.8)
    axes[0].text(5, np.log(10) * 1.02, "ln 10 (chance)", fontsize=8, color="gray")
    axes[0].set_yscale("log")
    labels = [f"{t}:{d}" for t, d in enumerate(x[0])]
    for layer in range(2):
        im = common.plot_attention(axes[layer + 1], maps[layer].mean(0), labels, labels,
                                   vmax=None, title=f"t-3 model, block {layer}, mean over "
                                                    f"heads")
        axes[layer + 1].set_xlabel("key (position:digit)")
        axes[layer + 1].set_ylabel("query (position:digit)")
    fig.colorbar(im, ax=axes[1:], shrink=0.8)
    common.save_figure(fig, "copy_back")

    common.save_json("copy_back", {
        "command": "python experiments/copy_back.py",
        "setup": {"steps": STEPS, "batch": BATCH, "lr": LR, "test_sequences": N_TEST,
                  "optimizer": "AdamW, weight_decay 0.01 on all parameters, no clipping",
                  "seeds": {"model": MODEL_SEED, "train": TRAIN_SEED, "test": TEST_SEED},
                  "backend": backend, "dtype": "float32"},
        "results": {n: {"accuracy": runs[n]["accuracy"],
                        "per_position_accuracy": runs[n]["per_position"],
                        "final_loss": float(runs[n]["curve"][-1]),
                        "seconds": round(runs[n]["seconds"], 1)} for n in runs},
        "chapter": CHAPTER,
        "mean_attention_on_offset_3_per_block": offset3,
        "curves": {n: np.round(runs[n]["curve"], 4) for n in runs},
        "wall_seconds": round(timer.seconds, 1),
    })


if __name__ == "__main__":
    main()

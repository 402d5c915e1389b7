"""The sorter of chapter 001: an encoder learns to sort 10 digits, and fails without positions.

Model: ``EncoderClassifier`` with width 64, 4 heads, 2 pre-LN blocks, GELU FFN of 256, learned
positions (max_len 10), a final LayerNorm and a linear head to 10 classes per position.
Training: AdamW at lr 3e-3 (weight decay 0.01 on EVERY parameter, as ``torch.optim.AdamW``'s
default, not our matrices-only default), no clipping, 600 steps of 128 fresh random sequences.
Test: 2,000 sequences from a separate seeded generator; token and whole-sequence accuracy.

The same run is repeated with ``positions="none"``: without positions every output position
computes the same function of the same multiset of tokens (permutation equivariance), so it
can only predict one distribution everywhere.

Run: ``python experiments/sorter.py`` (well under a minute).
"""

from __future__ import annotations

import common  # first: pins BLAS to one thread before numpy loads
import numpy as np

from numpy_transformer.nn import EncoderClassifier, TransformerConfig
from numpy_transformer.optim import AdamW
from numpy_transformer.schedules import constant_lr
from numpy_transformer.tasks import sort_batch
from numpy_transformer.train import Batch, Trainer

MODEL_SEED, TRAIN_SEED, TEST_SEED, EXAMPLE_SEED = 0, 0, 123, 7
STEPS, BATCH, LR, N_TEST, LENGTH = 600, 128, 3e-3, 2000, 10
CHAPTER = {"learned": {"token": 0.9986, "sequence": 0.9860},
           "none": {"token": 0.2758, "sequence": 0.0000}}


def build(positions: str, backend: str) -> EncoderClassifier:
    return EncoderClassifier(TransformerConfig(
        vocab=10, width=64, heads=4, layers=2, ffn_width=256, max_len=LENGTH,
        activation="gelu", positions=positions, num_classes=10, dtype="float32",
        backend=backend, seed=MODEL_SEED))


def train_and_test(positions: str, backend: str) -> dict:
    model = build(positions, backend)
    opt = AdamW(lr=LR, weight_decay=0.01, decay=lambda name, p: True)  # torch's default
    trainer = Trainer(model, opt, constant_lr(LR), clip=None)
    rng = np.random.default_rng(TRAIN_SEED)
    for _ in range(STEPS):
        x, y = sort_batch(BATCH, rng, LENGTH)
        trainer.step(Batch((x,), y))
    x, y = sort_batch(N_TEST, np.random.default_rng(TEST_SEED), LENGTH)
    pred = model.forward(x).argmax(-1)
    return {"model": model, "curve": np.array([r.loss for r in trainer.log]),
            "token": float((pred == y).mean()), "sequence": float((pred == y).all(1).mean())}


def main() -> None:
    timer = common.Timer()
    backend = common.pick_backend()
    print(f"seeds: model {MODEL_SEED}, training data {TRAIN_SEED}, test {TEST_SEED}, "
          f"example {EXAMPLE_SEED}; backend {backend}")
    runs = {}
    for positions in ("learned", "none"):
        t = common.Timer()
        runs[positions] = train_and_test(positions, backend)
        runs[positions]["seconds"] = t.seconds
        r = runs[positions]
        print(f"positions={positions:8s} token accuracy {r['token']:.4f}, whole sequence "
              f"{r['sequence']:.4f} (chapter {CHAPTER[positions]['token']:.4f} / "
              f"{CHAPTER[positions]['sequence']:.4f}), final loss {r['curve'][-1]:.4f}, "
              f"{t.seconds:.1f} s")

    # The last block's attention for one test sequence, averaged over heads.
    model = runs["learned"]["model"]
    x, _ = sort_batch(1, np.random.default_rng(EXAMPLE_SEED), LENGTH)
    common.keep_attention(model.encoder.blocks)
    pred = model.forward(x).argmax(-1)
    maps = common.collect_attention(model.encoder.blocks)[:, 0]  # (layers, H, T, T)
    print(f"example input  {x[0].tolist()}\nexample output {pred[0].tolist()}")

    fig, (a, b) = common.plt.subplots(1, 2, figsize=(11, 4))
    common.plot_curves(a, {"learned positions": runs["learned"]["curve"],
                           "no positions": runs["none"]["curve"]}, title="Sorter: training loss",
                       ylabel="cross-entropy")
    a.set_yscale("log")
    im = common.plot_attention(b, maps[-1].mean(0), pred[0], x[0], vmax=None,
                               title="Last block, mean over heads")
    b.set_xlabel("input digit (in input order)")
    b.set_ylabel("predicted output digit")
    fig.colorbar(im, ax=b, shrink=0.8)
    common.save_figure(fig, "sorter")
    fig = common.attention_grid(maps, pred[0], x[0], row_names=["block 0", "block 1"],
                                suptitle="Sorter: every head (rows = outputs as predicted, "
                                         "columns = input digits)")
    common.save_figure(fig, "sorter_heads")

    common.save_json("sorter", {
        "command": "python experiments/sorter.py",
        "setup": {"steps": STEPS, "batch": BATCH, "lr": LR, "test_sequences": N_TEST,
                  "optimizer": "AdamW, weight_decay 0.01 on all parameters, no clipping",
                  "seeds": {"model": MODEL_SEED, "train": TRAIN_SEED, "test": TEST_SEED,
                            "example": EXAMPLE_SEED},
                  "backend": backend, "dtype": "float32"},
        "results": {p: {"token_accuracy": runs[p]["token"],
                        "sequence_accuracy": runs[p]["sequence"],
                        "final_loss": float(runs[p]["curve"][-1]),
                        "seconds": round(runs[p]["seconds"], 1)} for p in runs},
        "chapter": CHAPTER,
        "example": {"input": x[0], "output": pred[0],
                    "last_block_mean_attention": np.round(maps[-1].mean(0), 4)},
        "curves": {p: np.round(runs[p]["curve"], 4) for p in runs},
        "wall_seconds": round(timer.seconds, 1),
    })


if __name__ == "__main__":
    main()

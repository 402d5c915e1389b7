"""The character model's positional ablation under the paired protocol (chapter 000, 16.6).

Two decoder-only character models are trained on the embedded corpus, one with the fixed
sinusoidal position table and one with none. Everything else is paired:

* the SAME initial tensors: one model is built, its state dict is copied into the other (the
  sinusoidal table is a buffer, not a parameter, so both have the same parameter set);
* the SAME windows in the same order: the whole (steps, batch) schedule of window starts is
  drawn up front from its own generator, before any model exists;
* both artifacts are fingerprinted (SHA-256) and the fingerprints printed.

Then: fixed-window train and held-out losses of both, the matched training curves, 300
sampled characters at temperature 0.8 from each (``generate.generate`` with the chapter's
cropped window: no cache, the last 100 characters recomputed each step), and the positional
model's attention maps on a held-out snippet (causality and row sums asserted, as the
chapter's audit).

Run: ``python experiments/charlm.py`` (about 20-30 minutes on one core).
"""

from __future__ import annotations

import common  # first: pins BLAS to one thread before numpy loads
import numpy as np

from numpy_transformer.corpus import load_corpus
from numpy_transformer.data import (
    CharTokenizer,
    fingerprint,
    fixed_window_loss,
    train_val_split,
    window_schedule,
)
from numpy_transformer.generate import generate
from numpy_transformer.nn import DecoderLM, TransformerConfig
from numpy_transformer.optim import Adam
from numpy_transformer.schedules import constant_lr
from numpy_transformer.train import Trainer, lm_batches

MODEL_SEED = 0  # the initial tensors
SCHEDULE_SEED = 1234  # the window schedule: its own generator, nothing else draws from it
SAMPLE_SEED = 1_406_050  # the sampler's generator (the chapter's seed value)
CONTEXT, BATCH, STEPS, LR, CLIP = 100, 64, 2501, 2e-3, 1.0
PROMPT = "The gradient "
CHAPTER = {"sinusoidal": {"train": 1.1132, "held_out": 1.9190},
           "none": {"train": 1.8672, "held_out": 2.3405}}


def config(vocab: int, positions: str, backend: str) -> TransformerConfig:
    """The chapter's model: width 84, 4 heads of 21, FFN 168 ReLU, 2 pre-LN blocks."""
    return TransformerConfig(vocab=vocab, width=84, heads=4, layers=2, ffn_width=168,
                             max_len=CONTEXT, activation="relu", positions=positions,
                             embed_scale=True, embed_std=1 / np.sqrt(84), dtype="float32",
                             backend=backend, seed=MODEL_SEED)


def main() -> None:
    timer = common.Timer()
    backend = common.pick_backend()
    text = load_corpus()
    tok = CharTokenizer(text)
    ids = tok.encode(text)
    train, held_out = train_val_split(ids, 0.9)
    print(f"corpus: {len(text):,} characters, vocabulary {tok.vocab_size}, "
          f"train {len(train):,}, held-out {len(held_out):,}; backend {backend}")
    print(f"seeds: model {MODEL_SEED}, schedule {SCHEDULE_SEED}, sampler {SAMPLE_SEED}")

    # The schedule first, from its own generator: building models cannot shift it.
    schedule = window_schedule(len(train), CONTEXT, BATCH, STEPS,
                               np.random.default_rng(SCHEDULE_SEED))  # (STEPS, BATCH)
    first = DecoderLM(config(tok.vocab_size, "sinusoidal", backend))
    initial = first.state_dict()
    init_fp, sched_fp = fingerprint(initial), fingerprint(schedule)
    print(f"parameters: {first.num_parameters():,}")
    print(f"initial state fingerprint: {init_fp[:12]}...")
    print(f"window schedule fingerprint: {sched_fp[:12]}...")

    runs = {}
    for positions in ("sinusoidal", "none"):
        t = common.Timer()
        model = DecoderLM(config(tok.vocab_size, positions, backend))
        model.load_state_dict(initial, strict=True)  # paired start: the same tensors
        assert fingerprint(model.state_dict()) == init_fp
        trainer = Trainer(model, Adam(lr=LR, backend=backend), constant_lr(LR), clip=CLIP)

        def log(r, positions=positions):
            if (r.step - 1) % 250 == 0:
                print(f"[{positions}] step {r.step - 1:4d}  loss {r.loss:.4f}", flush=True)

        trainer.fit(lm_batches(train, schedule, CONTEXT), STEPS, progress=False, on_step=log)
        train_seconds = t.seconds
        losses = {"train": fixed_window_loss(model.forward, train, CONTEXT),
                  "held_out": fixed_window_loss(model.forward, held_out, CONTEXT)}
        # The chapter's sampler: no KV cache, the last CONTEXT characters re-read every step.
        text_out = tok.decode(generate(model, tok.encode(PROMPT), 300,
                                       np.random.default_rng(SAMPLE_SEED), temperature=0.8,
                                       use_cache=False, policy="recompute"))
        print(f"[{positions}] fixed-window train loss {losses['train']:.4f}, "
              f"held-out loss {losses['held_out']:.4f} ({train_seconds:.0f} s training)")
        print(f"[{positions}] sample:\n{text_out}\n")
        np.savez("/tmp/charlm_" + positions + ".npz", **model.state_dict())  # for re-plotting
        runs[positions] = {"model": model, "curve": np.array([r.loss for r in trainer.log]),
                           "losses": losses, "sample": text_out,
                           "train_seconds": train_seconds}

    # Attention maps of the positional model on a held-out snippet.
    model = runs["sinusoidal"]["model"]
    start = int(np.flatnonzero(held_out == tok.encode("\n")[0])[0]) + 1  # a line start
    snippet = held_out[start:start + 32]
    common.keep_attention(model.decoder.blocks)
    model.forward(snippet[None, :])
    maps = common.collect_attention(model.decoder.blocks)[:, 0]  # (layers, H, T, T)
    future = np.triu(np.ones((len(snippet), len(snippet)), dtype=bool), k=1)
    max_future = float(maps[..., future].max())
    row_err = float(np.abs(maps.sum(-1) - 1).max())
    assert max_future == 0.0 and row_err < 1e-5
    print(f"attention audit: max future weight {max_future}, max row-sum error {row_err:.2e}")
    chars = [repr(c)[1:-1] for c in tok.decode(snippet)]
    fig = common.attention_grid(maps, chars, chars, row_names=["block 0", "block 1"],
                                suptitle="Char model (sinusoidal positions): attention on a "
                                         "held-out snippet", cell=3.2)
    common.save_figure(fig, "charlm_attention")

    # Matched training curves and the fixed-window losses.
    fig, (a, b) = common.plt.subplots(1, 2, figsize=(11, 3.8),
                                      gridspec_kw={"width_ratios": [2, 1]})
    common.plot_curves(a, {"sinusoidal positions": runs["sinusoidal"]["curve"],
                           "no positions": runs["none"]["curve"]}, window=50,
                       title="Paired runs: same initial tensors, same windows")
    a.set_ylim(0.8, 3.5)
    xs = np.arange(2)
    for i, split in enumerate(("train", "held_out")):
        vals = [runs[p]["losses"][split] for p in ("sinusoidal", "none")]
        bars = b.bar(xs + (i - 0.5) * 0.38, vals, 0.38, label=split.replace("_", "-"))
        b.bar_label(bars, fmt="%.3f", fontsize=8)
    b.set_xticks(xs, ["sinusoidal", "none"])
    b.set_ylabel("fixed-window loss (nats/char)")
    b.set_title("Fixed-window losses")
    b.legend()
    common.save_figure(fig, "charlm_curves")

    common.save_json("charlm", {
        "command": "python experiments/charlm.py",
        "protocol": {"context": CONTEXT, "batch": BATCH, "steps": STEPS, "lr": LR,
                     "clip": CLIP, "optimizer": "Adam (no weight decay), constant lr",
                     "model_seed": MODEL_SEED, "schedule_seed": SCHEDULE_SEED,
                     "sample_seed": SAMPLE_SEED, "backend": backend, "dtype": "float32"},
        "corpus": {"characters": len(text), "vocab": tok.vocab_size, "train": len(train),
                   "held_out": len(held_out)},
        "parameters": first.num_parameters(),
        "fingerprints": {"initial_state": init_fp, "window_schedule": sched_fp},
        "losses": {p: runs[p]["losses"] for p in runs},
        "chapter": CHAPTER,
        "samples": {p: runs[p]["sample"] for p in runs},
        "attention_audit": {"snippet": tok.decode(snippet), "max_future_weight": max_future,
                            "max_row_sum_error": row_err},
        "curves": {p: np.round(runs[p]["curve"], 4) for p in runs},
        "train_seconds": {p: round(runs[p]["train_seconds"], 1) for p in runs},
        "wall_seconds": round(timer.seconds, 1),
    })
    print(f"total wall time {timer.seconds:.0f} s")


if __name__ == "__main__":
    main()

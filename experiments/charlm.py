"""The char-LM chapter's three models under the paired protocol (chapter 000, 16.6).

Three character models are trained on one corpus: the decoder-only Transformer with the fixed
sinusoidal position table, the same Transformer with none, and an LSTM of about the same size
(the chapter's "Chapter 12 LSTM"). Everything that can be shared is:

* the SAME windows in the same order for all three: the whole (steps, batch) schedule of
  window starts is drawn up front from its own generator, before any model exists;
* the SAME initial tensors for the two Transformers: one model is built, its state dict is
  copied into the other (the sinusoidal table is a buffer, not a parameter). The LSTM has its
  own architecture, hence its own initial tensors (torch.nn.LSTM's initialisation);
* the same number of updates, Adam, learning rate, global-norm clipping, and the same
  fixed-window evaluation (state reset at every window, for the LSTM too);
* the schedule and the initial states are fingerprinted (SHA-256) and printed.

Per seed k the model seed is k and the schedule seed 1234 + k, so seed 0 is the run of the
two-model version of this script, bit for bit. Seed 0 on the embedded corpus also draws 300
characters at temperature 0.8 from each model (the Transformers with the chapter's cropped
window, no cache; the LSTM carrying its state, one step per character) and draws the
positional model's attention maps on a held-out snippet (causality and row sums asserted).

Run: ``python experiments/charlm.py`` (seeds 0, 1, 2: about 12 minutes of one core per seed).
``--seeds 1 2`` runs some seeds (two processes can share the work); ``--summary`` only
redraws the figure and the table from the seeds' JSON files; ``--text FILE`` trains on a
plain-text file instead of the embedded corpus (its results are named after the file).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

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
from numpy_transformer.nn import LSTMLM, DecoderLM, LSTMConfig, TransformerConfig
from numpy_transformer.optim import Adam
from numpy_transformer.schedules import constant_lr
from numpy_transformer.train import Trainer, lm_batches

SCHEDULE_SEED = 1234  # + k for seed k: the window schedule's own generator
SAMPLE_SEED = 1_406_050  # the sampler's generator (the chapter's seed value)
CONTEXT, BATCH, STEPS, LR, CLIP = 100, 64, 2501, 2e-3, 1.0
PROMPT = "The gradient "
MODELS = ("sinusoidal", "none", "lstm")
LABELS = {"sinusoidal": "Transformer, sinusoidal positions",
          "none": "Transformer, no positions", "lstm": "LSTM"}
CHAPTER = {"sinusoidal": {"train": 1.1132, "held_out": 1.9190},
           "none": {"train": 1.8672, "held_out": 2.3405},
           "lstm": {"held_out": 1.8881}}


def transformer_config(vocab: int, positions: str, backend: str, seed: int) -> TransformerConfig:
    """The chapter's model (``TransformerConfig.chapter``: width 84, 4 heads of 21, FFN 168
    ReLU, 2 pre-LN blocks) with ``positions``."""
    return TransformerConfig.chapter(vocab, max_len=CONTEXT, positions=positions,
                                     embed_std=1 / np.sqrt(84), backend=backend, seed=seed)


def lstm_config(vocab: int, backend: str, seed: int) -> LSTMConfig:
    """``LSTMConfig.chapter``: embedding 85, one LSTM layer of 128, linear head: 132,336
    parameters at vocabulary 104 (the Transformer's 132,488 less 0.11%), 131,480 at the
    embedded corpus's 100."""
    return LSTMConfig.chapter(vocab, max_len=CONTEXT, backend=backend, seed=seed)


def train(label: str, model, train_ids: np.ndarray, schedule: np.ndarray, backend: str):
    """Train ``model`` on the schedule; returns (loss curve, seconds)."""
    timer = common.Timer()
    trainer = Trainer(model, Adam(lr=LR, backend=backend), constant_lr(LR), clip=CLIP)

    def log(r):
        if (r.step - 1) % 250 == 0:
            print(f"[{label}] step {r.step - 1:4d}  loss {r.loss:.4f}", flush=True)

    trainer.fit(lm_batches(train_ids, schedule, CONTEXT), STEPS, progress=False, on_step=log)
    return np.array([r.loss for r in trainer.log]), timer.seconds


def run_seed(seed: int, tok: CharTokenizer, train_ids, held_out, backend: str,
             extras: bool) -> tuple[dict, dict]:
    """The three paired runs of one seed; returns (JSON record, trained models)."""
    schedule = window_schedule(len(train_ids), CONTEXT, BATCH, STEPS,
                               np.random.default_rng(SCHEDULE_SEED + seed))  # (STEPS, BATCH)
    first = DecoderLM(transformer_config(tok.vocab_size, "sinusoidal", backend, seed))
    initial = first.state_dict()
    lstm = LSTMLM(lstm_config(tok.vocab_size, backend, seed))
    fps = {"initial_state": fingerprint(initial), "window_schedule": fingerprint(schedule),
           "lstm_initial_state": fingerprint(lstm.state_dict())}
    params = {"transformer": first.num_parameters(), "lstm": lstm.num_parameters()}
    print(f"seed {seed}: model seed {seed}, schedule seed {SCHEDULE_SEED + seed}; parameters "
          f"{params['transformer']:,} (Transformer), {params['lstm']:,} (LSTM, "
          f"{params['lstm'] / params['transformer'] - 1:+.2%})")
    for name, fp in fps.items():
        print(f"  {name} fingerprint: {fp[:12]}...")
    models, record = {}, {"seed": seed, "schedule_seed": SCHEDULE_SEED + seed,
                          "parameters": params, "fingerprints": fps, "losses": {},
                          "curves": {}, "train_seconds": {}}
    for name in MODELS:
        if name == "lstm":
            model = lstm
        else:
            model = DecoderLM(transformer_config(tok.vocab_size, name, backend, seed))
            model.load_state_dict(initial, strict=True)  # paired start: the same tensors
            assert fingerprint(model.state_dict()) == fps["initial_state"]
        curve, seconds = train(f"{name}, seed {seed}", model, train_ids, schedule, backend)
        losses = {"train": fixed_window_loss(model.forward, train_ids, CONTEXT),
                  "held_out": fixed_window_loss(model.forward, held_out, CONTEXT)}
        print(f"[{name}, seed {seed}] fixed-window train loss {losses['train']:.4f}, "
              f"held-out loss {losses['held_out']:.4f} ({seconds:.0f} s training)", flush=True)
        models[name] = model
        record["losses"][name] = losses
        record["curves"][name] = np.round(curve, 4)
        record["train_seconds"][name] = round(seconds, 1)
    if extras:
        record.update(samples_and_attention(models, tok, held_out))
    return record, models


def samples_and_attention(models: dict, tok: CharTokenizer, held_out: np.ndarray) -> dict:
    """300 sampled characters per model; the positional model's attention maps, audited."""
    samples = {}
    for name, model in models.items():
        # The chapter's sampler for the Transformers: no KV cache, the last CONTEXT characters
        # re-read every step. The LSTM carries its state: one step per character.
        window = {} if name == "lstm" else {"use_cache": False, "policy": "recompute"}
        samples[name] = tok.decode(generate(model, tok.encode(PROMPT), 300,
                                            np.random.default_rng(SAMPLE_SEED),
                                            temperature=0.8, **window))
        print(f"[{name}] sample:\n{samples[name]}\n")
    model = models["sinusoidal"]
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
    return {"samples": samples,
            "attention_audit": {"snippet": tok.decode(snippet), "max_future_weight": max_future,
                                "max_row_sum_error": row_err}}


def summarise(name: str, records: list[dict]) -> None:
    """Per-model mean and spread over the seeds, the figure, ``results/<name>_summary.json``."""
    held = {m: np.array([r["losses"][m]["held_out"] for r in records]) for m in MODELS}
    gaps = {"none - sinusoidal": held["none"] - held["sinusoidal"],
            "sinusoidal - lstm": held["sinusoidal"] - held["lstm"]}
    seeds = [r["seed"] for r in records]
    print(f"\nheld-out loss over seeds {seeds} (chapter: one seed)")
    for m in MODELS:
        print(f"  {LABELS[m]:<36} {' '.join(f'{v:.4f}' for v in held[m])}   mean "
              f"{held[m].mean():.4f}, range {np.ptp(held[m]):.4f}   chapter "
              f"{CHAPTER[m]['held_out']:.4f}")
    for g, v in gaps.items():
        print(f"  gap {g:<30} {' '.join(f'{x:+.4f}' for x in v)}   mean {v.mean():+.4f}")

    fig, (a, b) = common.plt.subplots(1, 2, figsize=(12, 4),
                                      gridspec_kw={"width_ratios": [2, 1]})
    first = records[0]
    common.plot_curves(a, {LABELS[m]: np.asarray(first["curves"][m]) for m in MODELS},
                       window=50, title=f"Paired runs, seed {first['seed']}: same windows "
                                        f"(Transformers: same initial tensors)")
    a.set_ylim(0.8, 3.5)
    xs = np.arange(len(MODELS))
    b.bar(xs, [held[m].mean() for m in MODELS], 0.6, color="0.85",
          label=f"mean of {len(seeds)} seed(s)")
    for i, m in enumerate(MODELS):
        b.scatter(np.full(len(seeds), i), held[m], color="C0", zorder=3,
                  label="one seed" if i == 0 else None)
        b.scatter([i], [CHAPTER[m]["held_out"]], marker="x", color="C3", zorder=3,
                  label="chapter (its own corpus)" if i == 0 else None)
        b.annotate(f"{held[m].mean():.3f}", (i, held[m].max()), textcoords="offset points",
                   xytext=(0, 4), ha="center", fontsize=8)
    b.set_xticks(xs, ["sinusoidal", "no positions", "LSTM"])
    b.set_ylabel("fixed-window held-out loss (nats/char)")
    top = max(max(held[m].max(), CHAPTER[m]["held_out"]) for m in MODELS)
    b.set_ylim(0, 1.12 * top)
    b.set_title("Held-out loss by seed")
    b.legend(fontsize=8, loc="lower left")
    common.save_figure(fig, f"{name}_curves")
    common.save_json(f"{name}_summary", {
        "command": "python experiments/charlm.py --summary", "seeds": seeds,
        "held_out": {m: held[m] for m in MODELS},
        "train": {m: [r["losses"][m]["train"] for r in records] for m in MODELS},
        "mean_held_out": {m: held[m].mean() for m in MODELS},
        "range_held_out": {m: np.ptp(held[m]) for m in MODELS},
        "gaps": gaps, "chapter": CHAPTER, "parameters": first["parameters"]})


def record_name(name: str, seed: int) -> str:
    return name if seed == 0 else f"{name}_seed{seed}"  # seed 0 keeps the old file name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--text", type=Path, help="a plain-text file instead of the corpus")
    parser.add_argument("--summary", action="store_true",
                        help="only redraw the summary from the seeds' JSON files")
    args = parser.parse_args()
    name = "charlm" if args.text is None else f"charlm_{args.text.stem}"
    backend = common.pick_backend()
    text = load_corpus() if args.text is None else args.text.read_text(encoding="utf-8")
    tok = CharTokenizer(text)
    ids = tok.encode(text)
    train_ids, held_out = train_val_split(ids, 0.9)
    corpus = {"source": str(args.text or "embedded corpus"), "characters": len(text),
              "vocab": tok.vocab_size, "train": len(train_ids), "held_out": len(held_out)}
    print(f"corpus: {corpus}; backend {backend}")
    for seed in [] if args.summary else args.seeds:
        timer = common.Timer()
        record, _ = run_seed(seed, tok, train_ids, held_out, backend,
                             extras=seed == 0 and args.text is None)
        common.save_json(record_name(name, seed), {
            "command": f"python experiments/charlm.py --seeds {seed}"
                       + (f" --text {args.text}" if args.text else ""),
            "protocol": {"context": CONTEXT, "batch": BATCH, "steps": STEPS, "lr": LR,
                         "clip": CLIP, "optimizer": "Adam (no weight decay), constant lr",
                         "model_seed": seed, "schedule_seed": SCHEDULE_SEED + seed,
                         "sample_seed": SAMPLE_SEED, "backend": backend, "dtype": "float32",
                         "lstm": "embedding 85, 1 layer of 128, linear head"},
            "corpus": corpus, "chapter": CHAPTER, **record,
            "wall_seconds": round(timer.seconds, 1)})
    paths = [common.RESULTS / f"{name}.json", *common.RESULTS.glob(f"{name}_seed*.json")]
    records = [json.loads(p.read_text()) for p in paths if p.exists()]
    records = sorted((r for r in records if "lstm" in r["losses"]),  # three-model records
                     key=lambda r: r["seed"])
    if records:
        summarise(name, records)


if __name__ == "__main__":
    main()

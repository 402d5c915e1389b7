"""Bring weights back from PyTorch or Hugging Face and study a gradient by hand.

    python examples/study_gradient.py runs/char-lm/safetensors/ddp        # after continue_ddp
    python examples/study_gradient.py my-gpt2-dir                          # a transformers dir
    python examples/study_gradient.py runs/tuned                   # a run folder (an import)

1. Reads the weights: a ``model.safetensors`` written by ``numpy-transformer export`` or
   ``examples/continue_ddp.py`` (config and tokenizer in its metadata), a Hugging Face
   directory of GPT-2's or LLaMA's shape with its own tokenizer, characters or byte-level BPE
   (``numpy_transformer.export.load_model``), or a run folder (``numpy_transformer.load_run``:
   one that ``numpy-transformer import`` made, say).
2. Rebuilds the model on the readable NumPy references without dropout (the gradient of a
   deterministic function), runs one forward and one hand-written backward of the
   cross-entropy on a batch of the text, and prints the loss and the gradient of each block's
   tensors, largest first: every number there comes from lines of NumPy you can read
   (``numpy_transformer/functional``).
3. Checks that gradient in float64 against finite differences along one random direction
   (``gradcheck.check_direction``).

Needs ``pip install "numpy_transformer[hf]"`` (safetensors; transformers and tokenizers for a
directory).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

from numpy_transformer import load_run
from numpy_transformer.corpus import load_corpus
from numpy_transformer.data import CharTokenizer, get_batch, load_text, window_schedule
from numpy_transformer.export import load_model
from numpy_transformer.functional import cross_entropy_backward, cross_entropy_forward
from numpy_transformer.gradcheck import check_direction


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", type=Path, help="a folder with model.safetensors, a .safetensors "
                   "file, a Hugging Face model directory or a run folder")
    p.add_argument("--text", type=Path, help="text for the batch [the run's, or the embedded "
                   "corpus]")
    p.add_argument("--batch", type=int, default=8, help="windows in the batch [8]")
    p.add_argument("--context", type=int, help="window length, at most the model's [the "
                   "model's, or 64 if that is longer]")
    p.add_argument("--top", type=int, default=12, help="tensors to list [12]")
    return p.parse_args()


def load(source: Path) -> tuple:
    """``(model, tokenizer, the text it trained on or None)`` of ``source``, whichever kind,
    the model rebuilt on the NumPy references without dropout, in training mode."""
    if (source / "checkpoint.npz").is_file():
        run = load_run(source)
        stored, tokenizer, trained_on = run.model, run.tokenizer, run.options.text
    else:
        exported = load_model(source)
        stored, tokenizer = exported.model, exported.tokenizer
        trained_on = exported.info.get("options", {}).get("text")
    no_dropout = {"dropout": 0.0, "attn_dropout": 0.0} if hasattr(stored.config, "attn_dropout") \
        else {"dropout": 0.0}
    config = dataclasses.replace(stored.config, backend="numpy", **no_dropout)
    model = type(stored)(config)
    model.load_state_dict(stored.state_dict())
    return model, tokenizer, trained_on


def main() -> None:
    args = parse_args()
    model, tokenizer, trained_on = load(args.source)
    if tokenizer is None:
        raise SystemExit(f"{args.source}: this example needs a language model and its tokenizer")
    text_path = args.text or trained_on
    text = load_text(text_path) if text_path else load_corpus()
    # a character model skips the characters it has no id for; a BPE encodes any text
    ids = (tokenizer.encode(text, unknown="skip") if isinstance(tokenizer, CharTokenizer)
           else tokenizer.encode(text))
    context = min(model.config.max_len, args.context or 64)
    starts = window_schedule(len(ids), context, args.batch, 1, np.random.default_rng(0))[0]
    x, y = get_batch(ids, starts, context)

    # 2. one forward and one backward, by hand
    model.zero_grad()
    loss, cache = cross_entropy_forward(model(x), y)
    model.backward(cross_entropy_backward(1.0, cache))
    print(f"{type(model).__name__}, {model.num_parameters():,} parameters, "
          f"{model.config.dtype}; loss on a batch of {args.batch} windows of {context}: "
          f"{loss:.6f}")
    norms = sorted(((float(np.linalg.norm(g)), name) for name, _, g in model.named_parameters()),
                   reverse=True)
    print(f"largest gradients (of {len(norms)} tensors):")
    for norm, name in norms[:args.top]:
        print(f"  {norm:10.3e}  {name}")

    # 3. the same gradient against finite differences, in float64, on two windows. The step
    # is small because the direction moves every parameter at once: in a trained ReLU
    # network many pre-activations sit near 0, and a step that carries one across its kink
    # makes the finite difference wrong, not the gradient (a smooth GELU or SwiGLU network
    # takes larger steps as well; float64 rounding only shows below about 1e-8).
    model.astype(np.float64)
    report = check_direction(model, {"tokens": x[:2]}, h=1e-7)
    print(f"float64 check along a random direction: relative error "
          f"{report.max_rel:.1e} ({'ok' if report.ok(1e-6) else 'FAILED'})")


if __name__ == "__main__":
    main()

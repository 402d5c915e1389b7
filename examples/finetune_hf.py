"""Fine-tune an exported model with Hugging Face ``transformers``, then save it where
``numpy-transformer import`` reads it: the road back for a gradient study.

    numpy-transformer export runs/llama --format hf --out llama-hf
    python examples/finetune_hf.py llama-hf tuned --steps 20
    numpy-transformer import tuned --out runs/tuned

1. Loads the folder with ``AutoModelForCausalLM`` (``GPT2LMHeadModel`` or
   ``LlamaForCausalLM``) and its tokenizer with ``AutoTokenizer``: the tokenizer the export
   wrote, one token per character.
2. Trains it for ``--steps`` steps of AdamW on random windows of ``--text`` (default: the
   embedded corpus, the default run's text), with ``transformers``' own loss
   (``labels=``): nothing of this library runs here.
3. Saves the model with ``save_pretrained`` and copies the export's tokenizer files beside
   it, so the folder imports back with the vocabulary it was trained with.

Needs ``pip install "numpy_transformer[torch,hf]"``.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", type=Path, help="a folder written by export --format hf")
    p.add_argument("out", type=Path, help="where the fine-tuned model goes")
    p.add_argument("--text", type=Path, help="UTF-8 text to train on [the embedded corpus]")
    p.add_argument("--steps", type=int, default=20, help="AdamW steps [20]")
    p.add_argument("--batch", type=int, default=8, help="windows per step [8]")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate [1e-3]")
    return p.parse_args()


def main() -> None:
    import torch
    import transformers

    from numpy_transformer.corpus import load_corpus

    args = parse_args()
    model = transformers.AutoModelForCausalLM.from_pretrained(args.source)
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.source)
    text = args.text.read_text(encoding="utf-8") if args.text else load_corpus()
    ids = torch.tensor(tokenizer(text)["input_ids"])
    context = model.config.max_position_embeddings
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for step in range(args.steps):
        starts = torch.randint(0, len(ids) - context, (args.batch,), generator=generator)
        batch = torch.stack([ids[s:s + context] for s in starts.tolist()])
        loss = model(batch, labels=batch).loss  # transformers shifts the labels itself
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step + 1}: loss {loss.item():.4f}")
    model.save_pretrained(args.out)
    for name in TOKENIZER_FILES:
        shutil.copy(args.source / name, args.out / name)
    print(f"wrote {args.out}: numpy-transformer import {args.out} --out RUN_DIR")


if __name__ == "__main__":
    main()

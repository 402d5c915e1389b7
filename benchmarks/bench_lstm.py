"""One training step of the char-LM chapter's LSTM, ours against ``torch.nn.LSTM``.

The benchmark is the ``lstm`` configuration of ``numpy_transformer/bench/train_step.py`` (its
docstring describes the variants and how they are timed); this script runs it with the
defaults of the LSTM's table in ``benchmarks/README.md``::

    python benchmarks/bench_lstm.py                    # 2 threads, 40 steps each, 8 rounds
    python benchmarks/bench_lstm.py --threads 1,2 --steps 60
    python benchmarks/bench_lstm.py --quick            # a few steps

The model is ``LSTMLM(LSTMConfig(vocab=104, embed=85, hidden=128, max_len=100))``: 132,336
parameters, the size of the three-way comparison (``experiments/charlm.py``), float32, at the
chapter's batch 64 x context 100. Its PyTorch twin (``numpy_transformer.torch_twins``) is
``nn.Embedding`` + ``nn.LSTM(batch_first=True)`` + ``nn.Linear`` with the same initial weights.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's package

from numpy_transformer.bench.train_step import main  # noqa: E402

if __name__ == "__main__":
    main(["--config", "lstm", "--threads", "2", "--steps", "40", "--rounds", "8",
          "--no-numpy", *sys.argv[1:]])

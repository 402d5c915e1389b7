"""``examples/continue_ddp.py`` under ``torchrun --nproc_per_node 2`` (gloo, CPU): the exported
run continues in two processes exactly as it would have here, and their weights stay equal."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="DistributedDataParallel needs PyTorch")
pytest.importorskip("safetensors", reason="the exchange format needs safetensors")

from numpy_transformer.corpus import load_corpus  # noqa: E402
from numpy_transformer.data import CharTokenizer, get_batch, window_schedule  # noqa: E402
from numpy_transformer.export import export_run, load_safetensors  # noqa: E402
from numpy_transformer.functional import cross_entropy_backward, cross_entropy_forward  # noqa: E402
from numpy_transformer.nn import DecoderLM, TransformerConfig  # noqa: E402
from numpy_transformer.optim import Adam, clip_grad_norm  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONTEXT, BATCH, CLIP, STEPS_HERE, STEPS_THERE = 16, 4, 1.0, 3, 3


def step(model, opt, x, y) -> float:
    """One training step here: loss, hand-written backward, global-norm clip, Adam."""
    model.zero_grad()
    loss, cache = cross_entropy_forward(model(x), y)
    model.backward(cross_entropy_backward(1.0, cache))
    grads = {n: g for n, _, g in model.named_parameters()}
    clip_grad_norm(grads, CLIP)
    opt.step({n: p for n, p, _ in model.named_parameters()}, grads)
    return float(loss)


def test_continue_with_ddp_on_two_processes(tmp_path):
    text = load_corpus()[:3000]
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    tok = CharTokenizer(text)
    ids = tok.encode(text)
    cfg = TransformerConfig(vocab=tok.vocab_size, width=16, heads=2, layers=1, ffn_width=32,
                            max_len=CONTEXT, positions="rope", dtype="float64", backend="numpy")
    model, opt = DecoderLM(cfg), Adam(lr=1e-2, backend="numpy")
    for starts in window_schedule(len(ids), CONTEXT, BATCH, STEPS_HERE, np.random.default_rng(0)):
        step(model, opt, *get_batch(ids, starts, CONTEXT))
    options = {"text": str(tmp_path / "text.txt"), "batch": BATCH, "clip": CLIP}
    export_run(tmp_path / "export", "safetensors", model, tok, opt, info={"options": options})

    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node", "2", str(ROOT / "examples" / "continue_ddp.py"),
                          str(tmp_path / "export"), "--steps", str(STEPS_THERE), "--seed", "7"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr

    # the same steps here, without leaving: the reference the DDP run must follow
    first_x, first_y = get_batch(ids, window_schedule(len(ids), CONTEXT, BATCH, STEPS_THERE,
                                                      np.random.default_rng(7))[0], CONTEXT)
    exported_loss = float(cross_entropy_forward(model(first_x), first_y)[0])
    here = [step(model, opt, *get_batch(ids, starts, CONTEXT)) for starts in
            window_schedule(len(ids), CONTEXT, BATCH, STEPS_THERE, np.random.default_rng(7))]
    log = [json.loads(line) for line in
           (tmp_path / "export" / "ddp" / "log.jsonl").read_text().splitlines()]
    there = [r["loss"] for r in log]
    assert abs(log[0]["numpy_transformer_loss"] - exported_loss) <= 1e-14 * exported_loss
    assert abs(there[0] - exported_loss) <= 1e-12 * exported_loss  # first loss = ours
    np.testing.assert_allclose(there, here, rtol=1e-11)  # and the run continues as here
    assert there[-1] < there[0]

    # 16 hex digits: the two ranks share one stdout, where their lines may run together
    fingerprints = dict(re.findall(r"rank (\d): weights ([0-9a-f]{16})", run.stdout))
    assert set(fingerprints) == {"0", "1"}, run.stdout
    assert fingerprints["0"] == fingerprints["1"]
    back = load_safetensors(tmp_path / "export" / "ddp" / "model.safetensors", backend="numpy")
    for name, p, _ in model.named_parameters():
        np.testing.assert_allclose(back.model.state_dict()[name], p, rtol=1e-10, atol=1e-13,
                                   err_msg=name)

    # and back here to study a gradient (docs/outgrowing.md's fourth command)
    study = subprocess.run([sys.executable, str(ROOT / "examples" / "study_gradient.py"),
                            str(tmp_path / "export" / "ddp")], capture_output=True, text=True,
                           env=env, timeout=120)
    assert study.returncode == 0, study.stdout + study.stderr
    assert "largest gradients (of 21 tensors)" in study.stdout
    assert study.stdout.rstrip().endswith("(ok)")

"""``train --tensorboard``: the event files hold log.jsonl's numbers, read back record by record
from the files themselves; a resume replaces the steps it recomputes; without tensorboardX the
option is one line and exit 2."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from _run_helpers import TINY, one_line_error, run_cli, small_text

from numpy_transformer.runs.outputs import EVENTS_FOLDER as FOLDER
from numpy_transformer.runs.tensorboard import scalars

event_pb2 = pytest.importorskip("tensorboardX.proto.event_pb2",
                                reason="needs tensorboardX (the tensorboard extra)")


def read_events(folder: Path) -> dict[tuple[str, int], float]:
    """``{(tag, step): value}`` of every scalar in the folder's event files, the later file's
    value where two hold the same step (TFRecord framing: length, its CRC, the Event, its
    CRC)."""
    values: dict[tuple[str, int], float] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data, i = path.read_bytes(), 0
        while i < len(data):
            (length,) = struct.unpack("<Q", data[i:i + 8])
            event = event_pb2.Event.FromString(data[i + 12:i + 12 + length])
            i += 12 + length + 4
            for value in event.summary.value:
                values[(value.tag, event.step)] = value.simple_value
    return values


def logged(run_dir: Path) -> dict[tuple[str, int], float]:
    """The same numbers from log.jsonl (float32, as the events keep them)."""
    records = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    return {(tag, r["step"]): float(np.float32(v)) for r in records
            for tag, v in scalars(r) if not r.get("final")}


def test_the_events_hold_the_logs_numbers_and_a_resume_replaces_its_steps(tmp_path):
    run_dir = tmp_path / "run"
    argv = ["train", *TINY, "--text", small_text(tmp_path), "--eval-every", "2",
            "--stats-every", "2", "--tensorboard", "--out", run_dir, "--quiet"]
    code, _, err = run_cli([*argv, "--steps", "4"])
    assert code == 0, err
    events, log = read_events(run_dir / FOLDER), logged(run_dir)
    assert events == log
    tags = {tag for tag, _ in events}
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "val_loss"} <= tags
    assert any(tag.startswith("update_ratio/") for tag in tags)
    code, _, err = run_cli(["train", "--resume", run_dir, "--steps", "6", "--quiet"])
    assert code == 0, err
    events, log = read_events(run_dir / FOLDER), logged(run_dir)
    assert {step for _, step in events} == {step for _, step in log} == set(range(1, 7))
    # the resumed steps' numbers are the log's, not the first run's
    assert {k: v for k, v in events.items() if k[1] > 4} == \
        {k: v for k, v in log.items() if k[1] > 4}
    # negative control: an event file read wrong (one record shifted) does not match
    shifted = {(tag, step + 1): v for (tag, step), v in events.items()}
    assert shifted != log


def test_scalars_of_a_record():
    record = {"step": 3, "loss": 1.5, "time": 1e9, "final": True, "val_acc": 0.25,
              "tensor_stats": {"embed.table": {"grad_norm": 2.0, "update_ratio": 1e-3}}}
    assert dict(scalars(record)) == {"loss": 1.5, "val_acc": 0.25,
                                     "grad_norm/embed.table": 2.0,
                                     "update_ratio/embed.table": 1e-3}


def test_without_tensorboardx_the_option_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import fails as if not installed
    run_dir = tmp_path / "run"
    code, _, err = run_cli(["train", *TINY, "--text", small_text(tmp_path), "--steps", "2",
                            "--tensorboard", "--out", run_dir, "--quiet"])
    assert code == 2 and one_line_error(err), err
    assert 'pip install "numpy_transformer[tensorboard]"' in err
    assert not run_dir.exists()  # refused before the folder was made

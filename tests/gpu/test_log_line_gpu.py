"""The step line's MFU and memory on a GPU (make test-gpu; about 1 minute on an H200).

test_mfu_and_memory_on_gpu   a 4-step tiny BF16 run on CUDA: every record has mfu =
    tflops_per_gpu / the table's peak for this GPU (train/logs/log_line.py; on a GPU the table
    lacks, logging.peak_tflops=100 gives the peak) and mem_gib; the printed lines carry
    `MFU` and `mem`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from _cli import run, train_cmd

from ufp4_megatron.train.logs import log_line


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_mfu_and_memory_on_gpu(tmp_path):
    peak = log_line.peak_tflops(torch.cuda.get_device_name(), None)
    extra = [] if peak else ["logging.peak_tflops=100"]
    r = run(
        train_cmd(
            tmp_path / "run",
            tmp_path / "cache",
            "precision=bf16",
            "train.steps=4",
            "logging.wandb.mode=disabled",
            "checkpoint.save_at_end=false",
            *extra,
        ),
        tmp_path,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        assert row["mfu"] == pytest.approx(row["tflops_per_gpu"] / (peak or 100.0))
        assert row["mem_gib"] > 0
    lines = [x for x in r.stdout.splitlines() if x.startswith("step ")]
    assert len(lines) == 4 and all(" | MFU " in x and " | mem " in x for x in lines), r.stdout

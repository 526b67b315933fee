"""ufp4-compare at the end of a Hydra multirun (report/hydra_callback.py).

    test_multirun_ends_with_the_comparison   `-m precision=bf16,ufp4`: <sweep>/compare written,
        the ufp4 run logged its live gap against the sweep's bf16 run
    test_callback_is_a_default_and_can_be_removed   hydra/callbacks=compare; ~hydra/callbacks
    test_unusable_sweep_is_said_not_raised   no bf16 run: one line, the sweep's result stands
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose
from omegaconf import OmegaConf

from ufp4_megatron.train.overrides import training_configs
from _runs import offline_env, write_run
from ufp4_megatron.report.hydra_callback import CompareAfterSweep
from ufp4_megatron.report.wandb_offline import find_run_file, read_run

ROOT = Path(__file__).resolve().parents[2]


def test_multirun_ends_with_the_comparison(tmp_path):
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "ufp4_megatron.train", "-m", "precision=bf16,ufp4",
           "model=tiny", "train.steps=3", "train.seq_len=32", "train.micro_batch=2",
           "train.global_batch=2", "optim.warmup_steps=2", "logging.progress=plain",
           "data.corpus_max_bytes=1500000", f"data.cache_dir={tmp_path / 'cache'}",
           "experiment=sweeptest", "logging.wandb.mode=offline", "checkpoint.save_at_end=false",
           f"hydra.sweep.dir={sweep}"]
    r = subprocess.run(cmd, cwd=tmp_path, env=offline_env(tmp_path), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"compare after the sweep: 2 runs under {sweep}" in r.stdout
    data = json.loads((sweep / "compare" / "loss_gap.json").read_text())
    (ufp4,) = data["recipes"]
    assert ufp4["recipe"] == "ufp4" and ufp4["n_seeds"] == 1
    cmp = read_run(find_run_file(sweep / "compare"))
    assert cmp["group"] == "sweeptest" and cmp["job_type"] == "compare"
    runs = [d for d in sweep.iterdir() if (d / "metrics.jsonl").exists()]
    ufp4_dir = next(d for d in runs if "ufp4" in d.name)
    live = [h["gap_vs_bf16"] for h in read_run(find_run_file(ufp4_dir))["history"]
            if "gap_vs_bf16" in h]
    assert len(live) == 3 and sum(live) / 3 == pytest.approx(ufp4["train_gap"]["mean"])


def test_callback_is_a_default_and_can_be_removed():
    with training_configs():
        on = compose("config", return_hydra_config=True).hydra.callbacks
        off = compose("config", overrides=["~hydra/callbacks"], return_hydra_config=True)
    assert on.compare._target_ == "ufp4_megatron.report.hydra_callback.CompareAfterSweep"
    assert "compare" not in off.hydra.callbacks


def test_unusable_sweep_is_said_not_raised(tmp_path, capsys):
    write_run(tmp_path / "sweep" / "tiny-ufp4-s1", "ufp4", 1, [2.0, 1.9])
    config = OmegaConf.create({"experiment": "x",
                               "hydra": {"sweep": {"dir": str(tmp_path / "sweep")}},
                               "logging": {"wandb": {"mode": "disabled", "project": "p",
                                                     "entity": None}}})
    CompareAfterSweep().on_multirun_end(config)
    assert "compare after the sweep: not compared: no 'bf16' run among the 1 given" in \
        capsys.readouterr().out
    assert not (tmp_path / "sweep" / "compare").exists()

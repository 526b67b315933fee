"""ufp4-compare at the end of a Hydra multirun (report/hydra_callback.py).

test_multirun_ends_with_the_comparison   `-m precision=bf16,ufp4`: <sweep>/compare written,
    the ufp4 run logged its live gap against the sweep's bf16 run
test_callback_is_a_default_and_can_be_removed   hydra/callbacks=compare; ~hydra/callbacks
test_unusable_sweep_is_said_not_raised   no bf16 run: one line, the sweep's result stands
test_only_this_sweeps_runs_are_compared  an earlier smoke test's runs under the same sweep
    dir stay out (they would cut the table to their steps); a failed job too
test_concurrent_sweeps_keep_their_own_runs   two sweeps of one experiment at once; a job
    run by another process (submitit) records through a copy of the callback
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from _runs import offline_env, write_run
from hydra import compose
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from ufp4_megatron.report.hydra_callback import CompareAfterSweep
from ufp4_megatron.report.wandb_offline import find_run_file, read_run
from ufp4_megatron.train.overrides import training_configs

ROOT = Path(__file__).resolve().parents[2]


def test_multirun_ends_with_the_comparison(tmp_path):
    sweep = tmp_path / "sweep"
    # an earlier sweep's run of the same experiment (2 steps): not part of this comparison
    write_run(sweep / "tiny-bf16-s9-0badc0de", "bf16", 9, [5.0, 4.9], experiment="sweeptest")
    cmd = [
        sys.executable,
        "-m",
        "ufp4_megatron.train",
        "-m",
        "precision=bf16,ufp4",
        "model=tiny",
        "train.steps=3",
        "train.seq_len=32",
        "train.micro_batch=2",
        "train.global_batch=2",
        "optim.warmup_steps=2",
        "logging.progress=plain",
        "data.corpus_max_bytes=1500000",
        f"data.cache_dir={tmp_path / 'cache'}",
        "experiment=sweeptest",
        "logging.wandb.mode=offline",
        "checkpoint.save_at_end=false",
        f"hydra.sweep.dir={sweep}",
    ]
    r = subprocess.run(
        cmd, cwd=tmp_path, env=offline_env(tmp_path), capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"compare after the sweep: 2 runs of this sweep under {sweep}" in r.stdout
    assert not list(sweep.glob(".sweep-*"))  # the sweep's list is removed after the compare
    data = json.loads((sweep / "compare" / "loss_gap.json").read_text())
    (ufp4,) = data["recipes"]
    assert ufp4["recipe"] == "ufp4" and ufp4["n_seeds"] == 1
    cmp = read_run(find_run_file(sweep / "compare"))
    assert cmp["group"] == "sweeptest" and cmp["job_type"] == "compare"
    runs = [d for d in sweep.iterdir() if (d / "metrics.jsonl").exists() and "s9" not in d.name]
    ufp4_dir = next(d for d in runs if "ufp4" in d.name)
    live = [
        h["gap_vs_bf16"] for h in read_run(find_run_file(ufp4_dir))["history"] if "gap_vs_bf16" in h
    ]
    assert len(live) == 3 and sum(live) / 3 == pytest.approx(ufp4["train_gap"]["mean"])


def test_callback_is_a_default_and_can_be_removed():
    with training_configs():
        on = compose("config", return_hydra_config=True).hydra.callbacks
        off = compose("config", overrides=["~hydra/callbacks"], return_hydra_config=True)
    assert on.compare._target_ == "ufp4_megatron.report.hydra_callback.CompareAfterSweep"
    assert "compare" not in off.hydra.callbacks


def _config(sweep: Path):
    return OmegaConf.create(
        {
            "experiment": "x",
            "hydra": {"sweep": {"dir": str(sweep)}},
            "logging": {"wandb": {"mode": "disabled", "project": "p", "entity": None}},
        }
    )


def _job(run_dir: str, status=JobStatus.COMPLETED) -> JobReturn:
    """What Hydra's run_job hands on_job_end: the job's Hydra config and status."""
    return JobReturn(
        status=status,
        hydra_cfg=OmegaConf.create({"hydra": {"runtime": {"output_dir": str(run_dir)}}}),
    )


def test_unusable_sweep_is_said_not_raised(tmp_path, capsys):
    config = _config(tmp_path / "sweep")
    cb = CompareAfterSweep()
    cb.on_multirun_start(config)
    cb.on_job_end(
        config, _job(write_run(tmp_path / "sweep" / "tiny-ufp4-s1", "ufp4", 1, [2.0, 1.9]))
    )
    cb.on_multirun_end(config)
    assert (
        "compare after the sweep: not compared: no 'bf16' run among the 1 given"
        in capsys.readouterr().out
    )
    assert not (tmp_path / "sweep" / "compare").exists()


def test_only_this_sweeps_runs_are_compared(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    smoke = [write_run(sweep / f"tiny-{r}-s1-old", r, 1, [3.0, 2.9]) for r in ("bf16", "ufp4")]
    config = _config(sweep)
    cb = CompareAfterSweep(last=2)
    cb.on_multirun_start(config)
    for r, f in (("bf16", 1.0), ("ufp4", 1.01)):
        cb.on_job_end(
            config,
            _job(
                write_run(sweep / f"tiny-{r}-s2-new", r, 2, [f * v for v in (3.0, 2.8, 2.6, 2.4)])
            ),
        )
    cb.on_job_end(
        config,
        _job(write_run(sweep / "tiny-e2m1-s2-new", "e2m1", 2, [3.5]), status=JobStatus.FAILED),
    )
    assert cb.sweep_runs() == sorted(
        str((sweep / f"tiny-{r}-s2-new").resolve()) for r in ("bf16", "ufp4")
    )
    cb.on_multirun_end(config)
    out = capsys.readouterr().out
    assert f"compare after the sweep: 2 runs of this sweep under {sweep}" in out
    data = json.loads((sweep / "compare" / "loss_gap.json").read_text())
    (ufp4,) = data["recipes"]
    assert ufp4["n_seeds"] == 1 and ufp4["train_gap"]["mean"] == pytest.approx(0.01)
    assert "common steps" not in out  # not cut to the smoke runs' 2 steps
    assert all(s not in json.dumps(data) for s in smoke)


def test_concurrent_sweeps_keep_their_own_runs(tmp_path):
    sweep = tmp_path / "sweep"
    config = _config(sweep)
    a, b = CompareAfterSweep(), CompareAfterSweep()
    a.on_multirun_start(config)
    b.on_multirun_start(config)
    assert a.record != b.record and Path(a.record).is_absolute()
    remote = pickle.loads(pickle.dumps(a))  # how submitit hands the callback to a job
    remote.on_job_end(config, _job(write_run(sweep / "ra", "bf16", 1, [1.0])))
    b.on_job_end(config, _job(write_run(sweep / "rb", "bf16", 2, [1.0])))
    assert a.sweep_runs() == [str((sweep / "ra").resolve())]
    assert b.sweep_runs() == [str((sweep / "rb").resolve())]
    single = CompareAfterSweep()  # a single run (no multirun): on_job_end records nothing
    single.on_job_end(config, _job(sweep / "ra"))
    assert single.record is None

"""The gap live in W&B (train/live_gap.py), on real run dirs and real offline W&B runs.

test_gap_every_step_when_the_reference_is_ahead   gap_vs_bf16 = (L - L_bf16) / L_bf16 at
    each logged step, against its own tokens axis; no e2m1 run: said once, nothing logged
test_lagging_reference_catches_up        logged up to the reference's newest whole line,
    then at the step it reaches next; a reference cut back by a resume is read again
test_late_reference_is_found_on_rescan   a sweep that starts the BF16 run after this one
test_other_seed_or_batch_is_no_reference
test_nearest_reference_wins_two_in_one_place_are_ambiguous
test_trainer_logs_live_gap_and_compare_reads_both   real trainer runs (bf16, then ufp4
    with diagnostics): the training run's W&B keys, then ufp4-compare over the two dirs
    (make test-slow)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _runs import logged_table, offline_env
from hydra import compose
from omegaconf import OmegaConf

from ufp4_megatron.report.wandb_offline import find_run_file, read_run
from ufp4_megatron.train.live_gap import LiveGap
from ufp4_megatron.train.overrides import training_configs

ROOT = Path(__file__).resolve().parents[2]
BF16 = [3.0, 2.8, 2.6, 2.5, 2.4, 2.3]
UFP4 = [3.03, 2.814, 2.626, 2.5, 2.46, 2.323]  # gaps 1%, 0.5%, 1%, 0, 2.5%, 1%


@pytest.fixture(autouse=True)
def _wandb_dirs(tmp_path, monkeypatch):
    for k, v in offline_env(tmp_path).items():
        if k.startswith("WANDB"):
            monkeypatch.setenv(k, v)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)  # runs/<experiment>/ is looked up from here


def config(*overrides):
    with training_configs():
        return compose("config", overrides=["experiment=live", *overrides])


def run_dir(root: Path, name: str, *overrides, losses=(), partial: str = "") -> Path:
    """A run dir as the trainer leaves it: config.yaml (resolved) and metrics.jsonl."""
    d = root / name
    d.mkdir(parents=True)
    (d / ".hydra").mkdir()
    for name in ("config.yaml", ".hydra/config.yaml"):  # the trainer's copy, and Hydra's
        (d / name).write_text(OmegaConf.to_yaml(config(*overrides), resolve=True))
    write_metrics(d, losses, partial)
    return d


def write_metrics(d: Path, losses, partial: str = ""):
    lines = "".join(
        json.dumps({"step": i + 1, "loss": v, "tokens": 64 * (i + 1)}) + "\n"
        for i, v in enumerate(losses)
    )
    (d / "metrics.jsonl").write_text(lines + partial)


def live_run(tmp, root, *overrides, rescan_s=30.0):
    import wandb

    cfg = OmegaConf.to_object(config("precision=ufp4", *overrides))
    me = root / "ufp4"
    me.mkdir(parents=True, exist_ok=True)
    wb = wandb.init(project="t", mode="offline", dir=str(tmp), settings=wandb.Settings(quiet=True))
    return wb, LiveGap(cfg, me, wb, rescan_s=rescan_s)


def record(step):
    return {"step": step, "loss": UFP4[step - 1], "tokens": 64 * step}


def logged(wb):
    import wandb

    wb.finish()
    wandb.teardown()  # stops W&B's service process: the run file is complete after it
    hist = read_run(find_run_file(Path(wb.dir).parent))
    return {
        h["_step"]: (h["gap_vs_bf16"], h["gap_vs_bf16_at_tokens"])
        for h in hist["history"]
        if "gap_vs_bf16" in h
    }, hist


def expected(step):
    return pytest.approx(((UFP4[step - 1] - BF16[step - 1]) / BF16[step - 1], 64 * step))


def test_gap_every_step_when_the_reference_is_ahead(tmp_path, capsys):
    root = tmp_path / "runs" / "live"
    run_dir(root, "bf16", "precision=bf16", losses=BF16)
    wb, live = live_run(tmp_path, root)
    note = capsys.readouterr().out
    assert f"gap_vs_bf16 from {root / 'bf16'}" in note and "no e2m1 run" in note
    for step in range(1, 7):
        live.log(record(step))
    gaps, hist = logged(wb)
    assert sorted(gaps) == [1, 2, 3, 4, 5, 6]
    for step, got in gaps.items():
        assert got == expected(step)
    assert hist["metrics"]["gap_vs_bf16"] == "gap_vs_bf16_at_tokens"
    assert not any("gap_vs_e2m1" in h for h in hist["history"])


def test_lagging_reference_catches_up(tmp_path):
    root = tmp_path / "runs" / "live"
    ref = run_dir(root, "bf16", "precision=bf16", losses=BF16[:3], partial='{"step": 4, "lo')
    wb, live = live_run(tmp_path, root)
    for step in range(1, 6):  # the reference stays at step 3 (its 4th line half-written)
        live.log(record(step))
    write_metrics(ref, BF16)  # it reaches step 6
    live.log(record(6))
    gaps, _ = logged(wb)
    assert sorted(gaps) == [1, 2, 3, 6]  # 4 and 5 were never both there when logged
    assert gaps[3] == expected(3) and gaps[6] == expected(6)


def test_reference_cut_back_by_a_resume_is_read_again(tmp_path):
    root = tmp_path / "runs" / "live"
    ref = run_dir(root, "bf16", "precision=bf16", losses=BF16[:4])
    wb, live = live_run(tmp_path, root)
    live.log(record(1))
    write_metrics(ref, BF16[:2])  # the reference resumed from step 2: the file is cut back
    live.log(record(2))
    write_metrics(ref, BF16)
    live.log(record(3))
    gaps, _ = logged(wb)
    assert sorted(gaps) == [1, 2, 3] and gaps[3] == expected(3)


def test_late_reference_is_found_on_rescan(tmp_path, capsys):
    root = tmp_path / "runs" / "live"
    wb, live = live_run(tmp_path, root, rescan_s=0.0)
    assert "no bf16 run of the same model, data and seed yet" in capsys.readouterr().out
    live.log(record(1))
    run_dir(root, "bf16", "precision=bf16", losses=BF16)
    live.log(record(2))
    assert f"gap_vs_bf16 from {root / 'bf16'}" in capsys.readouterr().out
    gaps, _ = logged(wb)
    assert sorted(gaps) == [2] and gaps[2] == expected(2)


def test_other_seed_or_batch_is_no_reference(tmp_path, capsys):
    root = tmp_path / "runs" / "live"
    run_dir(root, "bf16_s2", "precision=bf16", "train.seed=2", losses=BF16)
    run_dir(root, "bf16_gb4", "precision=bf16", "train.global_batch=4", losses=BF16)
    run_dir(tmp_path / "runs" / "other", "bf16", "precision=bf16", losses=BF16)
    wb, live = live_run(tmp_path, root)
    assert "no bf16 run" in capsys.readouterr().out
    live.log(record(1))
    gaps, _ = logged(wb)
    assert gaps == {}


def test_nearest_reference_wins_two_in_one_place_are_ambiguous(tmp_path, capsys):
    sweep = tmp_path / "sweep"  # this run's sweep dir has one bf16 sibling, runs/live another
    run_dir(sweep, "bf16", "precision=bf16", losses=BF16)
    run_dir(tmp_path / "runs" / "live", "bf16", "precision=bf16", losses=[9.0] * 6)
    wb, live = live_run(tmp_path, sweep)
    assert f"gap_vs_bf16 from {sweep / 'bf16'}" in capsys.readouterr().out
    live.log(record(1))
    gaps, _ = logged(wb)
    assert gaps[1] == expected(1)
    run_dir(sweep, "bf16_copy", "precision=bf16", losses=BF16)
    wb, live = live_run(tmp_path, sweep)
    assert "live gap: 2 bf16 runs match" in capsys.readouterr().out
    live.log(record(1))
    gaps, _ = logged(wb)
    assert gaps == {}


TRAIN = [
    "model=tiny",
    "train.steps=4",
    "train.seq_len=32",
    "train.micro_batch=2",
    "train.global_batch=2",
    "optim.warmup_steps=2",
    "logging.progress=plain",
    "data.corpus_max_bytes=1500000",
    "experiment=live",
    "logging.wandb.mode=offline",
    "checkpoint.save_at_end=false",
]


# slow (kept out of make test's 20 minutes): in make test a trainer logs its live gap
# against a BF16 run in test_hydra_callback.py's multirun, LiveGap runs on real run dirs and
# offline W&B runs in the tests above, a trainer's diag/ keys are read back from its W&B run in
# test_train_logging.py, and compare reads offline W&B runs in test_compare_cli.py
@pytest.mark.slow
def test_trainer_logs_live_gap_and_compare_reads_both(tmp_path):
    env = offline_env(tmp_path)
    root = tmp_path / "runs" / "live"
    dirs = {}
    for recipe, extra in (("bf16", []), ("ufp4", ["logging.wandb.diagnostics_interval=2"])):
        dirs[recipe] = root / recipe
        cmd = [
            sys.executable,
            "-m",
            "ufp4_megatron.train",
            *TRAIN,
            f"precision={recipe}",
            f"hydra.run.dir={dirs[recipe]}",
            f"data.cache_dir={tmp_path / 'cache'}",
            *extra,
        ]
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
    assert f"live gap: gap_vs_bf16 from {dirs['bf16']}" in r.stdout

    def metrics(recipe):
        return [json.loads(x) for x in (dirs[recipe] / "metrics.jsonl").read_text().splitlines()]

    wb = read_run(find_run_file(dirs["ufp4"]))
    assert wb["group"] == "live"
    assert wb["metrics"]["loss"] == "tokens" and wb["metrics"]["diag/*"] == "tokens"
    rows = [h for h in wb["history"] if "gap_vs_bf16" in h]
    bf16 = metrics("bf16")
    for h, m, ref in zip(rows, metrics("ufp4"), bf16, strict=True):
        assert h["gap_vs_bf16"] == pytest.approx((m["loss"] - ref["loss"]) / ref["loss"])
        assert h["gap_vs_bf16_at_tokens"] == m["tokens"] == h["tokens"]
    diag = {k for h in wb["history"] for k in h if k.startswith("diag/")}
    assert "diag/layer0.linear_fc2/fprop.x/alpha" in diag
    assert {k.rsplit("/", 1)[1] for k in diag} == {
        "alpha",
        "sqnr_db",
        "delta_sqnr_db",
        "bucket_ratio",
    }

    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ufp4_megatron.cli.compare",
            str(dirs["bf16"]),
            str(dirs["ufp4"]),
            "--out",
            str(tmp_path / "cmp"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    cmp = read_run(find_run_file(tmp_path / "cmp"))
    assert cmp["group"] == "live" and cmp["job_type"] == "compare"
    curve = [
        r["gap"]
        for r in logged_table(find_run_file(tmp_path / "cmp"), "gap_curves/tiny")
        if r["series"] == "ufp4 s1234"
    ]
    assert curve == pytest.approx([h["gap_vs_bf16"] for h in rows])

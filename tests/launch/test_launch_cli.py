"""ufp4-launch without a cluster: what `compare` would submit, and that every planned run is a
valid trainer config (so a sweep cannot fail hours later on a misspelt override).

- test_compare_dry_run_plans_array_and_dependent_report
- test_every_planned_run_composes_with_the_trainer_config (ablations included)
- test_compare_refuses_overrides_every_run_would_fail_on (one line, exit 2, nothing submitted)
- test_task_refuses_an_index_outside_the_sweep
- test_compare_refuses_options_out_of_range (--nodes 0, --nproc-per-node -2, ...: one line,
  exit 2, nothing written or submitted)
- test_task_refuses_a_missing_or_foreign_sweep_file (missing, not JSON, not a sweep)
"""

import json
import shlex
import subprocess
import sys

import pytest
from hydra import compose

from ufp4_megatron.cli.launch import ABLATIONS, main, plan_runs
from ufp4_megatron.scripts import SLURM_SBATCH
from ufp4_megatron.train.overrides import training_configs


def test_compare_dry_run_plans_array_and_dependent_report(tmp_path, capsys):
    assert (
        main(
            [
                "compare",
                "--out",
                str(tmp_path / "sw"),
                "--ablations",
                "--nproc-per-node",
                "1",
                "--sbatch-arg=--partition=gpu",
                "--dry-run",
                "--",
                "model=tiny",
                "logging.wandb.project='a b'",
            ]
        )
        == 0
    )
    array, report = [shlex.split(line) for line in capsys.readouterr().out.splitlines()]
    n = 3 + len(ABLATIONS)
    assert f"--array=0-{n - 1}" in array and "--partition=gpu" in array
    # the installed package's Slurm script (a checkout's launch/slurm.sbatch links to it)
    assert array[array.index(str(SLURM_SBATCH)) + 1 :] == [
        "--nproc-per-node",
        "1",
        "--max-restarts",
        "0",
        "--module",
        "ufp4_megatron.cli.launch",
        "--",
        "task",
        str(tmp_path / "sw" / "sweep.json"),
    ]
    assert "--dependency=afterok:<array>" in report and "--partition=gpu" in report
    wrapped = shlex.split(next(a for a in report if a.startswith("--wrap="))[len("--wrap=") :])
    assert wrapped[:4] == ["exec", sys.executable, "-m", "ufp4_megatron.report.compare"]
    assert wrapped[4 : 4 + n] == [
        str(tmp_path / "sw" / name) for name in ["bf16", "e2m1", "ufp4", *ABLATIONS]
    ]
    assert not (tmp_path / "sw").exists()  # a dry run writes nothing


def test_every_planned_run_composes_with_the_trainer_config(tmp_path):
    shared = ["model=tiny", "train.seed=3"]
    plan = plan_runs(["bf16", "e2m1", "ufp4"], True, shared, tmp_path)
    seen = {}
    with training_configs():
        for run in plan:
            assert run["overrides"][:2] == shared  # identical seed and data for every run
            cfg = compose(
                "config", overrides=[o for o in run["overrides"] if not o.startswith("hydra.")]
            )
            assert cfg.checkpoint.dir == str(tmp_path / run["name"] / "checkpoints")
            rht = {g: cfg.precision.rht[g] for g in ("fprop", "dgrad", "wgrad")}
            seen[run["name"]] = (cfg.precision.name, rht, dict(cfg.precision.sr))
    assert seen["ufp4_rht_none"] == (
        "ufp4_rht_none",
        {"fprop": False, "dgrad": False, "wgrad": False},
        seen["ufp4"][2],
    )
    assert seen["ufp4_rht_fprop_wgrad"][1] == {"fprop": True, "dgrad": False, "wgrad": True}
    assert seen["ufp4_no_sr"][2]["dy"] is False and seen["ufp4"][2]["dy"] is True
    assert len({name for name, _, _ in seen.values()}) == len(plan)  # distinct report rows


@pytest.mark.parametrize(
    "overrides,fragment",
    [
        (
            ["train.stepz=3"],
            "run bf16: Could not override 'train.stepz'. To append to your config "
            "use +train.stepz=3 (Key 'stepz' not in 'TrainConfig')",
        ),
        (["model=huge"], "run bf16: In 'config': Could not find 'model/huge'; Available options"),
    ],
)
def test_compare_refuses_overrides_every_run_would_fail_on(tmp_path, capsys, overrides, fragment):
    rc = main(["compare", "--out", str(tmp_path / "sw"), "--dry-run", "--", *overrides])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("ufp4-launch: error: ")
    assert fragment in err[0] and not (tmp_path / "sw").exists()


def _one_line_error(capsys, rc: int, fragment: str) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("ufp4-launch: error: "), err
    assert fragment in err[0], err[0]


def test_task_refuses_an_index_outside_the_sweep(tmp_path, capsys, monkeypatch):
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"runs": [{"name": "bf16", "overrides": []}]}))
    res = subprocess.run(
        [sys.executable, "-m", "ufp4_megatron.cli.launch", "task", str(sweep), "--index", "1"],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "ufp4-launch: error: task: index 1 outside 0..0"
    ]
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID", raising=False)
    _one_line_error(capsys, main(["task", str(sweep)]), "no --index and no SLURM_ARRAY_TASK_ID")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "x1")
    _one_line_error(capsys, main(["task", str(sweep)]), "SLURM_ARRAY_TASK_ID='x1' is not")


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (["--nodes", "0"], "--nodes 0: give the nodes per run, a number >= 1"),
        (["--nodes", "-3"], "--nodes -3"),
        (
            ["--nproc-per-node", "-2"],
            "--nproc-per-node '-2': give a number >= 1 or one of auto, gpu",
        ),
        (["--nproc-per-node", "0"], "--nproc-per-node '0'"),
        (["--nproc-per-node", "two"], "--nproc-per-node 'two'"),
        (["--max-restarts", "-1"], "--max-restarts -1: give a number >= 0"),
        (["--precisions", ","], "--precisions names no precision"),
        (["--precisions", "bf16,ufp4,bf16"], "duplicate run names in ['bf16', 'ufp4', 'bf16']"),
        (["--precisions", "bf16,fp3"], "run fp3: In 'config': Could not find 'precision/fp3'"),
        (["--job-name", " "], "--job-name ' ': give a printable, non-empty name"),
        (["--job-name", "a\nb"], "--job-name 'a\\nb'"),
        (["--out", "FILE"], "a file is there; give a directory for the sweep"),
    ],
)
def test_compare_refuses_options_out_of_range(tmp_path, capsys, argv, fragment):
    (tmp_path / "file").write_text("x")
    argv = [str(tmp_path / "file") if a == "FILE" else a for a in argv]
    out = [] if "--out" in argv else ["--out", str(tmp_path / "sw")]
    rc = main(["compare", *out, *argv, "--dry-run", "--", "model=tiny"])
    _one_line_error(capsys, rc, fragment)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.parametrize(
    "content,fragment",
    [
        (None, "task: no such sweep file: {sweep} (ufp4-launch compare --out DIR writes"),
        ("{not json", "task: {sweep} is not JSON (Expecting property name"),
        ("[]", "task: {sweep} is not a sweep file: it needs a non-empty 'runs' list"),
        ('{"runs": []}', "is not a sweep file"),
        ('{"runs": [{"name": "bf16", "overrides": "model=tiny"}]}', "is not a sweep file"),
        ('{"runs": [{"name": "bf16", "overrides": [3]}]}', "is not a sweep file"),
    ],
)
def test_task_refuses_a_missing_or_foreign_sweep_file(tmp_path, capsys, content, fragment):
    sweep = tmp_path / "sweep.json"
    if content is not None:
        sweep.write_text(content)
    rc = main(["task", str(sweep), "--index", "0"])
    _one_line_error(capsys, rc, fragment.replace("{sweep}", str(sweep)))

"""`python -m ufp4_megatron.cli.compare` as a user runs it (subprocess, W&B offline, no key).

test_compare_writes_outputs_and_an_offline_wandb_run   md, json, png, workspace file; the
    compare run in the runs' group with per-seed and band keys against tokens, the table
test_one_compare_run_per_experiment        a second compare of the experiment updates the
    same W&B run (same id), another experiment gets its own
test_common_steps_are_said                 different lengths: the steps used, in the output
test_same_label_is_disambiguated_in_the_table
test_help_names_the_program                `ufp4-compare` / `python -m ufp4_megatron.cli.compare`
test_bad_input_exits_2_with_one_line       each case below: exit 2, one line, no traceback
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _runs import logged_table, offline_env, write_run

from ufp4_megatron.report.wandb_offline import find_run_file, read_run

ROOT = Path(__file__).resolve().parents[2]
BF16 = [3.0, 2.5, 2.2, 2.0]
GAPS = {"e2m1": [0.02, 0.03, 0.04], "ufp4": [0.01, 0.02, 0.03]}


def compare(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ufp4_megatron.cli.compare", *args],
        cwd=tmp,
        env=offline_env(tmp),
        capture_output=True,
        text=True,
        timeout=300,
    )


def study(tmp: Path, experiment: str = "exp1") -> list[str]:
    runs = []
    for seed in (1, 2, 3):
        runs.append(write_run(tmp / f"bf16-s{seed}", "bf16", seed, BF16, experiment=experiment))
        for recipe, gaps in GAPS.items():
            runs.append(
                write_run(
                    tmp / f"{recipe}-s{seed}",
                    recipe,
                    seed,
                    [v * (1 + gaps[seed - 1]) for v in BF16],
                    experiment=experiment,
                    val_every=2,
                )
            )
    return runs


def test_compare_writes_outputs_and_an_offline_wandb_run(tmp_path):
    r = compare(tmp_path, *study(tmp_path), "--last", "2", "--out", "out")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    data = json.loads((out / "loss_gap.json").read_text())
    ufp4 = next(x for x in data["recipes"] if x["recipe"] == "ufp4")
    assert ufp4["train_gap"]["mean"] == pytest.approx(0.02)
    assert ufp4["vs_baseline"]["reduction"] == pytest.approx(1 / 3)
    md = (out / "loss_gap.md").read_text()
    assert "| tiny | ufp4 | 3 | not resolved at this size: +2.000%" in md
    assert "| tiny | ufp4 | 3 |" in r.stdout
    assert (out / "loss_gap.png").read_bytes()[:4] == b"\x89PNG"

    wb = read_run(find_run_file(out))
    assert (wb["group"], wb["job_type"], wb["name"]) == ("exp1", "compare", "compare-exp1")
    rows = logged_table(find_run_file(out), "gap_curves/tiny")

    def curve(series):
        return [(r["tokens"], r["gap"]) for r in rows if r["series"] == series]

    assert [x for x, _ in curve("ufp4 s3")] == [64, 128, 192, 256]
    assert [g for _, g in curve("ufp4 s3")] == pytest.approx([0.03] * 4)
    assert [g for _, g in curve("ufp4 mean")] == pytest.approx([0.02] * 4)
    assert all(lo < 0.02 < hi for (_, lo), (_, hi) in zip(curve("ufp4 lo"), curve("ufp4 hi")))
    assert {r["recipe"] for r in rows} == {"e2m1", "ufp4"}
    assert any(h.get("loss_gap_table._type") == "table-file" for h in wb["history"])
    assert wb["summary"]["loss_gap/tiny/ufp4/mean"] == pytest.approx(0.02)
    assert wb["summary"]["reduction/tiny/ufp4/value"] == pytest.approx(1 / 3)
    assert wb["summary"]["difference/tiny/ufp4/value"] == pytest.approx(
        ufp4["vs_baseline_paired"]["train"]["mean"]
    )
    assert wb["summary"]["difference/tiny/ufp4/p"] == pytest.approx(
        ufp4["vs_baseline_paired"]["train_p"]
    )
    assert wb["config"]["last"] == 2 and len(wb["config"]["runs"]) == 9

    ws = json.loads((out / "wandb_workspace.json").read_text())
    assert ws["args"]["group"] == "exp1" and ws["args"]["project"] == "ufp4-test"
    text = json.dumps(ws["view"])
    for key in (
        "gap_curves/tiny",
        "gap_vs_bf16_at_tokens",
        "val_loss",
        "diag/layer0\\\\..*/sqnr_db",
    ):
        assert key in text, key


def test_common_steps_are_said(tmp_path):
    runs = [
        write_run(tmp_path / "b", "bf16", 1, [2.0] * 100),
        write_run(tmp_path / "e", "e2m1", 1, [2.04] * 10),
        write_run(tmp_path / "u", "ufp4", 1, [2.02] * 10 + [9.0] * 90),
    ]
    r = compare(tmp_path, *runs, "--out", "out", "--wandb-mode", "disabled")
    assert r.returncode == 0, r.stderr
    said = "tiny: compared over the common steps 1-10 only; logged further: "
    assert said in r.stdout and said in (tmp_path / "out" / "loss_gap.md").read_text()
    ufp4 = json.loads((tmp_path / "out" / "loss_gap.json").read_text())["recipes"][1]
    assert ufp4["train_gap"]["mean"] == pytest.approx(0.01)


def test_same_label_is_disambiguated_in_the_table(tmp_path):
    runs = [
        write_run(tmp_path / "b", "bf16", 1, BF16),
        write_run(tmp_path / "u", "ufp4", 1, [v * 1.01 for v in BF16]),
        write_run(
            tmp_path / "u_nofprop",
            "ufp4",
            1,
            [v * 1.02 for v in BF16],
            precision={"rht": {"fprop": False}},
        ),
    ]
    r = compare(tmp_path, *runs, "--out", "out", "--wandb-mode", "disabled")
    assert r.returncode == 0, r.stderr
    assert "2 different settings are labelled 'ufp4' (they differ in precision.rht)" in r.stdout
    assert r.stdout.count("| tiny | ufp4#") == 4  # two rows in each table


def test_help_names_the_program(tmp_path):
    r = compare(tmp_path, "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: python -m ufp4_megatron.cli.compare ")
    script = Path(sys.executable).parent / "ufp4-compare"
    if script.exists():  # the console script of the editable install
        r = subprocess.run(
            [str(script), "--help"],
            capture_output=True,
            text=True,
            env=offline_env(tmp_path),
            timeout=120,
        )
        assert r.returncode == 0 and r.stdout.startswith("usage: ufp4-compare ")


def _typo(tmp):
    run = write_run(tmp / "runs" / "default" / "tiny-bf16-s1234", "bf16", 1234, BF16)
    return [run, "runs/default/tiny-ufp4-s123"]


def _twice(tmp):
    return [
        write_run(tmp / "b", "bf16", 1, BF16),
        write_run(tmp / "u", "ufp4", 1, BF16),
        str(tmp / "u"),
    ]


def _copy(tmp):
    return [
        write_run(tmp / "b", "bf16", 1, BF16),
        write_run(tmp / "u", "ufp4", 1, BF16),
        write_run(tmp / "u2", "ufp4", 1, BF16),
    ]


def _no_sibling(tmp):
    return [write_run(tmp / "b", "bf16", 1, BF16), write_run(tmp / "u", "ufp4", 2, BF16)]


def _pair(tmp):
    return [write_run(tmp / "b", "bf16", 1, BF16), write_run(tmp / "u", "ufp4", 1, BF16)]


def _empty_dir(tmp):
    (tmp / "empty").mkdir()
    return [*_pair(tmp), str(tmp / "empty")]


def _partial_metrics(tmp):
    runs = _pair(tmp)
    path = Path(runs[1]) / "metrics.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], lines[1][:10], *lines[2:]]) + "\n")
    return runs


def _other_schedule(tmp):
    """The issue's pair: a 6-step ufp4 run and a bf16 run planned for 3000 steps, both with a
    2-step warmup, so their LRs part at step 3 (both decay over train.steps)."""
    losses = [3.0, 2.5, 2.2, 2.0, 1.9, 1.8]
    return [
        write_run(
            tmp / "b",
            "bf16",
            1,
            losses,
            lr=[1.5e-4, 3e-4, 2.99e-4, 2.98e-4, 2.97e-4, 2.96e-4],
            steps=3000,
        ),
        write_run(
            tmp / "u", "ufp4", 1, losses, lr=[1.5e-4, 3e-4, 2.5e-4, 1.6e-4, 7e-5, 3e-5], steps=6
        ),
    ]


def _planned_other_schedule(tmp):
    """No LRs logged: the configs' planned schedules decide."""
    return [
        write_run(tmp / "b", "bf16", 1, BF16, steps=3000),
        write_run(tmp / "u", "ufp4", 1, BF16, steps=6),
    ]


def _nan_loss(tmp):
    return [
        write_run(tmp / "b", "bf16", 1, BF16),
        write_run(tmp / "u", "ufp4", 1, [*BF16[:3], float("nan")]),
    ]


def _out_is_a_file(tmp):
    (tmp / "out").write_text("my notes")
    return _pair(tmp)


BAD = {
    "mistyped run path": (
        _typo,
        [],
        "no such run dir: runs/default/tiny-ufp4-s123 (in "
        "runs/default: did you mean tiny-bf16-s1234?)",
    ),
    "W&B run path, offline, no key": (
        lambda tmp: [*_pair(tmp), "myteam/myproject/abc123"],
        [],
        "myteam/myproject/abc123: no such local run dir, and reading it as the W&B run "
        "entity/project/run_id needs an API key",
    ),
    "not a run dir": (_empty_dir, [], "a directory without metrics.jsonl"),
    "--last 0": (_pair, ["--last", "0"], "--last 0: the mean needs at least 1 step"),
    "--last-fraction 1.5": (_pair, ["--last-fraction", "1.5"], "must be in (0, 1]"),
    "--confidence 95": (_pair, ["--confidence", "95"], "--confidence 95.0: must be in (0, 1)"),
    "--smooth 0": (_pair, ["--smooth", "0"], "--smooth 0: must be >= 1"),
    "one run given twice": (_twice, [], "the same run was given twice"),
    "two dirs of one identical run": (_copy, [], "the same run was given twice"),
    "no bf16 run of that seed": (_no_sibling, [], "has no 'bf16' run of the same model"),
    "no bf16 run at all": (lambda tmp: _pair(tmp)[1:], [], "no 'bf16' run among the 1 given"),
    "corrupt metrics line": (_partial_metrics, [], "metrics.jsonl:2: not a JSON step record"),
    "siblings on other LR schedules": (
        _other_schedule,
        [],
        "trained with different learning rates from step 3 on (0.00025 vs "
        "0.000299; their schedules differ in decay_steps 6 vs 3000): their "
        "loss gap is not the recipe's",
    ),
    "siblings planned on other schedules": (
        _planned_other_schedule,
        [],
        "plan different LR schedules (decay_steps 6 vs 3000)",
    ),
    "a NaN loss": (
        _nan_loss,
        [],
        "loss is nan at step 4 (1 non-finite step(s)): the run diverged and has no gap to measure",
    ),
    "--out is a file": (_out_is_a_file, [], "--out out: a file is there; give a directory"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_exits_2_with_one_line(tmp_path, case):
    setup, args, message = BAD[case]
    r = compare(tmp_path, *setup(tmp_path), *args, "--out", "out")
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("python -m ufp4_megatron.cli.compare: error: ")
    assert message in lines[0], lines[0]
    assert not (tmp_path / "out").is_dir()  # nothing half-written


def test_one_compare_run_per_experiment(tmp_path):
    from ufp4_megatron.report.wandb_log import compare_id

    runs = study(tmp_path)
    for out in ("a", "b"):  # two compares of exp1 (two sweeps), into different dirs
        assert compare(tmp_path, *runs, "--last", "2", "--out", out).returncode == 0
    ids = {find_run_file(tmp_path / out).stem for out in ("a", "b")}
    assert ids == {f"run-{compare_id(None, 'ufp4-test', 'exp1')}"}
    other = study(tmp_path / "other", experiment="exp2")
    assert compare(tmp_path, *other, "--last", "2", "--out", "c").returncode == 0
    assert find_run_file(tmp_path / "c").stem == f"run-{compare_id(None, 'ufp4-test', 'exp2')}"
    assert compare_id(None, "ufp4-test", "exp2") != compare_id(None, "ufp4-test", "exp1")
    assert compare_id("team", "ufp4-test", "exp1") != compare_id(None, "ufp4-test", "exp1")

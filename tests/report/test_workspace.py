"""The W&B gap dashboard (report/workspace.py), built offline: no network, no key.

test_dashboard_lays_out_gap_loss_and_diagnostics   the panels and the keys they plot
test_save_cli_refuses_a_missing_file               exit 2, one line
"""

import json
import subprocess
import sys

from _runs import offline_env

from ufp4_megatron.report import workspace


def test_dashboard_lays_out_gap_loss_and_diagnostics(tmp_path):
    path = workspace.write(
        tmp_path / "ws.json",
        entity=None,
        project="ufp4-test",
        group="exp1",
        recipes={"tiny": ["e2m1", "ufp4"]},
        layers=[0, 1],
    )
    data = json.loads(path.read_text())
    assert data["args"]["group"] == "exp1" and data["view"]["project"] == "ufp4-test"
    sections = data["view"]["spec"]["section"]["panelBankConfig"]["sections"]
    panels = {s["name"]: [p["config"] for p in s["panels"]] for s in sections}
    assert list(panels) == [
        "Gap vs bf16 (compare run)",
        "Live gap (training runs)",
        "Loss",
        "Per-layer diagnostics",
    ]
    (gap,) = panels["Gap vs bf16 (compare run)"]  # the latest compare's table, as lines
    assert gap["panelDefId"] == "wandb/line/v0"
    assert gap["fieldSettings"] == {"x": "tokens", "y": "gap", "groupKeys": "series"}
    assert "gap_curves/tiny" in json.dumps(gap["userQuery"])
    live = panels["Live gap (training runs)"]
    assert [(p["xAxis"], p["metrics"]) for p in live] == [
        ("gap_vs_bf16_at_tokens", ["gap_vs_bf16"]),
        ("gap_vs_e2m1_at_tokens", ["gap_vs_e2m1"]),
    ]
    assert all(
        p["groupBy"] == "precision.value.name" and p["groupArea"] == "stderr"
        for p in live + panels["Loss"]
    )
    regexes = [p["metricRegex"] for p in panels["Per-layer diagnostics"]]
    assert regexes == [rf"diag/layer{i}\..*/{s}" for i in (0, 1) for s in workspace.STATS]
    assert "exp1" in json.dumps(data["view"]["spec"]["section"]["runSets"])  # the group filter


def test_save_cli_refuses_a_missing_file(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "ufp4_megatron.report.workspace", str(tmp_path / "nope.json")],
        capture_output=True,
        text=True,
        env=offline_env(tmp_path),
        timeout=120,
    )
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert "no such file" in r.stderr and "Traceback" not in r.stderr

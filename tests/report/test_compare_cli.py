"""`python -m ufp4_megatron.compare` on run dirs: table, PNG, and the gaps in an offline W&B
run that reads back.

    test_compare_writes_table_and_plot_and_logs_offline_wandb
    test_unknown_source_is_a_clear_error
"""
import json

import pytest

from ufp4_megatron.report.compare import run
from ufp4_megatron.report.wandb_offline import find_run_file, read_run


def write_run(path, recipe, losses):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(
        f"model:\n  name: tiny\nprecision:\n  name: {recipe}\ntrain:\n  seed: 3\n")
    (path / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i + 1, "loss": v, "tokens": 64 * (i + 1)}) + "\n"
        for i, v in enumerate(losses)))
    return str(path)


def test_compare_writes_table_and_plot_and_logs_offline_wandb(tmp_path, monkeypatch):
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    runs = [write_run(tmp_path / "b", "bf16", [4.0, 2.0, 2.0]),
            write_run(tmp_path / "e", "e2m1", [4.4, 2.1, 2.06]),
            write_run(tmp_path / "u", "ufp4", [4.2, 2.04, 2.02])]
    out = tmp_path / "out"
    rows = run([*runs, "--last", "2", "--out", str(out), "--wandb-mode", "offline", "--group", "t"])
    gaps = {r.recipe: r.loss_gap for r in rows}
    assert gaps == pytest.approx({"e2m1": 0.04, "ufp4": 0.015})
    assert "| tiny | 3 | ufp4 |" in (out / "loss_gap.md").read_text()
    assert (out / "loss_gap.png").read_bytes()[:4] == b"\x89PNG"
    logged = read_run(find_run_file(out))
    assert logged["group"] == "t"
    series = [h["gap/tiny/ufp4"] for h in logged["history"] if "gap/tiny/ufp4" in h]
    assert series == pytest.approx([0.05, 0.02, 0.01])


def test_unknown_source_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a run dir"):
        run([str(tmp_path / "nope.txt"), "--wandb-mode", "disabled"])

"""report/mechanism.py on a real trained run: per layer, GEMM operand and grid, alpha and SQNR
with and without RHT16, and the products of eta through the network.

    test_mechanism_of_a_trained_run      every linear x operand x grid measured on the model's
        own tensors; E1M2 and INT4 agree exactly (one grid up to scale); E2M1 shrinks the
        weights (alpha below E1M2's); products have one entry per linear; files written
    test_eta_products_by_hand            cumulative products in network order (dgrad backward)
    test_bad_input_is_a_one_line_error   no config, no checkpoint, unknown grid
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from study_helpers import FAST, ROOT, env

from ufp4_megatron.report.mechanism import eta_products, run

LINEARS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mech")
    cmd = [
        sys.executable,
        "-m",
        "ufp4_megatron.train",
        *FAST,
        "precision=e2m1",
        "train.steps=4",
        f"hydra.run.dir={tmp / 'run'}",
        f"data.cache_dir={tmp / 'data'}",
        "logging.wandb.mode=disabled",
    ]
    r = subprocess.run(cmd, cwd=ROOT, env=env(tmp), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp


def test_mechanism_of_a_trained_run(trained):
    out = trained / "mech"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ufp4_megatron.report.mechanism",
            str(trained / "run"),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env(trained),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "tiny trained with e2m1 (seed 1234) at step 4" in r.stdout
    res = json.loads((out / "mechanism.json").read_text())
    rows = res["rows"]
    keys = {(x["layer"], x["linear"], x["gemm"], x["operand"]) for x in rows}
    assert len(keys) == 2 * len(LINEARS) * 6  # 2 layers, 4 linears, 6 GEMM operands
    by = {(x["layer"], x["linear"], x["gemm"], x["operand"], x["grid"]): x for x in rows}
    for k in keys:
        e1m2, int4 = by[(*k, "e1m2")], by[(*k, "int4")]
        for stat in ("alpha_none", "alpha_rht", "sqnr_none", "sqnr_rht"):
            assert e1m2[stat] == pytest.approx(int4[stat], rel=1e-9, abs=1e-9), (k, stat)
        assert by[(*k, "e2m1")]["dsqnr"] == pytest.approx(
            by[(*k, "e2m1")]["sqnr_rht"] - by[(*k, "e2m1")]["sqnr_none"]
        )
    w = [k for k in keys if k[2:] == ("fprop", "w")]  # near-Gaussian weights after 4 steps
    mean = {g: sum(by[(*k, g)]["alpha_none"] for k in w) / len(w) for g in ("e2m1", "e1m2")}
    assert mean["e2m1"] < 0.999 < mean["e1m2"], mean
    assert all(len(v) == 2 * len(LINEARS) for v in res["products"].values())
    assert (out / "mechanism.png").read_bytes()[:4] == b"\x89PNG"
    assert "| fprop.x | e2m1 |" in (out / "mechanism.md").read_text()


def test_eta_products_by_hand():
    def row(layer, linear, gemm, op, a):
        return {
            "layer": layer,
            "linear": linear,
            "gemm": gemm,
            "operand": op,
            "grid": "g",
            "alpha_none": a,
            "alpha_rht": 1.0,
        }

    rows = [
        row(0, "linear_qkv", "fprop", "x", 0.9),
        row(0, "linear_qkv", "fprop", "w", 0.5),
        row(1, "linear_qkv", "fprop", "x", 0.8),
        row(1, "linear_qkv", "fprop", "w", 1.0),
        row(0, "linear_qkv", "dgrad", "dy", 0.5),
        row(1, "linear_qkv", "dgrad", "dy", 0.9),
    ]
    p = eta_products(rows)
    assert p["g", "none", "fprop"] == pytest.approx([0.45, 0.45 * 0.8])
    assert p["g", "none", "dgrad"] == pytest.approx([0.9, 0.9 * 0.5])  # last layer first
    assert p["g", "rht", "fprop"] == pytest.approx([1.0, 1.0])
    assert p["g", "none", "wgrad"] == []


def test_bad_input_is_a_one_line_error(tmp_path, trained):
    with pytest.raises(SystemExit, match="has no config.yaml; give a training run dir"):
        run([str(tmp_path)])
    (tmp_path / "config.yaml").write_text(
        (trained / "run" / "config.yaml").read_text().replace(str(trained / "run"), str(tmp_path))
    )
    with pytest.raises(SystemExit, match="no checkpoint under"):
        run([str(tmp_path)])
    with pytest.raises(SystemExit, match="--grids: "):
        run([str(trained / "run"), "--grids", "e2m1,e9m9"])

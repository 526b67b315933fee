"""docs/results.md is what the committed archives give, and the earlier design's audit numbers
are what they are (`python -m ufp4_megatron.cli.results`, report/results_doc.py).

    test_results_md_tables_equal_the_data   --check on the committed page: every table agrees
    test_the_earlier_designs_audit           SD 2.77 of UFP4 - E2M1, pooled p 0.12 for the
        ablation's "resolved" contrast, Holm 0.06-0.10 for MXFP4, sign flips >= 0.125
    test_the_primary_from_the_committed_archives   -0.56 [-0.91, -0.21], SD 0.91, by hand
    test_val_against_train_line_needs_a_spread
    test_cli_says_which_table_differs_and_refuses_bad_paths
"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import numpy as np
import pytest

from ufp4_megatron.cli.results import main
from ufp4_megatron.report import results_doc as rd
from ufp4_megatron.report.archives import load_study
from ufp4_megatron.report.pooled import fit_two_way, holm
from ufp4_megatron.report.prereg import paired

ROOT = Path(__file__).resolve().parents[2]
ARCHIVES, DOC = ROOT / "docs" / "results", ROOT / "docs" / "results.md"


def test_results_md_tables_equal_the_data():
    assert rd.check(DOC, ARCHIVES) == []


def test_the_earlier_designs_audit():
    runs = load_study(ARCHIVES / "study-pysrc")
    g = {a: rd.seed_gaps(runs, a, 200, range(1, 9)) for a in rd.EARLIER_RECIPES}
    d = paired(rd.diff(g["ufp4"], g["e2m1"]))
    assert (round(d.mean, 2), round(d.lo, 2), round(d.hi, 2), round(d.sd, 2)) == (
        -1.33,
        -3.65,
        0.98,
        2.77,
    )
    assert np.corrcoef([g["ufp4"][s] for s in d.values], [g["e2m1"][s] for s in d.values])[
        0, 1
    ] == pytest.approx(-0.04, abs=0.005)
    ps = [paired(rd.diff(g[a], g["e2m1"])).p for a in ("ufp4", "ufp4_int4", "nvfp4", "mxfp4")]
    assert round(ps[3], 3) == 0.016 and round(holm(ps)[3], 3) == 0.063
    six = ps + [paired(rd.diff(g["ufp4"], g[b])).p for b in ("ufp4_int4", "nvfp4")]
    assert round(holm(six)[3], 3) == 0.095
    # the ablation: 12 quantized arms at seeds 1-4 in one pooled model
    a4 = {a: rd.seed_gaps(runs, a, 200, range(1, 5)) for a in rd.EARLIER_ABLATION}
    own = paired(rd.diff(a4["ufp4"], a4["ufp4_rht_wgrad"]))
    assert round(own.p, 4) == 0.0044
    fit = fit_two_way({(a, s): v for a in a4 for s, v in a4[a].items()})
    assert fit.df == 33 and round(fit.contrast("ufp4", "ufp4_rht_wgrad").p, 2) == 0.12
    dv = np.array(list(rd.diff(a4["ufp4"], a4["ufp4_rht_wgrad"]).values()))
    flips = [
        abs((dv * np.array(f)).mean()) >= abs(dv.mean()) - 1e-12
        for f in itertools.product((1, -1), repeat=4)
    ]
    assert np.mean(flips) == 0.125


def test_the_primary_from_the_committed_archives():
    """The pre-registered primary recomputed by hand from the archives' per-step losses."""
    runs = load_study(ARCHIVES / "prereg")
    loss = {n: r.loss for n, r in runs.items()}
    curve = np.mean([loss[f"bf16-s{s}"] for s in range(1, 13)], axis=0)[800:1000]
    d = {
        s: float(np.mean((loss[f"ufp4-s{s}"][800:] - loss[f"e2m1-s{s}"][800:]) / curve) * 100)
        for s in range(1, 29)
    }
    got = paired(d)
    assert (round(got.mean, 2), round(got.lo, 2), round(got.hi, 2), round(got.sd, 2)) == (
        -0.56,
        -0.91,
        -0.21,
        0.91,
    )
    line = rd.prereg_blocks(ARCHIVES / "prereg")["prereg-primary"]
    assert "correlation 0.92, slope 3.9" in line


@pytest.mark.filterwarnings("ignore:Precision loss occurred")  # the constant case below
def test_val_against_train_line_needs_a_spread():
    class P:
        pass

    p = P()
    p.d = paired({1: 0.1, 2: 0.3, 3: 0.2, 4: -0.1})
    p.val = paired({1: 0.5, 2: 1.3, 3: 0.9, 4: -0.3})  # 4 x D + 0.1
    assert "correlation 1.00, slope 4.0, intercept +0.10" in rd._val_against_train(p)
    p.val = paired({1: 0.5, 2: 0.5, 3: 0.5, 4: 0.5})
    assert rd._val_against_train(p) == ""
    p.val = None
    assert rd._val_against_train(p) == ""


def test_cli_says_which_table_differs_and_refuses_bad_paths(tmp_path, capsys):
    doc = tmp_path / "results.md"
    text = DOC.read_text()
    doc.write_text(text.replace("(points) | 2.77 |", "(points) | 1.23 |"))
    assert main(["--check", "--doc", str(doc), "--archives", str(ARCHIVES)]) == 1
    assert "table earlier-audit: differs" in capsys.readouterr().err
    assert main(["--write", "--doc", str(doc), "--archives", str(ARCHIVES)]) == 0
    assert doc.read_text() == text
    assert main(["--check", "--archives", str(tmp_path / "none")]) == 2
    assert "no such folder" in capsys.readouterr().err
    bad = tmp_path / "archives"
    shutil.copytree(ARCHIVES / "study-pysrc", bad / "study-pysrc")
    (bad / "study-pysrc" / "round1.tar.gz").write_bytes(b"broken")
    assert main(["--archives", str(bad)]) == 2
    assert "not a readable study archive" in capsys.readouterr().err

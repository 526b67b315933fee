"""compare's math on known inputs.

    test_gap_series_on_common_steps     (L - L_ref) / L_ref only where both runs logged
    test_mean_over_latest_steps         mean of the last N common steps
    test_compare_pairs_by_model_and_seed   each run against the bf16 run of its model + seed
    test_missing_reference_is_an_error
    test_table_reduction_vs_baseline    (gap_e2m1 - gap_x) / gap_e2m1, as the paper reports
"""
import pytest

from ufp4_megatron.report.gap import compare, gap_series, markdown_table, mean_latest
from ufp4_megatron.report.runs import Run


def run(recipe, loss, model="tiny", seed=1, val=None):
    return Run(source=recipe, model=model, recipe=recipe, seed=seed, loss=loss,
               tokens={s: 10 * s for s in loss}, val_loss=val or {})


def test_gap_series_on_common_steps():
    g = gap_series({1: 2.2, 2: 2.1, 3: 4.4, 4: 9.0}, {1: 2.0, 2: 2.0, 3: 4.0})
    assert g == pytest.approx({1: 0.1, 2: 0.05, 3: 0.1})


def test_mean_over_latest_steps():
    series = {1: 0.5, 2: 0.1, 3: 0.05, 4: 0.15}
    assert mean_latest(series, 2) == pytest.approx(0.1)
    assert mean_latest(series, 1000) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="no common steps"):
        mean_latest({}, 10)


def test_compare_pairs_by_model_and_seed():
    runs = [run("bf16", {1: 2.0, 2: 1.0}), run("ufp4", {1: 2.2, 2: 1.01}),
            run("bf16", {1: 4.0, 2: 2.0}, seed=2), run("ufp4", {1: 4.0, 2: 2.2}, seed=2),
            run("bf16", {1: 1.0, 2: 1.0}, val={2: 2.0}, model="small"),
            run("e2m1", {1: 1.5, 2: 1.5}, val={2: 2.5}, model="small")]
    rows = {(r.model, r.seed, r.recipe): r for r in compare(runs, last=1)}
    assert rows["tiny", 1, "ufp4"].loss_gap == pytest.approx(0.01)
    assert rows["tiny", 2, "ufp4"].loss_gap == pytest.approx(0.1)
    assert rows["small", 1, "e2m1"].loss_gap == pytest.approx(0.5)
    assert rows["small", 1, "e2m1"].val_gap == pytest.approx(0.25)
    assert rows["tiny", 1, "ufp4"].val_gap is None


def test_missing_reference_is_an_error():
    with pytest.raises(ValueError, match="no 'bf16' run"):
        compare([run("bf16", {1: 1.0}), run("ufp4", {1: 1.0}, seed=7)])


def test_table_reduction_vs_baseline():
    runs = [run("bf16", {1: 1.0}), run("e2m1", {1: 1.02}), run("ufp4", {1: 1.015})]
    table = markdown_table(compare(runs), last=1000)
    ufp4 = next(line for line in table.splitlines() if "| ufp4 |" in line)
    assert "+1.5000%" in ufp4 and "+25.0%" in ufp4

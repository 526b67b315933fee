"""compare's pairing and windows on known inputs (report/gap.py).

test_gap_series_on_common_steps        (L - L_ref) / L_ref only where both runs logged
test_mean_over_latest_common_steps     the mean of the latest N steps; and latest fraction
test_pairs_by_sibling_key              each run against the bf16 run of its model, data and
                                       seed; a bf16 run of another batch is no reference
test_different_lengths_use_common_steps   a 10-step run cuts everyone to steps 1-10, said
test_val_gap_over_window_eval_steps    mean over the common eval steps in the window
test_same_label_different_settings_are_told_apart   label#setting, seeds still grouped
test_same_run_twice_is_refused
test_missing_reference_is_an_error
test_models_in_natural_order           a depth sweep's L3 before L12, in windows and summaries
test_siblings_must_share_the_lr_schedule   the LRs logged at the compared steps decide; a
                                       run without logged LRs is judged by its planned one
"""

import pytest

from ufp4_megatron.report.errors import BadInput
from ufp4_megatron.report.gap import compare, gap_series, model_order
from ufp4_megatron.report.runs import Run


def mk(recipe, loss, seed=1, model="tiny", val=None, batch=2, **precision):
    steps = range(1, len(loss) + 1) if isinstance(loss, list) else loss
    loss = dict(zip(steps, loss)) if isinstance(loss, list) else loss
    config = {
        "model": {"name": model},
        "precision": {"name": recipe, **precision},
        "train": {"seed": seed, "global_batch": batch},
    }
    return Run(
        source=f"{model}-{recipe}-s{seed}",
        model=model,
        recipe=recipe,
        seed=seed,
        loss=loss,
        tokens={s: 10 * s for s in loss},
        val_loss=val or {},
        config=config,
    )


def test_gap_series_on_common_steps():
    g = gap_series({1: 2.2, 2: 2.1, 3: 4.4, 4: 9.0}, {1: 2.0, 2: 2.0, 3: 4.0})
    assert g == pytest.approx({1: 0.1, 2: 0.05, 3: 0.1})


def test_mean_over_latest_common_steps():
    runs = [mk("bf16", [4.0, 2.0, 2.0, 2.0]), mk("ufp4", [4.4, 2.2, 2.02, 2.04])]
    (g,) = compare(runs, last=2).gaps
    assert g.train_gap == pytest.approx(0.015)  # steps 3 and 4: 1% and 2%
    (g,) = compare(runs, last=1000).gaps
    assert g.train_gap == pytest.approx((0.1 + 0.1 + 0.01 + 0.02) / 4)
    (g,) = compare(runs, last=None, last_fraction=0.5).gaps
    assert g.train_gap == pytest.approx(0.015)
    w = compare(runs, last=2).windows["tiny"]
    assert (w.first, w.last_common, w.steps) == (3, 4, [3, 4])


def test_pairs_by_sibling_key():
    runs = [
        mk("bf16", [2.0, 1.0]),
        mk("ufp4", [2.2, 1.01]),
        mk("bf16", [4.0, 2.0], seed=2),
        mk("ufp4", [4.0, 2.2], seed=2),
        mk("bf16", [1.0, 1.0], model="small"),
        mk("e2m1", [1.5, 1.5], model="small"),
        mk("bf16", [9.0, 9.0], batch=4),
    ]  # another batch size: nobody's reference
    gaps = {(g.model, g.seed, g.recipe): g for g in compare(runs, last=1).gaps}
    assert gaps["tiny", 1, "ufp4"].train_gap == pytest.approx(0.01)
    assert gaps["tiny", 1, "ufp4"].reference is runs[0]
    assert gaps["tiny", 2, "ufp4"].train_gap == pytest.approx(0.1)
    assert gaps["small", 1, "e2m1"].train_gap == pytest.approx(0.5)


def test_different_lengths_use_common_steps():
    """The case seen as 'gap reduction vs e2m1 -2662.5%': e2m1 stopped at step 10."""
    bf16 = [3.0 - 0.01 * i for i in range(100)]
    runs = [
        mk("bf16", bf16),
        mk("e2m1", [v * 1.02 for v in bf16[:10]]),
        mk("ufp4", [v * (1.01 if i < 10 else 1.5) for i, v in enumerate(bf16)]),
    ]
    cmp = compare(runs, last=1000)
    w = cmp.windows["tiny"]
    assert (w.last_common, w.steps) == (10, list(range(1, 11)))
    gaps = {g.recipe: g.train_gap for g in cmp.gaps}
    assert gaps == pytest.approx({"e2m1": 0.02, "ufp4": 0.01})
    assert cmp.notes == [
        "tiny: compared over the common steps 1-10 only; logged further: "
        "tiny-bf16-s1 (to step 100), tiny-ufp4-s1 (to step 100)"
    ]


def test_val_gap_over_window_eval_steps():
    runs = [
        mk("bf16", [2.0] * 6, val={2: 2.0, 4: 2.0, 6: 2.0}),
        mk("ufp4", [2.0] * 6, val={2: 3.0, 4: 2.2, 6: 2.1}),
    ]
    (g,) = compare(runs, last=3).gaps  # window steps 4-6: eval steps 4 and 6
    assert g.val_gap == pytest.approx((0.1 + 0.05) / 2)
    (g,) = compare(runs, last=1).gaps  # only step 6
    assert g.val_gap == pytest.approx(0.05)
    (g,) = compare([mk("bf16", [2.0] * 6), mk("ufp4", [2.0] * 6)], last=3).gaps
    assert g.val_gap is None


def test_same_label_different_settings_are_told_apart():
    """An ablation by overrides keeps precision.name=ufp4: two settings under one name."""
    on, off = {"rht": {"fprop": True}}, {"rht": {"fprop": False}}
    runs = [mk("bf16", [2.0, 2.0], seed=s) for s in (1, 2)]
    runs += [mk("ufp4", [2.02, 2.02], seed=s, **on) for s in (1, 2)]
    runs += [mk("ufp4", [2.04, 2.04], seed=s, **off) for s in (1, 2)]
    cmp = compare(runs, last=10)
    labels = {}
    for g in cmp.gaps:
        labels.setdefault(g.recipe, []).append((g.seed, round(g.train_gap, 6)))
    assert len(labels) == 2 and all(k.startswith("ufp4#") for k in labels)
    assert sorted(labels.values()) == [[(1, 0.01), (2, 0.01)], [(1, 0.02), (2, 0.02)]]
    (note,) = cmp.notes
    assert "2 different settings are labelled 'ufp4'" in note
    assert "precision.rht.fprop" in note and "precision.name" in note


def test_same_run_twice_is_refused():
    runs = [mk("bf16", [2.0]), mk("ufp4", [2.1]), mk("ufp4", [2.1])]
    with pytest.raises(BadInput, match="the same run was given twice"):
        compare(runs)


def test_missing_reference_is_an_error():
    with pytest.raises(BadInput, match="has no 'bf16' run"):
        compare([mk("bf16", [1.0]), mk("ufp4", [1.0], seed=7)])
    with pytest.raises(BadInput, match="no 'bf16' run among"):
        compare([mk("ufp4", [1.0])])


def test_models_in_natural_order():
    from ufp4_megatron.report.summary import summarize

    names = ["m_L12", "m_L3", "m", "m_L24", "a10", "a9"]
    assert sorted(names, key=model_order) == ["a9", "a10", "m", "m_L3", "m_L12", "m_L24"]
    runs = [
        mk(r, [2.0, 1.0 + (r == "e2m1") * 0.1], model=m)
        for m in ("m_L12", "m_L3", "m")
        for r in ("bf16", "e2m1")
    ]
    cmp = compare(runs)
    assert list(cmp.windows) == ["m", "m_L3", "m_L12"]
    summaries, _ = summarize(cmp)
    assert [s.model for s in summaries] == ["m", "m_L3", "m_L12"]


def test_siblings_must_share_the_lr_schedule():
    def run(recipe, logged=None, steps=1000, **optim):
        r = mk(recipe, [3.0, 2.5, 2.2, 2.0])
        r.config["train"]["steps"] = steps  # not in the sibling key: a run may be extended
        r.config["optim"] = {"lr": 3e-4, "warmup_steps": 2, "decay_style": "cosine", **optim}
        r.lr = dict(zip(range(1, 5), logged)) if logged else {}
        return r

    warm = [1.5e-4, 3e-4]
    # the same LRs at every compared step: comparable, whatever each planned beyond them
    compare([run("bf16", warm, steps=3000), run("ufp4", warm, steps=2)], last=2)
    # different LRs from step 3 (4-step run vs 3000-step run): refused, naming the step
    with pytest.raises(
        BadInput,
        match=r"different learning rates from step 3 on \(0.0002 vs "
        r"0.0003; their schedules differ in decay_steps 4 vs "
        r"3000\)",
    ):
        compare(
            [
                run("bf16", [*warm, 3e-4, 3e-4], steps=3000),
                run("ufp4", [*warm, 2e-4, 1e-4], steps=4),
            ],
            last=2,
        )
    # an explicit optim.decay_steps makes runs of different lengths one schedule
    compare([run("bf16", steps=3000, decay_steps=5000), run("ufp4", steps=4, decay_steps=5000)])
    with pytest.raises(BadInput, match=r"plan different LR schedules \(decay_steps 4 vs 3000\)"):
        compare([run("bf16", steps=3000), run("ufp4", steps=4)])

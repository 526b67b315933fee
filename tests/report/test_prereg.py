"""report/prereg.py and report/archives.py: the pre-registered analysis on synthetic studies
whose answers are known, and the archives it reads.

    test_primary_is_the_mean_relative_difference_and_waits_for_all_68_runs
    test_runs_that_do_not_count_are_named_with_the_reason   config, corpus, resumed, missing
        launch record, incomplete; a divergence is reported apart
    test_ablation_recovers_known_contrasts_in_one_pooled_model_with_holm
    test_archives_read_launch_records_and_log_headers      the gpu/study.sh layout, tar.gz
    test_a_run_differing_between_archives_is_refused
    test_the_design_is_the_grid                              configs/study/prereg.yaml
"""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest

from ufp4_megatron.report.archives import ArchivedRun, load_study
from ufp4_megatron.report.errors import BadInput
from ufp4_megatron.report.prereg import DESIGN, analyse, count_runs

STEPS = DESIGN.steps
# synthetic gaps equal on every seed: scipy warns that their spread is at rounding level
pytestmark = pytest.mark.filterwarnings("ignore:Precision loss occurred")


def config(arm: str, seed: int, **change) -> dict:
    cfg: dict = {}
    for key, value in (
        *DESIGN.config,
        ("precision.name", arm),
        ("train.seed", seed),
        ("data.prefixes", ["/tmp/corpus/pysrc"]),
        *change.items(),
    ):
        node = cfg
        *path, last = key.split(".")
        for k in path:
            node = node.setdefault(k, {})
        node[last] = value
    return cfg


def run(
    arm: str, seed: int, loss, starts=(0,), corpus=DESIGN.corpus_sha256, val=None, **change
) -> ArchivedRun:
    loss = np.broadcast_to(np.asarray(loss, dtype=float), (STEPS,)).copy()
    return ArchivedRun(
        name=f"{arm}-s{seed}",
        archive="synthetic",
        config=config(arm, seed, **{k.replace("__", "."): v for k, v in change.items()}),
        loss=loss,
        val_loss=val or {},
        grad_norm=np.zeros(STEPS),
        logged=np.ones(STEPS, dtype=bool),
        starts=list(starts),
        corpus_sha256=corpus,
    )


def curve(offset: float) -> np.ndarray:
    return 2.0 - np.linspace(0, 1, STEPS) + offset  # a falling loss, shifted per seed


def primary_runs(delta: dict[int, float]) -> dict[str, ArchivedRun]:
    """BF16 seeds 1-12; E2M1 0.05 above BF16's seed curve, UFP4 delta[s] above E2M1."""
    out = {}
    for s in DESIGN.primary_seeds:
        c = curve(0.01 * (s % 5))
        if s in DESIGN.seeds:
            out[f"bf16-s{s}"] = run("bf16", s, c, val={1000: 1.0})
        out[f"e2m1-s{s}"] = run("e2m1", s, c + 0.05, val={1000: 1.02})
        out[f"ufp4-s{s}"] = run("ufp4", s, c + 0.05 + delta[s], val={1000: 1.02 + delta[s]})
    return out


def test_primary_is_the_mean_relative_difference_and_waits_for_all_68_runs():
    delta = {s: 0.004 * ((s % 7) - 2) for s in DESIGN.primary_seeds}
    runs = primary_runs(delta)
    b = np.mean([curve(0.01 * (s % 5)) for s in DESIGN.seeds], axis=0)[-200:]
    want = {s: float(np.mean(d / b) * 100) for s, d in delta.items()}
    res = analyse(runs)
    assert res.primary.d.n == 28
    assert res.primary.d.values == pytest.approx(want)
    assert res.primary.d.mean == pytest.approx(np.mean(list(want.values())))
    assert res.primary.d.lo < res.primary.d.mean < res.primary.d.hi
    assert res.primary.val.values[1] == pytest.approx(delta[1] / 1.0 * 100)
    gaps = res.gaps.gaps
    assert gaps["e2m1"].mean == pytest.approx(np.mean([np.mean(0.05 / b) * 100] * 12))
    red, lo, _ = res.gaps.reduction
    assert lo is not None  # E2M1's gap resolves: a bounded interval
    assert red == pytest.approx(1 - gaps["ufp4"].mean / gaps["e2m1"].mean)
    assert res.ablation is None and len(res.missing["ablation"]) == 10 * 12
    assert set(gaps) == {"e2m1", "ufp4"}
    # an ablation arm's gap is not shown while some of its seeds are missing (no interim look)
    c = curve(0.01)
    partial = {**runs, **{f"mxfp4-s{s}": run("mxfp4", s, c + 0.07) for s in (1, 2)}}
    assert set(analyse(partial).gaps.gaps) == {"e2m1", "ufp4"}
    complete = {
        **runs,
        **{f"mxfp4-s{s}": run("mxfp4", s, curve(0.01 * (s % 5)) + 0.07) for s in DESIGN.seeds},
    }
    assert analyse(complete).gaps.gaps["mxfp4"].mean == pytest.approx(np.mean(0.07 / b) * 100)
    del runs["ufp4-s28"]  # one run short: no test, no estimate
    short = analyse(runs)
    assert short.primary is None and short.missing["primary"] == ["ufp4-s28"]


def test_runs_that_do_not_count_are_named_with_the_reason():
    good = run("e2m1", 3, 1.0)
    bad = {
        "seq": run("e2m1", 4, 1.0, train__seq_len=512),
        "corpus": run("e2m1", 5, 1.0, corpus="0" * 64),
        "resumed": run("e2m1", 6, 1.0, starts=(0, 300)),
        "unknown": run("e2m1", 7, 1.0, starts=()),
        "valid": run("e2m1", 8, 1.0, data__valid_seed=None),
    }
    short = run("e2m1", 9, 1.0)
    short.logged[500:] = False
    diverged = run("ufp4", 3, 1.0)
    diverged.loss[700:] = np.nan
    runs = {r.name: r for r in (good, *bad.values(), short, diverged, run("e2m1", 29, 1.0))}
    c = count_runs(runs)
    assert c.runs == {"e2m1": {3: good}}
    why = dict(c.excluded)
    assert "train.seq_len=512, the design has 256" in why["e2m1-s4"]
    assert "not the design's pysrc corpus" in why["e2m1-s5"]
    assert "resumed from a checkpoint (steps from 0, 300)" in why["e2m1-s6"]
    assert "no record of how it was trained" in why["e2m1-s7"]
    assert "data.valid_seed=None" in why["e2m1-s8"]
    assert "500 of 1000 steps logged" in why["e2m1-s9"]
    assert c.diverged == ["ufp4-s3"] and c.unplanned == ["e2m1-s29"]


def test_ablation_recovers_known_contrasts_in_one_pooled_model_with_holm():
    rng = np.random.default_rng(5)
    effect = dict.fromkeys(DESIGN.arms, 0.0)
    effect.update(ufp4_rht_wgrad=0.03, mxfp4=0.02)  # ufp4 - ufp4_rht_wgrad = -3% of B
    runs = primary_runs({s: rng.normal(scale=0.002) for s in DESIGN.primary_seeds})
    for arm in (*DESIGN.ablation_arms, *DESIGN.recipe_arms):
        for s in DESIGN.seeds:
            runs[f"{arm}-s{s}"] = run(
                arm, s, curve(0.01 * (s % 5)) + 0.05 + effect[arm] + rng.normal(scale=0.002)
            )
    res = analyse(runs)
    ab = res.ablation
    assert ab.fit.df == 11 * 11
    got = {(c.a, c.b): c for c in ab.contrasts}
    first = got["ufp4", "ufp4_rht_wgrad"]
    b = np.mean([curve(0.01 * (s % 5)) for s in DESIGN.seeds], axis=0)[-200:]
    assert first.lo < -np.mean(0.03 / b) * 100 < first.hi  # its true value
    assert first.se == pytest.approx(0.2 * np.sqrt(2 / 12), rel=0.3)  # noise 0.002 / ~1
    assert first.p_holm < 0.05 and got["mxfp4", "e2m1"].p_holm < 0.05
    assert got["ufp4_no_sr", "ufp4"].p_holm > 0.05
    assert [c.p_holm >= c.p for c in ab.contrasts] == [True] * 10
    assert abs(ab.control.estimate) < 0.05


def _tar(path, files: dict[str, bytes]):
    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def _metrics(losses) -> bytes:
    return "".join(
        json.dumps({"step": i + 1, "loss": x, "grad_norm": 0.5}) + "\n"
        for i, x in enumerate(losses)
    ).encode()


def test_archives_read_launch_records_and_log_headers(tmp_path):
    import yaml

    cfg = yaml.safe_dump(config("ufp4", 1)).encode()
    header = (
        b"\n===== 2026-01-01 00:00:00 attempt 1 slot 0 gpu 0 cpus [0] from step 0: x\n"
        b"\n===== 2026-01-01 00:05:00 attempt 2 slot 3 gpu 0 cpus [3] from step 141: x\n"
    )
    _tar(
        tmp_path / "round1.tar.gz",
        {
            "corpus.manifest.json": json.dumps({"sha256": "abc"}).encode(),
            "runs/ufp4-s1/metrics.jsonl": _metrics([3.0, 2.0, float("nan")]),
            "runs/ufp4-s1/config.yaml": cfg,
            "logs/ufp4-s1.log": header,
            "runs/e2m1-s1/metrics.jsonl": _metrics([3.0, 2.5]),
            "runs/e2m1-s1/config.yaml": cfg,
            "logs/e2m1-s1.log": header,
            "runs/e2m1-s1/launch.json": b'{"attempt": 3, "from_step": 0}',
        },
    )
    runs = load_study(tmp_path)
    u, e = runs["ufp4-s1"], runs["e2m1-s1"]
    assert u.starts == [0, 141] and u.one_process is False and u.diverged
    assert e.starts == [0] and e.one_process is True and not e.diverged
    assert e.corpus_sha256 == "abc" and e.seed == 1 and list(e.loss) == [3.0, 2.5]


def test_a_run_differing_between_archives_is_refused(tmp_path):
    import yaml

    cfg = yaml.safe_dump(config("ufp4", 1)).encode()
    for i, loss in ((1, 2.0), (2, 2.0), (3, 2.1)):
        _tar(
            tmp_path / f"round{i}.tar.gz",
            {"runs/ufp4-s1/metrics.jsonl": _metrics([loss]), "runs/ufp4-s1/config.yaml": cfg},
        )
    with pytest.raises(BadInput, match=r"ufp4-s1 differs between .*round1\.tar\.gz and .*round3"):
        load_study(tmp_path)
    (tmp_path / "round3.tar.gz").write_bytes(b"not a tar")
    with pytest.raises(BadInput, match=r"round3\.tar\.gz: not a readable study archive"):
        load_study(tmp_path)


def test_the_design_is_the_grid():
    """configs/study/prereg.yaml trains what report/prereg.py counts."""
    from ufp4_megatron.study.grid import expand, load_grid
    from ufp4_megatron.study.resolve import resolve

    g = load_grid("prereg")
    assert tuple(g.arms) == DESIGN.arms
    runs = expand(g)
    assert {(r.arm, r.seed) for r in runs} == {
        (a, s) for a in DESIGN.arms for s in DESIGN.seeds_of(a)
    }
    from omegaconf import OmegaConf

    from ufp4_megatron.train.overrides import compose_training, training_configs

    with training_configs():
        cfg = OmegaConf.to_container(compose_training(list(runs[0].overrides)), resolve=True)
    r = ArchivedRun(
        name=runs[0].name,
        archive="-",
        config=cfg,
        loss=np.ones(STEPS),
        val_loss={},
        grad_norm=np.ones(STEPS),
        logged=np.ones(STEPS, dtype=bool),
        starts=[0],
        corpus_sha256=DESIGN.corpus_sha256,
    )
    cfg["data"]["prefixes"] = ["/tmp/corpus/pysrc"]  # gpu/study.sh's, not the grid's
    from ufp4_megatron.report.prereg import why_not_counted

    assert why_not_counted(r) is None
    assert resolve(runs[:1])[runs[0].name].tokens_per_step == 32768

"""The study runner's plan, without training: grid expansion, seeds, arms, the manifest's merge
rules, packing slots and the child environment, and the one-line errors of bad input.

    test_expand_is_seed_major_with_axes          names, order, overrides of each run
    test_every_shipped_grid_composes             every run of configs/study/*.yaml is a valid
                                                 trainer config (Hydra composes it)
    test_parse_seeds / test_bad_seeds_fail       '1-3,7' and its errors
    test_bad_grids_fail_naming_the_problem       unknown arm, runner-owned key, bad YAML key
    test_runs_confused_in_reports_are_refused    an axis that does not rename the model
    test_merge_adds_runs_and_keeps_status        more seeds into an existing study
    test_merge_refuses_changed_overrides
    test_paired_runs_need_a_done_reference
    test_slots_share_cpus_and_alternate_gpus     round-robin CUDA_VISIBLE_DEVICES
    test_child_env_pins_threads_and_gpu
    test_cli_errors                              --resume without a study, no grid
    test_axis_keeps_some_values_of_an_axis       --axis depth=L3,L12, and its errors
    test_lock_refuses_a_second_runner
    test_study11m_has_the_measured_shape         6 x 384, 10,916,736 parameters
"""

from __future__ import annotations

import json

import pytest

from ufp4_megatron.cli.launch import ABLATIONS
from ufp4_megatron.cli.launch import main as launch_main
from ufp4_megatron.study import manifest as mf
from ufp4_megatron.study.cli import main as study_main
from ufp4_megatron.study.cli import paired_runs
from ufp4_megatron.study.grid import (
    E2M1_ABLATIONS,
    StudyGrid,
    check_grid,
    expand,
    grid_names,
    load_grid,
    parse_seeds,
    seeds_of,
)
from ufp4_megatron.study.packing import Slot, child_env, make_slots
from ufp4_megatron.study.resolve import RunInfo, resolve
from ufp4_megatron.study.runner import StudyLock


def grid(**kw) -> StudyGrid:
    base = dict(name="t", arms=["bf16", "ufp4"], seeds=[1, 2], overrides=["model=tiny"])
    return StudyGrid(**(base | kw))


def test_expand_is_seed_major_with_axes():
    g = grid(
        axes={
            "depth": {
                "L2": ["model.num_layers=2", "model.name=t2"],
                "L4": ["model.num_layers=4", "model.name=t4"],
            }
        }
    )
    runs = expand(g)
    assert [r.name for r in runs] == [
        "bf16-L2-s1",
        "ufp4-L2-s1",
        "bf16-L4-s1",
        "ufp4-L4-s1",
        "bf16-L2-s2",
        "ufp4-L2-s2",
        "bf16-L4-s2",
        "ufp4-L4-s2",
    ]
    r = runs[3]
    assert (r.arm, r.seed, r.axis) == ("ufp4", 1, {"depth": "L4"})
    assert r.overrides == (
        "model=tiny",
        "model.num_layers=4",
        "model.name=t4",
        "precision=ufp4",
        "train.seed=1",
    )


def test_named_ablations_label_their_runs():
    arms = ["ufp4_rht_none", "e2m1_uniform"]
    runs = expand(grid(arms=["bf16", *arms], seeds=[3]))
    infos = resolve(runs)
    assert [infos[r.name].recipe for r in runs] == ["bf16", *arms]
    assert runs[1].overrides == (
        "model=tiny",
        "precision=ufp4",
        "precision.name=ufp4_rht_none",
        *ABLATIONS["ufp4_rht_none"],
        "train.seed=3",
    )
    assert E2M1_ABLATIONS["e2m1_uniform"][0] in runs[2].overrides


@pytest.mark.parametrize("name", grid_names())
def test_every_shipped_grid_composes(name):
    g = load_grid(name)
    runs = expand(g)
    assert len(runs) == sum(len(seeds_of(g, a)) for a in g.arms) * max(
        1, len(next(iter(g.axes.values()), {}))
    )
    # the seeds differ in train.seed alone: every arm and axis value at one seed composes
    # what every run does (all of them: ~0.4 s a run on a 2-core machine, 188 in prereg)
    first = {}
    for r in runs:
        first.setdefault((r.arm, tuple(r.axis.items())), r)
    infos = resolve(list(first.values()))  # raises SystemExit naming the run on any bad one
    assert {i.recipe for i in infos.values()} == set(g.arms)


def test_arm_seeds_give_an_arm_its_own_seeds(tmp_path):
    """arm_seeds: BF16 at fewer seeds than the arms compared with each other, seed-major
    still; such a grid fixes its seeds (--seeds is refused), --arms still chooses arms."""
    g = grid(
        arms=["bf16", "e2m1", "ufp4"],
        seeds=[1, 2],
        arm_seeds={"e2m1": [1, 2, 3, 4], "ufp4": [1, 2, 3, 4]},
    )
    assert [r.name for r in expand(g)] == [
        "bf16-s1",
        "e2m1-s1",
        "ufp4-s1",
        "bf16-s2",
        "e2m1-s2",
        "ufp4-s2",
        "e2m1-s3",
        "ufp4-s3",
        "e2m1-s4",
        "ufp4-s4",
    ]
    with pytest.raises(SystemExit, match="arm_seeds of ufp4: \\[\\]; give distinct"):
        check_grid(grid(arm_seeds={"ufp4": []}))
    with pytest.raises(SystemExit, match="unknown arm 'ufp5'"):
        check_grid(grid(arm_seeds={"ufp5": [1]}))
    with pytest.raises(SystemExit, match="fixes each arm's seeds"):
        study_main(["--out", str(tmp_path), "--grid", "prereg", "--seeds", "1", "--dry-run"])
    primary = load_grid("prereg")
    primary.arms = ["bf16", "e2m1", "ufp4"]  # --arms bf16,e2m1,ufp4
    assert len(expand(primary)) == 12 + 28 + 28


def test_study_grids_share_their_runs():
    """A run of the same arm and seed is the same run in main, ablation and depth (depth's own
    depths aside), so one study dir holds all three without training it twice."""
    main = {r.name: r.overrides for r in expand(load_grid("main"))}
    for other in ("ablation", "depth"):
        for r in expand(load_grid(other)):
            if r.name in main:
                assert r.overrides == main[r.name], r.name


@pytest.mark.parametrize(
    "spec,seeds", [("1-3", [1, 2, 3]), ("5", [5]), ("1-2,7,2", [1, 2, 7]), (" 0 - 1 ", [0, 1])]
)
def test_parse_seeds(spec, seeds):
    assert parse_seeds(spec) == seeds


@pytest.mark.parametrize("spec", ["3-1", "a", "1-", "", "-2"])
def test_bad_seeds_fail(spec):
    with pytest.raises(SystemExit, match="--seeds"):
        parse_seeds(spec)


def test_bad_grids_fail_naming_the_problem(tmp_path):
    with pytest.raises(SystemExit, match="unknown arm 'ufp5'.*valid: .*ufp4_rht_none"):
        expand(grid(arms=["bf16", "ufp5"]))
    from ufp4_megatron.study.grid import check_grid

    with pytest.raises(SystemExit, match="sets train.seed, which the runner sets"):
        check_grid(grid(overrides=["train.seed=3"]))
    with pytest.raises(
        SystemExit,
        match=r"reference 'bf16' is not among the arms \['ufp4'\]; "
        r".*add it \(e.g. --arms bf16,ufp4; its runs complete on disk",
    ):
        check_grid(grid(arms=["ufp4"]))
    bad = tmp_path / "g.yaml"
    bad.write_text("name: g\narms: [bf16]\nseeds: [1]\nseed: 4\n")
    with pytest.raises(SystemExit, match="Key 'seed' not in 'StudyGrid'"):
        load_grid(str(bad))
    with pytest.raises(SystemExit, match="no grid 'nope'; give a YAML path or one of: .*main"):
        load_grid("nope")
    with pytest.raises(SystemExit, match="run bf16-s1: .*model.num_layer"):
        resolve(expand(grid(overrides=["model=tiny", "model.num_layer=3"])))
    with pytest.raises(
        SystemExit,
        match=r"run bf16-s1: model.num_layer is not a key of the "
        r"training config, so nothing would read it",
    ):
        resolve(expand(grid(overrides=["model=tiny", "+model.num_layer=3"])))


def test_runs_confused_in_reports_are_refused():
    g = grid(axes={"depth": {"L2": ["model.num_layers=2"], "L4": ["model.num_layers=4"]}})
    with pytest.raises(SystemExit, match="compare could not tell them apart"):
        resolve(expand(g))


def _info(steps=8):
    return RunInfo(
        steps=steps, model="tiny", recipe="bf16", seed=1, tokens_per_step=64, embedded_data=None
    )


def test_merge_adds_runs_and_keeps_status():
    g = grid(seeds=[1])
    runs = expand(g)
    m = mf.merge(None, g, runs, {r.name: _info() for r in runs})
    m["runs"][0]["status"] = "done"
    g2 = grid(seeds=[1, 2])
    runs2 = expand(g2)
    m2 = mf.merge(json.loads(json.dumps(m)), g2, runs2, {r.name: _info() for r in runs2})
    assert [r["name"] for r in m2["runs"]] == ["bf16-s1", "ufp4-s1", "bf16-s2", "ufp4-s2"]
    assert [r["status"] for r in m2["runs"]] == ["done", "pending", "pending", "pending"]
    assert len(m2["grids"]) == 2


def test_merge_refuses_changed_overrides():
    g = grid(seeds=[1])
    runs = expand(g)
    m = mf.merge(None, g, runs, {r.name: _info() for r in runs})
    g2 = grid(seeds=[1], overrides=["model=tiny", "train.steps=9"])
    with pytest.raises(
        SystemExit,
        match=r"run bf16-s1 is already in this study with other "
        r"overrides \(differing: \['train.steps=9'\]\)",
    ):
        mf.merge(m, g2, expand(g2), {r.name: _info() for r in expand(g2)})
    with pytest.raises(
        SystemExit, match="reference 'bf16' and baseline 'e2m1'; the grid says 'ufp4'"
    ):
        mf.merge(m, grid(arms=["ufp4", "bf16"], reference="ufp4"), runs, {})


def test_paired_runs_need_a_done_reference():
    runs = [
        {"name": n, "arm": a, "model": "m", "seed": s, "status": st}
        for n, a, s, st in [
            ("b1", "bf16", 1, "done"),
            ("u1", "ufp4", 1, "done"),
            ("b2", "bf16", 2, "failed"),
            ("u2", "ufp4", 2, "done"),
            ("b3", "bf16", 3, "done"),
        ]
    ]
    got = paired_runs({"reference": "bf16", "runs": runs})
    assert [r["name"] for r in got] == ["b1", "u1"]


def test_slots_share_cpus_and_alternate_gpus():
    slots = make_slots(3, ["0", "1"], list(range(16)))
    assert [s.gpu for s in slots] == ["0", "1"] * 3
    assert [len(s.cpus) for s in slots] == [3, 3, 3, 3, 2, 2]
    assert sorted(c for s in slots for c in s.cpus) == list(range(16))  # disjoint, all used
    cpu = make_slots(3, [], [0, 1])  # more slots than CPUs: one each, shared
    assert [(s.gpu, s.cpus) for s in cpu] == [(None, (0,)), (None, (1,)), (None, (0,))]
    with pytest.raises(SystemExit, match="--per-device 0 must be at least 1"):
        make_slots(0, [], [0])


def test_child_env_pins_threads_and_gpu():
    base = {"PATH": "/bin", "RANK": "3", "WORLD_SIZE": "8", "OMP_NUM_THREADS": "16"}
    e = child_env(base, Slot(index=0, gpu="1", cpus=(4, 5)), 2, hide_gpus=False)
    assert (e["OMP_NUM_THREADS"], e["CUDA_VISIBLE_DEVICES"], e["PATH"]) == ("2", "1", "/bin")
    assert "RANK" not in e and "WORLD_SIZE" not in e
    cpu = child_env(base, Slot(index=0, gpu=None, cpus=(0,)), 1, hide_gpus=True)
    assert cpu["CUDA_VISIBLE_DEVICES"] == ""


def test_cli_errors(tmp_path, capsys):
    with pytest.raises(SystemExit, match="--resume: no study.json in"):
        study_main(["--out", str(tmp_path), "--resume"])
    with pytest.raises(SystemExit, match="give --grid, or --arms and --seeds"):
        study_main(["--out", str(tmp_path), "--arms", "bf16"])
    with pytest.raises(SystemExit, match="--time-limit 0.0 must be a positive number"):
        study_main(["--out", str(tmp_path), "--grid", "demo", "--time-limit", "0", "--dry-run"])
    with pytest.raises(SystemExit, match="--stop-grace -5.0 must be a positive number"):
        study_main(["--out", str(tmp_path), "--grid", "demo", "--stop-grace", "-5", "--dry-run"])
    with pytest.raises(SystemExit, match="--gpus ','"):
        study_main(["--out", str(tmp_path), "--grid", "demo", "--gpus", ",", "--dry-run"])
    with pytest.raises(SystemExit, match="--pause-at-limit needs --time-limit SECONDS"):
        study_main(["--out", str(tmp_path), "--grid", "demo", "--pause-at-limit", "--dry-run"])
    with pytest.raises(SystemExit, match="--restart-incomplete starts them over: choose one"):
        study_main(
            [
                "--out",
                str(tmp_path),
                "--grid",
                "demo",
                "--time-limit",
                "9",
                "--pause-at-limit",
                "--restart-incomplete",
                "--dry-run",
            ]
        )
    # the subcommand of ufp4-launch is the same parser
    assert (
        launch_main(
            [
                "study",
                "--out",
                str(tmp_path / "s"),
                "--grid",
                "demo",
                "--gpus",
                "none",
                "--seeds",
                "4",
                "--dry-run",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "study demo: 3 runs" in out and "ufp4-s4 [pending]" in out
    assert not (tmp_path / "s").exists()  # a dry run writes nothing


def test_pause_at_limit_reaches_the_runner(tmp_path, monkeypatch):
    """The flag's wiring (its behaviour: test_study_runs.py::test_a_pause_at_the_limit_...)."""
    from ufp4_megatron.study import cli

    seen = []

    class Recorder:
        def __init__(self, study, manifest, infos, slots, options, names=None):
            seen.append(options)
            self.manifest, self.stop_reason = manifest, None

        def run(self):
            return self.manifest

    monkeypatch.setattr(cli, "Runner", Recorder)
    for flags, pause, restart in (
        (["--time-limit", "60", "--pause-at-limit"], True, False),
        (["--time-limit", "60"], False, False),
        (["--restart-incomplete"], False, True),
    ):
        study_main(
            [
                "--out",
                str(tmp_path / str(flags)),
                "--grid",
                "demo",
                "--gpus",
                "none",
                "--no-compare",
                *flags,
            ]
        )
        assert (seen[-1].pause_at_limit, seen[-1].restart_incomplete) == (pause, restart)
    assert seen[0].time_limit == 60.0


def test_restart_incomplete_moves_partial_runs_aside_and_launch_records_the_start(tmp_path):
    """--restart-incomplete: a run an earlier invocation left at step 3 (metrics and a
    checkpoint) is moved to discarded/ before anything starts, so it trains from step 0; a
    complete run's files are never touched. Each launch writes launch.json (the start step of
    the process that will complete the run)."""
    from ufp4_megatron.study.runner import Options, Runner

    partial = mf.run_dir(tmp_path, "ufp4-s1")
    (partial / "checkpoints").mkdir(parents=True)
    (partial / "checkpoints" / "latest").write_text("3")
    (partial / "metrics.jsonl").write_text("".join(f'{{"step": {i}}}\n' for i in (1, 2, 3)))
    untouched = mf.run_dir(tmp_path, "bf16-s1")
    untouched.mkdir(parents=True)
    records = [
        {"name": "ufp4-s1", "attempts": 1, "steps": 10},
        {"name": "ufp4-s2", "attempts": 0, "steps": 10},
    ]
    runner = Runner(
        tmp_path, {"name": "t", "runs": records}, {}, [], Options(restart_incomplete=True)
    )
    runner._discard_partial(records)
    moved = tmp_path / "discarded" / "ufp4-s1-attempt1"
    assert (moved / "checkpoints" / "latest").read_text() == "3" and not partial.exists()
    assert untouched.exists()
    partial.mkdir()
    (partial / "metrics.jsonl").write_text('{"step": 1}\n')
    runner._discard_partial(records[:1])  # a second discard of the same attempt: own name
    assert (tmp_path / "discarded" / "ufp4-s1-attempt1.1" / "metrics.jsonl").exists()
    partial.mkdir()
    mf.write_launch(partial, attempt=2, from_step=0)
    assert json.loads((partial / mf.LAUNCH).read_text()) == {
        "attempt": 2,
        "from_step": 0,
        "mps": False,
    }


def test_lock_refuses_a_second_runner(tmp_path):
    held = StudyLock(tmp_path, wait=0)
    try:
        with pytest.raises(SystemExit, match="is in use by another runner or by trainers"):
            StudyLock(tmp_path, wait=0)
    finally:
        held.release()
    StudyLock(tmp_path, wait=0).release()  # free again once released


def test_study11m_has_the_measured_shape():
    from ufp4_megatron.train.footprint import count_params, load_config

    m = load_config(["model=study11m"]).model
    assert (m.num_layers, m.hidden_size, count_params(m).total) == (6, 384, 10_916_736)


def test_axis_keeps_some_values_of_an_axis(tmp_path, capsys):
    """--axis depth=L12,L3: the depth grid's cheap depths first (in the grid's order), the
    deepest in a later invocation; bad specs fail in one line naming what exists."""
    out = str(tmp_path / "s")
    assert (
        study_main(
            [
                "--out",
                out,
                "--grid",
                "depth",
                "--seeds",
                "2",
                "--axis",
                "depth=L12,L3",
                "--gpus",
                "none",
                "--dry-run",
            ]
        )
        == 0
    )
    plan = capsys.readouterr().out
    assert "study study: 6 runs" in plan
    for name in ("bf16-L3-s2", "ufp4-L3-s2", "e2m1-L12-s2"):
        assert f"{name} [pending]" in plan
    assert "L24" not in plan
    assert plan.index("bf16-L3-s2") < plan.index("bf16-L12-s2")  # the grid's order
    for spec, match in (
        ("depth", "write NAME=VALUE"),
        ("=L3", "write NAME=VALUE"),
        ("depth=", "write NAME=VALUE"),
        ("width=L3", "no axis 'width' \\(its axes: depth\\)"),
        ("depth=L3,L5", "depth has no value 'L5' \\(its values: L3, L12, L24\\)"),
    ):
        with pytest.raises(SystemExit, match=match):
            study_main(["--out", out, "--grid", "depth", "--axis", spec, "--dry-run"])
    with pytest.raises(SystemExit, match="no axis 'depth' \\(its axes: none\\)"):
        study_main(["--out", out, "--grid", "main", "--axis", "depth=L3", "--dry-run"])
    g = grid(seeds=[1])
    runs = expand(g)
    (tmp_path / "s").mkdir()
    mf.save(tmp_path / "s", mf.merge(None, g, runs, {r.name: _info() for r in runs}))
    with pytest.raises(SystemExit, match="drop --grid/--arms/--seeds/--axis"):
        study_main(["--out", out, "--resume", "--axis", "depth=L3"])

"""The study runner with real trainers on CPU (`python -m ufp4_megatron.study` in a subprocess).

test_packed_runs_are_concurrent_and_pinned   2 slots: two trainers alive at once, each
    pinned to its own CPUs with OMP_NUM_THREADS=1 (read from /proc), recorded in
    study.json; then compare over the seeds (make test-slow)
test_killed_study_resumes_and_skips_complete_runs   SIGKILL on the runner and its
    trainers mid-way; the rerun completes every run, the complete one is not retrained
    (its metrics.jsonl is byte-identical) and the one in progress resumes from its
    checkpoint (its lines up to that step are unchanged)
test_time_limit_leaves_runs_for_the_next_round   exit 3: the run in progress at the
    limit is stopped, the one that would not fit is left pending (make test-slow)
test_time_limit_sheds_the_least_advanced_runs   the shedding decision on real processes
test_shed_stops_the_highest_seed_first   whole seeds complete, not the fastest recipe
test_no_start_without_time_for_it_when_nothing_runs   the last measured rate stands in
test_an_invocation_trains_its_own_runs   --seeds 1 leaves an earlier invocation's seed 2
test_sigterm_stops_cleanly_and_resume_finishes   the trainer saves where it is; --resume
    (make test-slow)
test_restart_incomplete_trains_a_stopped_run_again_in_one_process   no resume across
    invocations: from step 0, the partial run kept in discarded/ (make test-slow)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from study_helpers import FAST, ROOT, children, cpu_list, env, proc_view, study_cmd

from ufp4_megatron.study.packing import available_cpus


def manifest(out):
    try:
        return json.loads((out / "study.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def status(out) -> dict:
    m = manifest(out)
    return {r["name"]: r["status"] for r in m["runs"]} if m else {}


def lines(path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def trainer_children(pid: int) -> list[int]:
    return [
        c for c in children(pid) if "ufp4_megatron.train" in ((proc_view(c) or {}).get("cmd") or [])
    ]


# slow (kept out of make test's 20 minutes): in make test the slots' CPUs and the child's
# environment are test_study_grid.py's test_slots_share_cpus_and_alternate_gpus and
# test_child_env_pins_threads_and_gpu, and a study of real trainers runs in
# test_killed_study_resumes_and_skips_complete_runs
@pytest.mark.slow
@pytest.mark.skipif(len(available_cpus()) < 2, reason="packing needs 2 CPUs")
def test_packed_runs_are_concurrent_and_pinned(tmp_path):
    out = tmp_path / "study"
    cmd = study_cmd(
        out,
        "--arms",
        "bf16,e2m1",
        "--seeds",
        "1",
        "--per-device",
        "2",
        "--",
        *FAST,
        "train.steps=20",
    )
    runner = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = []  # (CPU set, OMP_NUM_THREADS) of the trainers alive at the same moment
    while runner.poll() is None:
        views = [v for v in map(proc_view, trainer_children(runner.pid)) if v and v["omp"]]
        if len(views) == 2:
            seen = [(cpu_list(v["cpus"]), int(v["omp"])) for v in views]
            break
        time.sleep(0.05)
    log = runner.communicate(timeout=300)[0]
    assert runner.returncode == 0, log[-3000:]
    assert len(seen) == 2, log[-2000:]  # both trainers ran at once
    (a, na), (b, nb) = seen
    assert a and b and not a & b, seen  # each pinned to its own CPUs
    assert (na, nb) == (1, 1), seen  # one OpenMP thread each
    m = manifest(out)
    shares = [set(r["slot"]["cpus"]) for r in m["runs"]]
    assert sorted(map(sorted, shares)) == sorted(map(sorted, (a, b)))
    assert all(r["status"] == "done" and r["slot"]["threads"] == 1 for r in m["runs"])
    gaps = json.loads((out / "compare" / "loss_gap.json").read_text())  # compare over the seeds
    assert [(r["recipe"], r["seeds"]) for r in gaps["recipes"]] == [("e2m1", [1])]


def test_killed_study_resumes_and_skips_complete_runs(tmp_path):
    out = tmp_path / "study"
    steps = 60
    cmd = study_cmd(
        out,
        "--arms",
        "bf16,e2m1",
        "--seeds",
        "1",
        "--per-device",
        "1",
        "--",
        *FAST,
        f"train.steps={steps}",
        "checkpoint.interval=5",
    )
    runner = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    bf16, e2m1 = out / "runs" / "bf16-s1", out / "runs" / "e2m1-s1"
    deadline = time.monotonic() + 300
    while True:  # kill once bf16 is done and e2m1 has a checkpoint but more steps to go
        assert runner.poll() is None, "the study ended before it could be killed mid-way"
        assert time.monotonic() < deadline, status(out)
        latest = e2m1 / "checkpoints" / "latest"
        if status(out).get("bf16-s1") == "done" and latest.exists():
            os.kill(runner.pid, signal.SIGSTOP)  # it cannot react while its trainers die
            for pid in trainer_children(runner.pid):
                os.kill(pid, signal.SIGKILL)
            os.kill(runner.pid, signal.SIGKILL)
            runner.wait()
            break
        time.sleep(0.05)
    ckpt = int((e2m1 / "checkpoints" / "latest").read_text())
    assert 5 <= ckpt < steps, "e2m1 finished before the kill; make it longer"
    done_before = (bf16 / "metrics.jsonl").read_bytes()
    kept_before = [
        line for line in lines(e2m1 / "metrics.jsonl") if json.loads(line)["step"] <= ckpt
    ]
    assert len(kept_before) == ckpt

    again = subprocess.run(
        cmd, cwd=ROOT, env=env(tmp_path), capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert status(out) == {"bf16-s1": "done", "e2m1-s1": "done"}
    assert (bf16 / "metrics.jsonl").read_bytes() == done_before  # not retrained
    after = lines(e2m1 / "metrics.jsonl")
    assert [json.loads(line)["step"] for line in after] == list(range(1, steps + 1))
    assert after[:ckpt] == kept_before  # resumed from its checkpoint, not restarted
    runs = {r["name"]: r for r in manifest(out)["runs"]}
    assert runs["bf16-s1"]["attempts"] == 1 and runs["e2m1-s1"]["attempts"] == 2
    assert f"resuming at step {ckpt}" in again.stdout
    assert (out / "compare" / "loss_gap.md").exists()


# slow (kept out of make test's 20 minutes): in make test the time limit's exit 3 with
# runs left pending is test_an_invocation_trains_its_own_runs', the stop decision on real
# processes the shed tests below, a trainer's save and stop on SIGTERM test_train_run.py's
@pytest.mark.slow
def test_time_limit_leaves_runs_for_the_next_round(tmp_path):
    out = tmp_path / "study"
    args = [
        "--arms",
        "bf16",
        "--seeds",
        "1-2",
        "--per-device",
        "1",
        "--no-compare",
        "--",
        *FAST,
        "train.steps=3000",
        "checkpoint.interval=500",
    ]
    first = subprocess.run(
        study_cmd(out, "--time-limit", "20", *args),
        cwd=ROOT,
        env=env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert first.returncode == 3, first.stdout[-3000:] + first.stderr[-3000:]
    assert status(out) == {"bf16-s1": "stopped", "bf16-s2": "pending"}
    assert "stopping (time limit)" in first.stdout
    assert "1 runs not started" in first.stdout


def test_time_limit_sheds_the_least_advanced_runs(tmp_path):
    """The decision alone, on real processes (sleep stands in for three trainers measured at 2
    steps/s each): 50 s left, 6 steps/s in all; steps left 100, 500, 900 need 250 s, so the
    two least advanced are stopped and the most advanced one finishes; no new run starts."""
    from ufp4_megatron.study.packing import Slot
    from ufp4_megatron.study.runner import Active, Options, Runner

    records = [{"name": f"r{i}", "steps": 1000, "status": "running"} for i in range(4)]
    runner = Runner(
        tmp_path,
        {"name": "t", "runs": records},
        {},
        [Slot(0, None, (0,))] * 3,
        Options(time_limit=100.0),
    )
    now = time.monotonic()
    runner.t0 = now - 50
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    try:
        for i, (proc, step) in enumerate(zip(procs, (900, 500, 100))):
            runner.active[i] = Active(
                record=records[i],
                proc=proc,
                slot=Slot(i, None, (0,)),
                log=None,
                launched=now - 40,
                start_step=0,
                first_seen=now - 30,
                first_step=step - 60,
                step=step,
                warm_at=now - 20,
                history=[(now - 30, step - 60), (now - 20, step - 40), (now, step)],
            )
        assert runner._aggregate_rate() == pytest.approx(6.0, rel=0.01)
        assert not runner._fits(records[3])
        runner._shed()
        for proc in procs[1:]:
            proc.wait(timeout=10)
        assert [p.returncode for p in procs] == [None, -signal.SIGTERM, -signal.SIGTERM]
        assert [a.stop_sent for a in runner.active.values()] == [False, True, True]
        # right after a shed nothing is measured (the stopped trainers still save): no rate,
        # so no second shed and no new start until the survivors have run SETTLE seconds
        assert runner._aggregate_rate() is None and not runner._fits(records[3])
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _sleeping_runner(tmp_path, records, positions, left_s, rate_window=20, pause=False):
    """A Runner whose active runs are `sleep` processes at the given steps, each measured at
    (step - 40) rate_window seconds ago, warm; left_s seconds to its time limit."""
    from ufp4_megatron.study.packing import Slot
    from ufp4_megatron.study.runner import Active, Options, Runner

    runner = Runner(
        tmp_path,
        {"name": "t", "runs": records},
        {},
        [Slot(i, None, (0,)) for i in range(len(records))],
        Options(time_limit=100.0, pause_at_limit=pause),
    )
    now = time.monotonic()
    runner.t0 = now - (100.0 - left_s)
    procs = []
    for i, step in enumerate(positions):
        proc = subprocess.Popen(["sleep", "60"])
        procs.append(proc)
        runner.active[i] = Active(
            record=records[i],
            proc=proc,
            slot=Slot(i, None, (0,)),
            log=None,
            launched=now - 40,
            start_step=0,
            first_seen=now - 30,
            first_step=step - 60,
            step=step,
            warm_at=now - 30,
            history=[(now - rate_window, step - 40), (now, step)],
        )
    return runner, procs


def test_shed_stops_the_highest_seed_first(tmp_path):
    """Both pysrc rounds on the H200 shed E2M1's runs (its kernels compile longest, so it was
    always furthest behind), leaving E2M1 seeds 1, 3, 5 against UFP4's 1-4. Now the highest
    seed goes first: 6 steps/s in all, 200 s left; steps left 600 (seed 1), 100 (seed 2), 500
    (seed 3) need 200 s x 1.15: seed 3 stops (the old rule stopped seed 1, the furthest
    behind), and 700 steps fit."""
    records = [
        {"name": f"e2m1-s{s}", "seed": s, "steps": 1000, "status": "running"} for s in (1, 2, 3)
    ]
    runner, procs = _sleeping_runner(tmp_path, records, (400, 900, 500), left_s=200)
    try:
        assert runner._aggregate_rate() == pytest.approx(6.0, rel=0.01)
        runner._shed()
        procs[2].wait(timeout=10)
        assert [p.poll() for p in procs] == [None, None, -signal.SIGTERM]
        assert [a.stop_sent for a in runner.active.values()] == [False, False, True]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_pause_at_the_limit_sheds_nothing_and_starts_while_there_is_time(tmp_path):
    """--pause-at-limit (runs longer than one allocation: the 125M grid on 10-minute leases):
    the same runs that test_shed_stops_the_highest_seed_first sheds keep training, and a new
    run starts however far it is from its end, as long as it trains 30 s after its start-up."""
    records = [
        {"name": f"e2m1-s{s}", "seed": s, "steps": 1000, "status": "running"} for s in (1, 2, 3)
    ]
    new = {"name": "e2m1-s4", "seed": 4, "steps": 1000, "status": "pending"}
    runner, procs = _sleeping_runner(
        tmp_path, records + [new], (400, 900, 500), left_s=200, pause=True
    )
    try:
        runner._shed()
        time.sleep(0.2)
        assert [p.poll() for p in procs] == [None, None, None]
        assert not any(a.stop_sent for a in runner.active.values())
        runner.startups = [20.0]
        assert runner._fits(new)  # 200 s left > 20 s start-up + 30 s
        runner.t0 = time.monotonic() - 55  # 45 s left
        assert not runner._fits(new)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_no_start_without_time_for_it_when_nothing_runs(tmp_path):
    """With 56 s left and nothing running, nothing is being measured; a new run must not start
    regardless only to be stopped at the limit. The latest rate measured stands in: a
    1000-step run at 40 steps/s with a 30-s start-up needs 55 s x 1.15, more than 56 s; with
    100 s left it starts. Before any measurement, runs start."""
    from ufp4_megatron.study.packing import Slot
    from ufp4_megatron.study.runner import Options, Runner

    new = {"name": "bf16-s6", "seed": 6, "steps": 1000, "status": "pending"}
    runner = Runner(
        tmp_path, {"name": "t", "runs": [new]}, {}, [Slot(0, None, (0,))], Options(time_limit=100.0)
    )
    runner.t0 = time.monotonic() - 44
    assert runner._fits(new)  # nothing measured in this study yet: the first runs start
    runner._last_rate, runner.startups = 40.0, [30.0]
    assert not runner._fits(new)
    runner.t0 = time.monotonic()
    assert runner._fits(new)


def test_an_invocation_trains_its_own_runs(tmp_path):
    """An invocation with --seeds 1 trains seed 1 only, though the study holds seed 2 from an
    earlier one (it must not start the other invocation's pending runs too); it says what it
    left, and its exit status is about its own runs."""
    out = tmp_path / "study"
    args = ["--arms", "bf16", "--no-compare", "--", *FAST, "train.steps=3"]
    plan = subprocess.run(
        study_cmd(out, "--seeds", "1-2", "--time-limit", "0.001", *args),
        cwd=ROOT,
        env=env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert plan.returncode == 3, plan.stdout[-3000:] + plan.stderr[-3000:]
    assert status(out) == {"bf16-s1": "pending", "bf16-s2": "pending"}
    one = subprocess.run(
        study_cmd(out, "--seeds", "1", *args),
        cwd=ROOT,
        env=env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    assert status(out) == {"bf16-s1": "done", "bf16-s2": "pending"}
    assert "1 runs of earlier invocations left as they are (bf16-s2)" in one.stdout


def test_warm_up_and_shed_do_not_cascade(tmp_path):
    """Packed trainers measured while they compile kernels look slow: a runner that sheds one
    and re-measures at once (the rest still slow) would shed again, down to one run. A
    trainer's first WARMUP_STEPS steps do not count, and a shed waits SETTLE seconds of fresh
    steps before deciding again."""
    from ufp4_megatron.study.packing import Slot
    from ufp4_megatron.study.runner import Active, Options, Runner

    records = [{"name": f"r{i}", "steps": 1000, "status": "running"} for i in range(2)]
    runner = Runner(
        tmp_path,
        {"name": "t", "runs": records},
        {},
        [Slot(0, None, (0,))] * 2,
        Options(time_limit=100.0),
    )
    now = time.monotonic()
    runner.t0 = now - 50
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    try:
        for i, proc in enumerate(procs):  # 15 steps in 30 s: compiling, not yet warm
            runner.active[i] = Active(
                record=records[i],
                proc=proc,
                slot=Slot(i, None, (0,)),
                log=None,
                launched=now - 40,
                start_step=0,
                first_seen=now - 30,
                first_step=1,
                step=16,
                history=[(now - 30, 1), (now, 16)],
            )
        assert runner._aggregate_rate() is None
        runner._shed()
        assert not any(a.stop_sent for a in runner.active.values())
        # warm for 25 s since the shed of another run 10 s ago: measured from the shed on
        runner._shed_at = now - 10
        for a in runner.active.values():
            a.warm_at, a.step, a.history = (
                now - 25,
                500,
                [(now - 25, 300), (now - 10, 400), (now, 500)],
            )
        assert runner._aggregate_rate() is None  # 10 s after the shed < SETTLE
        runner._shed_at = now - 20
        a0 = runner.active[0]
        a0.history = [(now - 25, 300), (now - 20, 400), (now, 500)]
        runner.active[1].history = list(a0.history)
        assert runner._aggregate_rate() == pytest.approx(10.0, rel=0.01)  # 2 x 100 steps / 20 s
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_an_exit_makes_the_survivors_rate_measured_afresh(tmp_path):
    """When packed runs end, the survivors speed up, but their steps of the last WINDOW were
    taken beside the others: measured over them, two runs at step 500 look like 10 steps/s in
    all (1000 steps left need 115 s with the margin, 90 s are left) and one would be stopped
    late in its run. The exit, seen by _poll, makes the rate wait SETTLE seconds of fresh steps
    (no shed meanwhile); then it is 16 steps/s and both runs fit."""
    from ufp4_megatron.study.packing import Slot
    from ufp4_megatron.study.runner import Active

    records = [
        {"name": f"nvfp4-s{s}", "seed": s, "steps": 1000, "status": "running"} for s in (1, 2)
    ]
    ended = {"name": "mxfp4-s1", "seed": 1, "steps": 1000, "status": "running", "started": 0}
    runner, procs = _sleeping_runner(tmp_path, records, (500, 500), left_s=90)
    now = time.monotonic()
    for a in runner.active.values():  # 100 steps in 34 s beside the others, 200 in 25 s alone
        a.warm_at, a.history = now - 300, [(now - 59, 200), (now - 25, 300), (now, 500)]
    assert runner._aggregate_rate() == pytest.approx(10.2, rel=0.02)  # the stale window
    runner.manifest["runs"].append(ended)
    metrics = tmp_path / "runs" / "mxfp4-s1" / "metrics.jsonl"
    metrics.parent.mkdir(parents=True)
    metrics.write_text(json.dumps({"step": 1000}) + "\n")
    done = subprocess.Popen(["true"])
    done.wait()
    runner.active[2] = Active(
        record=ended,
        proc=done,
        slot=Slot(2, None, (0,)),
        log=open(os.devnull, "w"),
        launched=now - 400,
        start_step=0,
        warm_at=now - 380,
        step=1000,
    )
    try:
        runner._poll()  # sees the exit
        assert ended["status"] == "done" and 2 not in runner.active
        assert runner._aggregate_rate() is None
        runner._shed()
        assert not any(a.stop_sent for a in runner.active.values())
        runner._ended_at = now - 25  # SETTLE seconds later: measured from the exit on
        assert runner._aggregate_rate() == pytest.approx(16.0, rel=0.02)
        runner._shed()
        time.sleep(0.2)
        assert [p.poll() for p in procs] == [None, None]
        assert not any(a.stop_sent for a in runner.active.values())
    finally:
        for p in procs:
            p.kill()
            p.wait()


# slow (kept out of make test's 20 minutes): in make test a study resumes in
# test_killed_study_resumes_and_skips_complete_runs, the runner's SIGTERM to its trainers is
# the shed tests' and a trainer saves on SIGTERM and stops in test_train_run.py
@pytest.mark.slow
def test_sigterm_stops_cleanly_and_resume_finishes(tmp_path):
    """SIGTERM to the runner: its trainer saves a checkpoint at the step it reached and exits,
    the runner records it as stopped (exit 3, no compare); --resume finishes it."""
    out = tmp_path / "study"
    steps = 400
    cmd = study_cmd(
        out,
        "--arms",
        "bf16",
        "--seeds",
        "1",
        "--no-compare",
        "--",
        *FAST,
        f"train.steps={steps}",
        "logging.print_interval=50",
    )
    runner = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    metrics = out / "runs" / "bf16-s1" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while len(lines(metrics)) < 5:
        assert runner.poll() is None and time.monotonic() < deadline, "no steps to stop at"
        time.sleep(0.05)
    runner.send_signal(signal.SIGTERM)
    log = runner.communicate(timeout=300)[0]
    assert runner.returncode == 3, log[-3000:]
    assert "stopping (SIGTERM)" in log
    assert status(out) == {"bf16-s1": "stopped"}
    stopped = int((out / "runs" / "bf16-s1" / "checkpoints" / "latest").read_text())
    assert 5 <= stopped < steps and len(lines(metrics)) == stopped

    done = subprocess.run(
        study_cmd(out, "--resume", "--no-compare"),
        cwd=ROOT,
        env=env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert status(out) == {"bf16-s1": "done"} and len(lines(metrics)) == steps


# slow: in make test the discard and launch.json are test_study_grid.py's
# test_restart_incomplete_moves_partial_runs_aside_and_launch_records_the_start
@pytest.mark.slow
def test_restart_incomplete_trains_a_stopped_run_again_in_one_process(tmp_path):
    """--restart-incomplete (the pre-registered study's rule: a run counts if one process
    trained all its steps): a run SIGTERMed mid-way with a checkpoint does not resume in the
    next invocation; it starts over from step 0, its partial files kept in discarded/, and
    its launch.json says from_step 0."""
    out = tmp_path / "study"
    steps = 400
    args = [
        "--arms",
        "bf16",
        "--seeds",
        "1",
        "--no-compare",
        "--restart-incomplete",
        "--",
        *FAST,
        f"train.steps={steps}",
        "logging.print_interval=50",
    ]
    runner = subprocess.Popen(
        study_cmd(out, *args),
        cwd=ROOT,
        env=env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    run = out / "runs" / "bf16-s1"
    deadline = time.monotonic() + 300
    while len(lines(run / "metrics.jsonl")) < 5:
        assert runner.poll() is None and time.monotonic() < deadline, "no steps to stop at"
        time.sleep(0.05)
    runner.send_signal(signal.SIGTERM)
    assert runner.wait(timeout=300) == 3
    stopped = int((run / "checkpoints" / "latest").read_text())
    assert 5 <= stopped < steps
    done = subprocess.run(
        study_cmd(out, *args),
        cwd=ROOT,
        env=env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "starts over from step 0" in done.stdout and "resuming at step" not in done.stdout
    assert json.loads((run / "launch.json").read_text()) == {
        "attempt": 2,
        "from_step": 0,
        "mps": False,  # a CPU run
    }
    assert len(lines(run / "metrics.jsonl")) == steps
    kept = out / "discarded" / "bf16-s1-attempt1"
    assert int((kept / "checkpoints" / "latest").read_text()) == stopped

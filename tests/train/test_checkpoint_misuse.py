"""A run dir under misuse, through the real trainer on CPU (tiny BF16 model, gloo, Megatron's
dist_checkpointing): a second job, Ctrl-C, planted and damaged files, a checkpoint.dir that
is not the run's own, NaN, a full or read-only disk.

    test_a_second_trainer_is_refused_and_ctrl_c_saves   while a run trains, the same command
        again, and another run dir given its checkpoint.dir: refused naming the holder's pid,
        nothing of the first cut; Ctrl-C then saves
        where it stands (with checkpoint.interval=0), exit 130, one line, no traceback
    test_zeroed_bytes_fall_back_and_a_second_ctrl_c_stops_at_once   the stopped run resumed
        to a later step; 4 KB zeroed inside that newest checkpoint (size unchanged): its
        checksum names it, the step before is resumed; two Ctrl-C: exit 130 at once, the
        newest complete checkpoint still intact
    test_ctrl_c_before_the_first_step_is_one_line   (while the model and data are built)
    test_a_planted_pickle_stops_the_start_before_it_runs   (slow)
    test_a_pickle_in_the_common_state_record_is_refused, test_zeroed_common_state_is_damage_...
    test_mechanism_refuses_a_planted_checkpoint
    test_a_name_that_leaves_runs_or_an_empty_run_dir_is_refused   experiment=../../x, hydra.run.dir=
    test_another_checkpoint_dir_cannot_cut_metrics_or_pass_the_refusals   checkpoint.dir=
        elsewhere (resume, resume=false), a ufp4 run pointed at its BF16 sibling's dir
    test_nan_stops_and_keeps_the_last_finite_checkpoint   optim.lr=1e30 diverges at step 2
    test_full_disk_says_so_and_keeps_the_last_checkpoint  (slow) a 12 MB tmpfs as checkpoint.dir
    test_read_only_checkpoint_dir_is_refused_at_start      a read-only tmpfs as checkpoint.dir
The last two mount a tmpfs in a user namespace (`unshare -Urm`); skipped where that is
not allowed.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time

import pytest
from _cli import ROOT, env, own_stderr, run, train_cmd

from ufp4_megatron.train import checkpoint

BASE = ["checkpoint.keep=2", "logging.wandb.mode=disabled"]
COMMON = ["precision=bf16", *BASE]
LONG = "train.steps=20000"  # stopped by Ctrl-C long before


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


def _start(cmd, tmp, name: str) -> tuple[subprocess.Popen, object]:
    err = (tmp / f"{name}.err").open("w")
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env(tmp),
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
        # Ctrl-C's disposition of a job a shell starts in the foreground; a pytest-xdist
        # worker ignores SIGINT, and a child would inherit that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    return proc, err


def _wait_for_step(proc, step: int) -> list[str]:
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("step") and int(line.split()[1]) >= step:
            return lines
    raise AssertionError("".join(lines))


def _run_both(cmds, tmp) -> list[subprocess.CompletedProcess]:
    procs = [
        subprocess.Popen(
            c, cwd=ROOT, env=env(tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for c in cmds
    ]
    done = []
    for c, p in zip(cmds, procs):
        out, err = p.communicate(timeout=240)
        done.append(subprocess.CompletedProcess(c, p.returncode, out, err))
    return done


@pytest.fixture(scope="module")
def stopped(tmp_path_factory, cache):
    """A run stopped by Ctrl-C after a second start on its dir was refused."""
    tmp = tmp_path_factory.mktemp("stopped")
    run_dir = tmp / "run"
    cmd = train_cmd(run_dir, cache, *COMMON)
    proc, err = _start([*cmd, LONG], tmp, "first")
    try:
        out = _wait_for_step(proc, 3)
        lines_then = len((run_dir / "metrics.jsonl").read_text().splitlines())
        second, other = _run_both(
            [
                [*cmd, LONG],
                train_cmd(
                    tmp / "other", cache, *COMMON, LONG, f"checkpoint.dir={run_dir / 'checkpoints'}"
                ),
            ],
            tmp,
        )
        lines_after = len((run_dir / "metrics.jsonl").read_text().splitlines())
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
        err.close()
    return {
        "run_dir": run_dir,
        "rc": proc.returncode,
        "pid": proc.pid,
        "second": second,
        "other": other,
        "out": "".join(out) + rest,
        "err": (tmp / "first.err").read_text(),
        "cut": lines_after < lines_then,
        "cmd": cmd,
        "cache": cache,
    }


def test_a_second_trainer_is_refused_and_ctrl_c_saves(stopped):
    second = stopped["second"]
    assert second.returncode == 2 and "Traceback" not in second.stderr
    (line,) = [x for x in second.stderr.splitlines() if x.startswith("error:")]
    assert f"is in use by another trainer (pid {stopped['pid']} on host" in line
    other = stopped["other"]  # another run dir given the first's checkpoint.dir
    assert other.returncode == 2 and "the checkpoint dir" in other.stderr
    assert f"is in use by another trainer (pid {stopped['pid']}" in other.stderr
    assert not stopped["cut"]  # the first run's metrics.jsonl was not touched
    assert stopped["rc"] == 130 and "Traceback" not in stopped["err"], stopped["err"][-3000:]
    assert "Ctrl-C: saving a checkpoint after this step" in stopped["err"]
    ckpt = stopped["run_dir"] / "checkpoints"
    step = checkpoint.latest_step(ckpt)
    assert (
        f"stop signal (SIGINT after step {step - 1}): saved step {step}" in stopped["out"]
        or f"stop signal (SIGINT after step {step}): saved step {step}" in stopped["out"]
    )
    assert checkpoint.steps_on_disk(ckpt) == [step]  # checkpoint.interval=0: only Ctrl-C's
    rows = [
        json.loads(x) for x in (stopped["run_dir"] / "metrics.jsonl").read_text().split("\n") if x
    ]
    assert rows[-1]["step"] == step
    assert not (stopped["run_dir"] / "trainer.lock").exists()  # released at the end


def _with_run_dir(cmd: list[str], run_dir) -> list[str]:
    return [f"hydra.run.dir={run_dir}" if a.startswith("hydra.run.dir=") else a for a in cmd]


def test_zeroed_bytes_fall_back_and_a_second_ctrl_c_stops_at_once(stopped, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(stopped["run_dir"], run_dir)
    ckpt = run_dir / "checkpoints"
    older = checkpoint.latest_step(ckpt)
    cmd = _with_run_dir(stopped["cmd"], run_dir)
    # links planted at the names a save and a resume write through: never followed
    victim_dir, victim = tmp_path / "victim_dir", tmp_path / "victim"
    victim_dir.mkdir()
    (victim_dir / "precious").write_text("keep me")
    victim.write_text("keep me")
    (ckpt / f"step_{older + 2:08d}.saving").symlink_to(victim_dir)
    (ckpt / "latest.tmp").symlink_to(victim)
    (run_dir / "metrics.jsonl.tmp").symlink_to(victim)
    r = run([*cmd, f"train.steps={older + 2}"], tmp_path)  # resumes, saves at its end
    assert r.returncode == 0, r.stderr[-3000:]
    assert (victim_dir / "precious").read_text() == "keep me" and victim.read_text() == "keep me"
    newest = checkpoint.latest_step(ckpt)
    assert checkpoint.steps_on_disk(ckpt) == [older, newest] and newest == older + 2
    assert checkpoint.damage(checkpoint.step_dir(ckpt, newest)) is None
    shard = next(checkpoint.step_dir(ckpt, newest).glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 4096] = bytes(4096)  # size unchanged
    shard.write_bytes(bytes(data))
    proc, err = _start([*cmd, LONG], tmp_path, "again")
    try:
        _wait_for_step(proc, older + 1)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        proc.kill()
        err.close()
    text = (tmp_path / "again.err").read_text()
    assert f"{shard.name} does not match its sha256 in integrity.json" in text
    assert f"Resuming from {checkpoint.step_dir(ckpt, older)} instead" in text
    assert proc.returncode == 130 and "Traceback" not in text, text[-3000:]
    assert "second Ctrl-C: stopped at once, without saving" in text and took < 20
    found = checkpoint.find(ckpt)  # whatever the abort left: a complete checkpoint to resume
    assert found.step is not None and found.step >= older


def test_ctrl_c_before_the_first_step_is_one_line(tmp_path, cache):
    proc, err = _start(train_cmd(tmp_path / "run", cache, *COMMON, LONG), tmp_path, "early")
    for line in proc.stdout:  # checked and recorded; Megatron, the model and data still to come
        if line.startswith("starting"):
            break
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    err.close()
    text = (tmp_path / "early.err").read_text()
    assert proc.returncode == 130 and "Traceback" not in text and "KeyboardInterrupt" not in text
    assert "interrupted (Ctrl-C) before the first step" in text


@pytest.mark.slow  # the trainer's path; test_checkpoint_trust.py has the same refusal in process
def test_a_planted_pickle_stops_the_start_before_it_runs(stopped, tmp_path, cache):
    run_dir = tmp_path / "run"
    shutil.copytree(stopped["run_dir"], run_dir)
    marker = tmp_path / "PWNED"
    newest = checkpoint.step_dir(
        run_dir / "checkpoints", checkpoint.steps_on_disk(run_dir / "checkpoints")[-1]
    )
    (newest / ".metadata").write_bytes(
        b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."
    )  # os.system("touch ...")
    before = (run_dir / "metrics.jsonl").read_text()
    r = run([*_with_run_dir(stopped["cmd"], run_dir), LONG], tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"error: {newest} holds a pickle that names os.system" in r.stderr
    assert not marker.exists() and (run_dir / "metrics.jsonl").read_text() == before


def _common_state_record(step_dir):
    from torch.distributed.checkpoint import FileSystemReader

    meta = FileSystemReader(str(step_dir)).read_metadata()
    (info,) = [i for k, i in meta.storage_data.items() if k.fqn.startswith("common_state")]
    return step_dir / info.relative_path, info.offset, info.length


def _overwrite(path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_a_pickle_in_the_common_state_record_is_refused(stopped, tmp_path):
    ckpt = tmp_path / "checkpoints"
    shutil.copytree(stopped["run_dir"] / "checkpoints", ckpt)
    step_dir = checkpoint.step_dir(ckpt, checkpoint.latest_step(ckpt))
    shard, offset, length = _common_state_record(step_dir)
    marker = tmp_path / "PWNED"
    evil = b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."
    _overwrite(shard, offset, evil + bytes(length - len(evil)))
    with pytest.raises(checkpoint.Tampered, match="names os.system"):
        checkpoint.find(ckpt)
    assert not marker.exists()


def test_zeroed_common_state_is_damage_not_a_crash(stopped, tmp_path):
    """torch DCP raises its CheckpointException, a BaseException, for an unreadable record."""
    ckpt = tmp_path / "checkpoints"
    shutil.copytree(stopped["run_dir"] / "checkpoints", ckpt)
    step_dir = checkpoint.step_dir(ckpt, checkpoint.latest_step(ckpt))
    shard, offset, length = _common_state_record(step_dir)
    _overwrite(shard, offset, bytes(length))
    assert checkpoint.damage(step_dir).startswith("unreadable (CheckpointException")
    assert checkpoint.find(ckpt).step is None  # the only step: nothing intact left


def test_mechanism_refuses_a_planted_checkpoint(stopped, tmp_path):
    from ufp4_megatron.report.mechanism import run as mechanism

    run_dir = tmp_path / "run"
    shutil.copytree(stopped["run_dir"], run_dir)
    newest = checkpoint.step_dir(
        run_dir / "checkpoints", checkpoint.latest_step(run_dir / "checkpoints")
    )
    marker = tmp_path / "PWNED"
    (newest / ".metadata").write_bytes(b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR.")
    with pytest.raises(SystemExit, match="mechanism: .* holds a pickle that names os.system"):
        mechanism([str(run_dir), "--out", str(tmp_path / "out")])
    assert not marker.exists()


@pytest.mark.parametrize("override", ["experiment=../../escaped", "hydra.run.dir="])
def test_a_name_that_leaves_runs_or_an_empty_run_dir_is_refused(tmp_path, override):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    cmd = [
        a
        for a in train_cmd(tmp_path / "unused", tmp_path / "c", *COMMON)
        if not a.startswith("hydra.run.dir=")
    ]
    r = run([*cmd, override], tmp_path, cwd=work)
    lines = own_stderr(r.stderr)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert [p.name for p in tmp_path.iterdir()] == ["a"]  # nothing made outside, or in cwd
    assert list(work.iterdir()) == []


def test_another_checkpoint_dir_cannot_cut_metrics_or_pass_the_refusals(stopped, tmp_path):
    """The start's decision (train/rundir/resume_check.py plan_start, what the trainer runs
    before it writes anything), in process: each refusal is the trainer's `error:` line."""
    from ufp4_megatron.train.footprint import load_config
    from ufp4_megatron.train.rundir.resume_check import plan_start
    from ufp4_megatron.train.validate import ConfigError

    mine = tmp_path / "runs" / "mine"
    shutil.copytree(stopped["run_dir"], mine)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(mine / "checkpoints", elsewhere)  # an older copy of its checkpoints
    overrides = [a for a in stopped["cmd"][3:] if not a.startswith(("hydra.", "logging.prog"))]
    before = (mine / "metrics.jsonl").read_text()
    for extra in (
        [f"checkpoint.dir={elsewhere}"],
        [f"checkpoint.dir={tmp_path / 'empty'}", "checkpoint.resume=false"],
    ):
        with pytest.raises(
            ConfigError, match=f"{mine} keeps its checkpoints in {mine / 'checkpoints'}"
        ):
            plan_start(load_config([*overrides, LONG, *extra]), mine)
    assert (mine / "metrics.jsonl").read_text() == before
    assert plan_start(load_config([*overrides, LONG]), mine).step == checkpoint.latest_step(
        mine / "checkpoints"
    )  # its own dir still resumes
    # a UFP4 run pointed at its BF16 sibling's checkpoint dir: the checkpoint names its run
    ufp4 = [o for o in overrides if o != "precision=bf16"] + ["precision=ufp4"]
    with pytest.raises(ConfigError) as e:
        plan_start(
            load_config([*ufp4, LONG, f"checkpoint.dir={mine / 'checkpoints'}"]), tmp_path / "ufp4"
        )
    msg = str(e.value)
    assert "holds the checkpoints of another run" in msg and str(mine) in msg
    assert "precision.name" in msg and str(tmp_path / "ufp4") in msg


def test_nan_stops_and_keeps_the_last_finite_checkpoint(tmp_path, cache):
    run_dir = tmp_path / "run"
    r = run(
        train_cmd(
            run_dir,
            cache,
            "precision=bf16",
            # far past any rounding's reach: step 1's update (lr/2 in warm-up) overflows
            # the weights, so step 2 is non-finite on every machine (a moderate lr=30
            # diverges on some CPUs and not on others)
            "optim.lr=1e30",
            "train.steps=12",
            "checkpoint.interval=1",
            "checkpoint.keep=1",
            "logging.wandb.mode=disabled",
        ),
        tmp_path,
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    bad = int(line.split()[2].rstrip(":"))  # "error: step K: grad_norm is nan; ..."
    assert bad >= 2 and ("is nan" in line or "is inf" in line)
    ckpt = run_dir / "checkpoints"
    assert checkpoint.steps_on_disk(ckpt) == [bad - 1]  # the last finite one, not pushed out
    assert f"{checkpoint.step_dir(ckpt, bad - 1)}, is kept as it was" in line
    assert [
        json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().split("\n") if x
    ][-1] == bad - 1


def _in_namespace(mount: str, cmd: list[str], tmp) -> subprocess.CompletedProcess:
    """cmd in a user + mount namespace where `mount` (a path) is mounted first."""
    import shlex

    script = f"{mount} && exec {shlex.join(cmd)}"
    return run(["unshare", "-Urm", "sh", "-c", script], tmp, timeout=300)


@pytest.fixture(scope="module")
def namespaces():
    try:
        ok = (
            subprocess.run(
                ["unshare", "-Urm", "sh", "-c", "mount -t tmpfs tmpfs /mnt"],
                capture_output=True,
                timeout=30,
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        pytest.skip("no user namespaces here to mount a small or read-only tmpfs in")


@pytest.mark.slow  # a second trainer run with saves (make test's budget); the read-only case
def test_full_disk_says_so_and_keeps_the_last_checkpoint(tmp_path, cache, namespaces):
    small = tmp_path / "small"  # holds one tiny checkpoint (7.6 MB), not two
    small.mkdir()
    r = _in_namespace(
        f"mount -t tmpfs -o size=12m tmpfs {small}",
        train_cmd(
            tmp_path / "run",
            cache,
            *COMMON,
            "checkpoint.keep=0",
            "checkpoint.interval=2",
            "train.steps=8",
            f"checkpoint.dir={small}",
        ),
        tmp_path,
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert f"error: saving step 4 to {small} failed: No space left on device" in r.stderr
    assert f"the newest complete checkpoint, {small}/step_00000002, is kept" in r.stderr


def test_read_only_checkpoint_dir_is_refused_at_start(tmp_path, cache, namespaces):
    ro = tmp_path / "ro"
    ro.mkdir()
    r = _in_namespace(
        f"mount -t tmpfs -o ro tmpfs {ro}",
        train_cmd(tmp_path / "run", cache, *COMMON, "train.steps=2", f"checkpoint.dir={ro}"),
        tmp_path,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"error: cannot write to the checkpoint dir {ro} (Read-only file system" in r.stderr
    assert not (tmp_path / "run").exists()  # refused before anything was written

"""launch/slurm.sbatch on a real one-node Slurm 22.05 cluster (launch/ci/slurm_up.sh).

- test_sbatch_starts_torchrun_with_overrides_verbatim: sbatch -> srun (one task per node) ->
  torchrun.sh with rendezvous on the first node -> 2 ranks, each with the overrides byte for
  byte; the job writes its log where --output says.
- test_sbatch_usr1_requeues_the_job: the time-limit warning (USR1 to the batch shell) requeues
  the job, which runs again with SLURM_RESTART_COUNT=1.
"""

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import LAUNCH, ROOT, run_env

pytestmark = pytest.mark.slurm


def sbatch(env, *args) -> str:
    res = subprocess.run(
        ["sbatch", "--parsable", *args], env=env, capture_output=True, text=True, timeout=180
    )
    if res.returncode != 0:  # with --wait: the job failed; its own log says why
        job = res.stdout.strip().split(";")[0]
        out = next((a.split("=", 1)[1] for a in args if a.startswith("--output=")), None)
        log = Path(out.replace("%j", job)) if out and job else None
        text = log.read_text()[-3000:] if log and log.is_file() else "(no job log)"
        raise AssertionError(f"sbatch {args[:3]}: rc {res.returncode}\n{res.stderr}\n{text}")
    return res.stdout.strip().split(";")[0]


def job_state(env, job) -> str:
    res = subprocess.run(
        ["scontrol", "-o", "show", "job", job], env=env, capture_output=True, text=True, timeout=30
    )
    fields = dict(kv.split("=", 1) for kv in res.stdout.split() if "=" in kv)
    return fields.get("JobState", "UNKNOWN")


def wait_for(predicate, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_sbatch_starts_torchrun_with_overrides_verbatim(slurm, tmp_path):
    env = run_env(
        tmp_path,
        **slurm,
        PROBE_OUT=str(tmp_path / "probe"),
        PYTHONPATH=str(ROOT / "tests" / "launch"),
        UFP4_ROOT=str(ROOT),
    )
    overrides = ["model=tiny", "x=$(touch pwned)", "y=a b;c", "z='q'"]
    log = tmp_path / "job-%j.out"
    job = sbatch(
        env,
        "--wait",
        f"--output={log}",
        "--chdir",
        str(tmp_path),
        str(LAUNCH / "slurm.sbatch"),
        "--nproc-per-node",
        "2",
        "--module",
        "argv_probe",
        "--",
        *overrides,
    )
    text = (tmp_path / f"job-{job}.out").read_text()
    assert f"[ufp4] job {job} restart 0" in text
    ranks = sorted((tmp_path / "probe").glob("rank*.json"))
    assert [p.name for p in ranks] == ["rank0.json", "rank1.json"], text
    for p in ranks:
        rec = json.loads(p.read_text())
        assert rec["argv"] == overrides
        assert rec["env"]["WORLD_SIZE"] == "2" and rec["env"]["SLURM_JOB_ID"] == job
        assert rec["env"]["NCCL_NVLS_ENABLE"] == "0"
    assert not (tmp_path / "pwned").exists()


def test_sbatch_usr1_requeues_the_job(slurm, tmp_path):
    # The probe runs until Slurm stops it. The trainer's requeue (checkpoint, resume) is tested
    # in test_launch_compare.py; this test isolates the batch script's signal -> requeue path.
    probe = tmp_path / "probe"
    env = run_env(
        tmp_path,
        **slurm,
        UFP4_ROOT=str(ROOT),
        PROBE_OUT=str(probe),
        PROBE_SLEEP="600",
        PYTHONPATH=str(ROOT / "tests" / "launch"),
    )
    log = tmp_path / "job.out"
    job = sbatch(
        env,
        f"--output={log}",
        "--chdir",
        str(tmp_path),
        str(LAUNCH / "slurm.sbatch"),
        "--nproc-per-node",
        "1",
        "--module",
        "argv_probe",
    )
    wait_for(lambda: (probe / "rank0.restart0").exists(), 60, "the job's first run")
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], env=env, check=True, timeout=30)
    wait_for(lambda: "USR1: requeue" in log.read_text(), 30, "the trap to requeue")
    wait_for(lambda: job_state(env, job) == "PENDING", 60, "the job to be requeued")
    # Slurm holds a requeued job for ~2 minutes (BeginTime); release it now.
    subprocess.run(
        ["scontrol", "update", f"JobId={job}", "StartTime=now"], env=env, check=True, timeout=30
    )
    wait_for(lambda: (probe / "rank0.restart1").exists(), 60, "the requeued run")
    subprocess.run(["scancel", job], env=env, timeout=30)
    assert "restart 1" in log.read_text()  # --open-mode=append: one log across restarts


def test_slurm_up_moves_off_ports_in_use(slurm, tmp_path):
    """A second cluster on the node comes up on the next free pair of ports instead of failing
    to bind the cluster of the pytest session (as it would beside a system Slurm or a killed run's
    daemons), and says which it took."""
    import os
    import re

    def ports(conf: str) -> tuple[int, int]:
        text = open(conf).read()
        return tuple(
            int(re.search(rf"^{k}=(\d+)$", text, re.M).group(1))
            for k in ("SlurmctldPort", "SlurmdPort")
        )

    taken = ports(slurm["SLURM_CONF"])
    state = tmp_path / "second"
    state.mkdir(mode=0o755)
    env = {**os.environ, "UFP4_SLURM_DIR": str(state)}
    try:
        res = subprocess.run(
            [str(LAUNCH / "ci" / "slurm_up.sh")],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert res.returncode == 0, res.stderr[-2000:]
        got = ports(str(state / "slurm.conf"))
        assert got[1] == got[0] + 1 and not set(got) & set(taken), (got, taken)
        assert f"in use; this cluster uses {got[0]}/{got[1]}" in res.stderr
        info = subprocess.run(
            ["sinfo", "-h", "-o", "%T"],
            capture_output=True,
            text=True,
            env={**env, "SLURM_CONF": str(state / "slurm.conf")},
            timeout=30,
        )
        assert info.stdout.split() == ["idle"]
    finally:
        subprocess.run([str(LAUNCH / "ci" / "slurm_down.sh")], env=env, timeout=60)

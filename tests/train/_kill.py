"""Runs a trainer that is meant to die by SIGKILL, and checks that nothing of it lives on.

Megatron's checkpoint writer starts a multiprocessing Manager process (spawned, so neither
torchrun's nor our process group reaches it); the trainer starts a watchdog that kills it
when the trainer dies (train/lifetime.py). Every process of a run carries a tag in its
environment; after the run, `survivors` lists the tagged processes still alive after a
grace period (each is then killed by pid, so one failing test does not leak into the next).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

TAG = "UFP4_TEST_RUN_TAG"


def run_to_death(
    cmd: list[str], cwd: Path, env: dict, log_dir: Path, timeout: int = 300, grace: float = 10.0
) -> subprocess.CompletedProcess:
    """Like subprocess.run(capture_output=True), through files; the result's `survivors`
    holds (pid, command line) of the run's processes still alive `grace` s after it ended."""
    tag = uuid.uuid4().hex
    out, err = log_dir / f"{tag}.out", log_dir / f"{tag}.err"
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env | {TAG: tag}, stdout=o, stderr=e)
        try:
            rc = proc.wait(timeout=timeout)
        finally:
            deadline = time.monotonic() + grace
            while tagged(tag) and time.monotonic() < deadline:
                time.sleep(0.2)
            survivors = [(pid, _cmdline(pid)) for pid in tagged(tag)]
            kill_tagged(tag)
    r = subprocess.CompletedProcess(cmd, rc, out.read_text(), err.read_text())
    r.survivors = survivors
    return r


def tagged(tag: str) -> list[int]:
    """Live processes (not zombies) whose environment carries the tag."""
    mark = f"{TAG}={tag}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if mark in environ and state != "Z":
            found.append(int(pid))
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return "?"


def kill_tagged(tag: str) -> list[int]:
    killed = []
    for pid in tagged(tag):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    return killed

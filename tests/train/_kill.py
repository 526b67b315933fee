"""Runs a trainer that is meant to die by SIGKILL, and removes what it leaves behind.

Megatron's checkpoint writer starts a multiprocessing Manager process (spawned, so neither
torchrun's nor our process group reaches it) that outlives a SIGKILLed trainer and keeps its
stdout/stderr open. Every process of a run carries a tag in its environment; after the run,
the tagged survivors are killed by pid.
"""
from __future__ import annotations

import os
import signal
import subprocess
import uuid
from pathlib import Path

TAG = "UFP4_TEST_RUN_TAG"


def run_to_death(cmd: list[str], cwd: Path, env: dict, log_dir: Path,
                 timeout: int = 300) -> subprocess.CompletedProcess:
    """Like subprocess.run(capture_output=True), through files, then kills the run's
    leftover processes."""
    tag = uuid.uuid4().hex
    out, err = log_dir / f"{tag}.out", log_dir / f"{tag}.err"
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env | {TAG: tag}, stdout=o, stderr=e)
        try:
            rc = proc.wait(timeout=timeout)
        finally:
            kill_tagged(tag)
    return subprocess.CompletedProcess(cmd, rc, out.read_text(), err.read_text())


def kill_tagged(tag: str) -> list[int]:
    mark = f"{TAG}={tag}".encode()
    killed = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if mark in environ:
            try:
                os.kill(int(pid), signal.SIGKILL)
                killed.append(int(pid))
            except ProcessLookupError:
                pass
    return killed

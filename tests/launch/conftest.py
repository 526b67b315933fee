"""Fixtures for the launcher tests: the repo paths, a clean environment for subprocesses, and a
real one-node Slurm cluster (launch/ci/slurm_up.sh) for the pytest session, stopped at its end."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "launch"


def run_env(tmp_path: Path, **extra: str) -> dict:
    """The environment launched processes get: this Python, offline W&B in tmp, no stray
    torchrun/Slurm variables from the caller."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "TORCHELASTIC_", "RDZV_"))
        and k
        not in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
            "NNODES",
            "NPROC_PER_NODE",
        )
    }
    wandb = tmp_path / "wandb"
    env.update(
        PYTHON=sys.executable,
        PATH=f"{Path(sys.executable).parent}:{env['PATH']}",
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_DIR=str(wandb),
        WANDB_CACHE_DIR=str(wandb),
        WANDB_CONFIG_DIR=str(wandb),
        OMP_NUM_THREADS="1",
    )
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def apt_tools():
    """shellcheck, Slurm and munge, installed with apt-get when missing (root only)."""
    res = subprocess.run([str(LAUNCH / "ci" / "apt_deps.sh")], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.fail(f"launch/ci/apt_deps.sh failed:\n{res.stderr[-3000:]}")


@pytest.fixture(scope="session")
def slurm(apt_tools):
    """A real one-node Slurm cluster; yields the environment with SLURM_CONF set."""
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root (CI runs as root)")
    state = Path(tempfile.mkdtemp(prefix="ufp4-slurm-"))
    state.chmod(0o755)  # munged runs as user munge and writes its pid file in here
    env = {**os.environ, "UFP4_SLURM_DIR": str(state)}
    res = subprocess.run(
        [str(LAUNCH / "ci" / "slurm_up.sh")], env=env, capture_output=True, text=True, timeout=300
    )
    if res.returncode != 0:
        logs = "".join(p.read_text()[-2000:] for p in (state / "log").glob("*.log"))
        pytest.fail(f"slurm_up.sh failed:\n{res.stderr[-3000:]}\n{logs}")
    conf = str(state / "slurm.conf")
    try:
        yield {"SLURM_CONF": conf, "UFP4_SLURM_DIR": str(state)}
    finally:
        subprocess.run([str(LAUNCH / "ci" / "slurm_down.sh")], env=env, timeout=60)
        shutil.rmtree(state, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)  # before -m selects: make test runs these on their own
def pytest_collection_modifyitems(config, items):
    # A test on the Slurm cluster is marked `slurm` even where its author forgot: make test
    # runs them in a second, serial pytest (one cluster per pytest session, and under
    # pytest-xdist every worker runs its own pytest session; a job beside a second worker's
    # trainers can fail for want of CPU), the rest on two workers.
    for item in items:
        if "slurm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slurm)


def which_or_fail(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not on PATH")
    return path

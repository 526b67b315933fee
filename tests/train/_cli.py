"""Runs the real CLIs in subprocesses (the trainer owns process-global Megatron state)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# small, fast, deterministic: 2-layer model, 64 tokens per step, a 1.5 MB corpus
FAST = [
    "model=tiny",
    "train.seq_len=32",
    "train.micro_batch=2",
    "train.global_batch=2",
    "optim.warmup_steps=2",
    "logging.progress=plain",
    "logging.print_interval=1",
    "data.corpus_max_bytes=1500000",
]


def without_package(tmp: Path, name: str) -> dict:
    """Environment entries that make `import name` fail in a subprocess: a package of that
    name that raises ModuleNotFoundError, first on PYTHONPATH. It stands for a machine without
    a package the test extra installs."""
    stub = tmp / f"no_{name}" / name
    stub.mkdir(parents=True, exist_ok=True)
    (stub / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{name}'\")\n")
    path = os.pathsep.join(p for p in (str(stub.parent), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path}


def env(tmp: Path) -> dict:
    e = dict(
        os.environ,
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_DIR=str(tmp / "wb"),
        WANDB_CACHE_DIR=str(tmp / "wbc"),
        WANDB_CONFIG_DIR=str(tmp / "wbcfg"),
        OMP_NUM_THREADS="1",
        PYTHONWARNINGS="ignore",
    )
    e.pop("WANDB_API_KEY", None)
    return e


def train_cmd(run_dir: Path, cache: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "ufp4_megatron.train",
        *FAST,
        f"hydra.run.dir={run_dir}",
        f"data.cache_dir={cache}",
        *overrides,
    ]


def run(
    cmd: list[str], tmp: Path, timeout: int = 240, env_extra: dict | None = None, cwd: Path = ROOT
) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd,
        cwd=cwd,
        env=dict(env(tmp), **(env_extra or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# a record of PyTorch's C++ logging (glog's prefix), e.g. cpp_extension's "No CUDA runtime is
# found" where CUDA_HOME exists but the process sees no GPU (these tests hide it)
_TORCH_LOG = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ")


def own_stderr(text: str) -> list[str]:
    """A CLI's stderr lines without PyTorch's log records: what the CLI itself printed."""
    return [line for line in text.strip().splitlines() if not _TORCH_LOG.match(line)]


def losses(run_dir: Path) -> list[float]:
    """The loss column of a run dir's metrics.jsonl."""
    rows = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in rows]

"""Shared by the study tests: a tiny fast training config, a clean environment for the runner
subprocess, and what /proc says about the trainers it started."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# 2 layers, 64 tokens per step, a 1.5 MB corpus: a trainer starts in seconds on one core
FAST = [
    "model=tiny",
    "train.seq_len=32",
    "train.micro_batch=2",
    "train.global_batch=2",
    "optim.warmup_steps=2",
    "data.corpus_max_bytes=1500000",
    "logging.print_interval=1",
]


def env(tmp: Path) -> dict:
    e = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    e.update(
        WANDB_MODE="disabled",
        WANDB_SILENT="true",
        WANDB_DIR=str(tmp / "wb"),
        OMP_NUM_THREADS="1",
        PYTHONWARNINGS="ignore",
        CUDA_VISIBLE_DEVICES="",
    )
    e.pop("WANDB_API_KEY", None)
    return e


def study_cmd(out: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "ufp4_megatron.study",
        "--out",
        str(out),
        "--gpus",
        "none",
        "--progress",
        "plain",
        "--wandb-mode",
        "disabled",
        *args,
    ]


def children(pid: int) -> list[int]:
    """Live direct children of pid (from /proc/<pid>/stat's ppid field)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(d.name))
    return out


def cpu_list(text: str) -> set[int]:
    """/proc's Cpus_allowed_list ('0-2,5') as a set."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def proc_view(pid: int) -> dict | None:
    """The CPU affinity, OMP_NUM_THREADS and command line of a live process."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    cpus = next(
        line.split(":", 1)[1].strip()
        for line in status.splitlines()
        if line.startswith("Cpus_allowed_list")
    )
    omp = next(
        (v.split(b"=", 1)[1].decode() for v in environ if v.startswith(b"OMP_NUM_THREADS=")), None
    )
    return {"cpus": cpus, "omp": omp, "cmd": [c.decode() for c in cmdline if c]}

"""Packing runs onto one machine: slots of (GPU, CPU share), one trainer process per run.

A ~11M-parameter model cannot fill an H200; several trainer processes on one GPU can (9 at
once gave ~1.8x the aggregate steps/s of running them one after another). Each process is
pinned to its own share of the CPUs (os.sched_setaffinity) and runs one OpenMP thread by
default: 12 processes with default thread counts on 16 cores ran 100x slower (threads
oversubscribing the cores), and on two busy cores a tiny-model ufp4 run with 2 threads took
139 s where the same run with 1 thread took 11-14 s. Slots alternate over the
GPUs (CUDA_VISIBLE_DEVICES round-robin), so the first runs spread over every GPU. The runs on
one GPU take turns on it (a context each), unless they share it through MPS (mps.py).

A trainer dies with its runner: PR_SET_PDEATHSIG delivers SIGTERM, on which the trainer saves
a checkpoint and exits, so a runner killed with SIGKILL leaves no orphan training into a run
dir that the next runner is about to resume.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from dataclasses import dataclass

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
# torchrun's variables would make a trainer think it is one rank of a larger job
_TORCHRUN_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)


@dataclass(frozen=True)
class Slot:
    index: int
    gpu: str | None  # the CUDA_VISIBLE_DEVICES of its runs; None: a CPU slot
    cpus: tuple[int, ...]  # its CPU share


def available_cpus() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def visible_gpus(spec: str) -> list[str]:
    """'auto': the GPUs this process sees; 'none': CPU only; '0,1': those device ids."""
    if spec == "none":
        return []
    if spec != "auto":
        gpus = [g.strip() for g in spec.split(",") if g.strip()]
        if not gpus:
            raise SystemExit(f"ufp4-launch study: --gpus {spec!r}: give auto, none or ids 0,1,...")
        return gpus
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def make_slots(per_device: int, gpus: list[str], cpus: list[int]) -> list[Slot]:
    """per_device runs on each GPU (or, without GPUs, in total), each with its own CPUs.

    With more slots than CPUs, slots share CPUs one each, round-robin (the caller warns)."""
    if per_device < 1:
        raise SystemExit(f"ufp4-launch study: --per-device {per_device} must be at least 1")
    n = per_device * max(1, len(gpus))
    if n <= len(cpus):
        base, extra = divmod(len(cpus), n)
        shares, start = [], 0
        for i in range(n):
            size = base + (i < extra)
            shares.append(tuple(cpus[start : start + size]))
            start += size
    else:
        shares = [(cpus[i % len(cpus)],) for i in range(n)]
    return [
        Slot(index=i, gpu=gpus[i % len(gpus)] if gpus else None, cpus=shares[i]) for i in range(n)
    ]


def child_env(base: dict, slot: Slot, threads: int, hide_gpus: bool) -> dict:
    env = {k: v for k, v in base.items() if k not in _TORCHRUN_VARS}
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    if slot.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = slot.gpu
    elif hide_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def spawn(argv: list[str], slot: Slot, env: dict, log, keep_fds: tuple[int, ...] = ()):
    """Starts one trainer pinned to the slot's CPUs, in its own process session (a Ctrl-C
    reaches the runner, which stops it cleanly); it gets SIGTERM if this process dies."""
    parent = os.getpid()

    def in_child() -> None:  # between fork and exec
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, slot.cpus)
        if _LIBC is not None:
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent:  # the runner died before prctl took effect
                os._exit(1)

    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        preexec_fn=in_child,
        pass_fds=keep_fds,
        start_new_session=True,
    )

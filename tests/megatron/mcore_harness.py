"""Launch a scenario of mcore_scenarios.py on N gloo ranks (subprocesses) and load rank 0's
results. One launch imports Megatron once per rank and runs many configurations, which keeps
the multi-process tests inside the suite's time budget."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
WORKER = HERE / "mcore_worker.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_scenario(
    name: str, out_dir: Path, *, world_size: int = 2, timeout: int = 900, **kwargs
) -> dict:
    port = _free_port()
    procs = []
    for rank in range(world_size):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
            PYTHONWARNINGS="ignore",
            # gloo ranks on the CPU through enable_cpu_compat(), a no-op where CUDA is
            # visible: on a GPU node too, the ranks run what they run on CI
            CUDA_VISIBLE_DEVICES="",
        )
        log = open(out_dir / f"{name}.rank{rank}.log", "w")
        procs.append(
            (
                subprocess.Popen(
                    [sys.executable, str(WORKER), name, str(out_dir), json.dumps(kwargs)],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=HERE,
                ),
                log,
            )
        )
    failed = []
    for rank, (proc, log) in enumerate(procs):
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "timeout"
        log.close()
        if rc != 0:
            failed.append(rank)
    if failed:
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
        tail = (out_dir / f"{name}.rank{failed[0]}.log").read_text()[-6000:]
        raise RuntimeError(f"scenario {name!r} failed on ranks {failed}:\n{tail}")
    return torch.load(out_dir / f"{name}.pt", weights_only=False)

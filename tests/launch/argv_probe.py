"""A worker for launcher tests: records what it received (argv, rank env) and exits.

Run by torchrun as `-m argv_probe` (PYTHONPATH=tests/launch); writes
$PROBE_OUT/rank<RANK>.json (and rank<RANK>.restart<SLURM_RESTART_COUNT>), then
sleeps $PROBE_SLEEP seconds (a workload that runs until Slurm stops it). It stands in for the trainer only where the launcher's contract is
the argv/environment boundary; the end-to-end tests run the real trainer.
"""

import json
import os
import sys
import time
from pathlib import Path

keys = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "NCCL_NVLS_ENABLE",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    "NVSHMEM_DISABLE_NVLS",
    "SLURM_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
)
out = Path(os.environ["PROBE_OUT"])
out.mkdir(parents=True, exist_ok=True)
record = {"argv": sys.argv[1:], "env": {k: os.environ.get(k) for k in keys}}
restart = os.environ.get("SLURM_RESTART_COUNT", "0")
(out / f"rank{os.environ.get('RANK', 'x')}.json").write_text(json.dumps(record))
(out / f"rank{os.environ.get('RANK', 'x')}.restart{restart}").touch()
time.sleep(float(os.environ.get("PROBE_SLEEP", "0")))  # a workload that runs until stopped

"""A single-process run's process group: no port, no rendezvous, no wait (train/distributed.py).

With the loopback interface down, the trainer (and `make patch-check`'s Megatron-LM probes)
used to retry a TCP store connection on 127.0.0.1 for torch's 30-minute default timeout.

    test_single_process_group_needs_no_rendezvous   an in-process store (no TCP store, no
                                              port of its own): collectives and subgroups work
    test_trainer_without_a_network_fails_at_once   in a network namespace whose only interface
                                              (lo) is down: exit 2, one line naming the fix
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from _cli import env as cli_env
from _cli import train_cmd

GROUP = """
import torch, torch.distributed as dist
from ufp4_megatron.train.distributed import single_process_group
single_process_group("gloo")
t = torch.ones(3)
dist.all_reduce(t)
g = dist.new_group([0])
dist.all_reduce(t, group=g)
dist.barrier()
store = dist.distributed_c10d._get_default_store()
print("ok", t.tolist(), type(getattr(store, "underlying_store", store)).__name__)
dist.destroy_process_group()
"""


def test_single_process_group_needs_no_rendezvous(tmp_path):
    r = subprocess.run(
        [sys.executable, "-c", GROUP],
        capture_output=True,
        text=True,
        env=cli_env(tmp_path),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["ok", "[1.0,", "1.0,", "1.0]", "HashStore"], r.stdout


def _no_network_namespace() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(
    not _no_network_namespace(), reason="needs `unshare -rn` (a user and network namespace)"
)
def test_trainer_without_a_network_fails_at_once(tmp_path):
    cmd = [
        "unshare",
        "-rn",
        *train_cmd(
            tmp_path / "run", tmp_path / "cache", "train.steps=2", "logging.wandb.mode=disabled"
        ),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, env=cli_env(tmp_path), timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert errors == r.stderr.strip().splitlines()[-1:], r.stderr
    assert errors[0].startswith(
        "error: torch.distributed could not set up its process group on this machine ("
    )
    assert "bring the loopback interface up (`ip link set lo up`)" in errors[0]
    assert not (tmp_path / "run").exists()  # the fresh start's record is removed again

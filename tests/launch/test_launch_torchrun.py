"""launch/torchrun.sh on CPU: the argv boundary and the environment it sets.

- test_torchrun_two_ranks_get_overrides_verbatim: 2 processes; every rank's argv equals the
  overrides byte for byte, shell metacharacters included, and none of them is executed.
- test_torchrun_nvls_defaults_off_but_settable: NVLink multicast off by default, caller wins.
- test_torchrun_multinode_needs_endpoint: a clear error instead of a hanging rendezvous.
"""

import json
import subprocess

from conftest import LAUNCH, ROOT, run_env

TRICKY = [
    "model=tiny",
    "train.steps=3",
    "logging.tag=$(touch {pwned})",
    "x=`touch {pwned}`",
    "y=a b;touch {pwned}",
    "z='quoted' \"double\"",
    "w=$HOME",
    "--not-a-flag",
    "*",
]


def probe(tmp_path, *args, **env):
    out = tmp_path / "probe"
    res = subprocess.run(
        [str(LAUNCH / "torchrun.sh"), *args],
        cwd=tmp_path,
        timeout=120,
        env=run_env(tmp_path, PROBE_OUT=str(out), PYTHONPATH=str(ROOT / "tests" / "launch"), **env),
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}


def test_torchrun_two_ranks_get_overrides_verbatim(tmp_path):
    pwned = tmp_path / "PWNED"
    overrides = [a.format(pwned=pwned) for a in TRICKY]
    ranks = probe(tmp_path, "--nproc-per-node", "2", "--module", "argv_probe", "--", *overrides)
    assert sorted(ranks) == [0, 1]
    for rank, rec in ranks.items():
        assert rec["argv"] == overrides
        assert rec["env"]["WORLD_SIZE"] == "2" and rec["env"]["RANK"] == str(rank)
    assert not pwned.exists()


def test_torchrun_nvls_defaults_off_but_settable(tmp_path):
    rec = probe(tmp_path, "--nproc-per-node", "1", "--module", "argv_probe")[0]["env"]
    assert (
        rec["NCCL_NVLS_ENABLE"],
        rec["TORCH_SYMM_MEM_DISABLE_MULTICAST"],
        rec["NVSHMEM_DISABLE_NVLS"],
    ) == ("0", "1", "1")
    rec = probe(tmp_path, "--nproc-per-node", "1", "--module", "argv_probe", NCCL_NVLS_ENABLE="1")[
        0
    ]["env"]
    assert rec["NCCL_NVLS_ENABLE"] == "1"


def test_torchrun_multinode_needs_endpoint(tmp_path):
    res = subprocess.run(
        [str(LAUNCH / "torchrun.sh"), "--nnodes", "2", "--nproc-per-node", "1"],
        env=run_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 2 and "needs --rdzv-endpoint" in res.stderr

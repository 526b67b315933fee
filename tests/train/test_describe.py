"""`python -m ufp4_megatron.cli.describe`: the printed contract, and counts equal to a built model.

    test_describe_prints_the_contract_lines
    test_counts_match_a_built_megatron_model   tiny (dense) and a 2-layer moe_small
    test_dp_null_describes_the_smallest_world  dp = ep, not an impossible dp=1
(impossible layouts are refused: tests/train/test_validate.py)
"""

import sys

from _cli import run

_BUILD = r"""
import sys, torch
from ufp4_megatron.train.footprint import count_params, load_config
from ufp4_megatron.train import distributed
from ufp4_megatron.train.model import build_model
from ufp4_megatron.train.precision import recipe_from_config
from ufp4_megatron.train.runtime import decide
for overrides in (["model=tiny"], ["model=moe_small", "model.num_layers=2", "precision=ufp4"]):
    cfg = load_config(overrides)
    rt = decide(cfg)
    with rt.scope():
        distributed.init(cfg.parallel, rt, 0)
        model, _ = build_model(cfg, recipe_from_config(cfg.precision), torch.float32, torch.device("cpu"))
        print(sum(p.numel() for p in model.parameters()), count_params(cfg.model).total)
"""


def test_describe_prints_the_contract_lines(tmp_path):
    r = run(
        [
            sys.executable,
            "-m",
            "ufp4_megatron.cli.describe",
            "model=moe_7p9b",
            "parallel.tp=2",
            "parallel.ep=8",
            "parallel.dp=8",
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(": ", 1) for line in r.stdout.splitlines())
    assert int(lines["total_params"]) == 7_910_017_024
    assert int(lines["active_params"]) == 1_303_988_224
    assert float(lines["per_gpu_total_gib"]) > 0


def test_counts_match_a_built_megatron_model(tmp_path):
    r = run([sys.executable, "-c", _BUILD], tmp_path)  # one process: Megatron imports once
    assert r.returncode == 0, r.stderr[-2000:]
    pairs = [tuple(map(int, line.split())) for line in r.stdout.splitlines()[-2:]]
    assert len(pairs) == 2 and all(built == counted for built, counted in pairs), pairs


def test_dp_null_describes_the_smallest_world(tmp_path):
    r = run(
        [
            sys.executable,
            "-m",
            "ufp4_megatron.cli.describe",
            "model=moe_124b",
            "parallel.tp=4",
            "parallel.ep=8",
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(": ", 1) for line in r.stdout.splitlines())
    assert lines["layout"].startswith("tp=4 pp=1 ep=8 dp=8 ")


def test_config_dir_must_exist(tmp_path):
    r = run(
        [
            sys.executable,
            "-m",
            "ufp4_megatron.cli.describe",
            "--config-dir",
            str(tmp_path / "nowhere"),
            "model=tiny",
        ],
        tmp_path,
    )
    assert r.returncode == 2 and "--config-dir" in r.stderr and "no such directory" in r.stderr

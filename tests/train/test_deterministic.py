"""train.deterministic on the CPU: its wiring and refusals, and a run under it (train/determinism.py).

The GPU claim (two runs, and runs killed and resumed, bitwise equal at the small and
dense_1p5b shapes) is gpu/deterministic.sh's, whose cases this CPU suite cannot show: on the
CPU two runs are equal without the mode too.

    test_scope_turns_everything_on_and_back_off    torch's switches, cuDNN, the environment
    test_a_value_the_user_set_is_kept             CUBLAS_WORKSPACE_CONFIG=:16:8 stays
    test_environment_values_that_are_not_deterministic_are_refused
    test_megatron_gets_deterministic_mode          TransformerConfig.deterministic_mode
    test_two_deterministic_runs_are_bitwise_equal  the trainer end to end, twice
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from _cli import losses, run, train_cmd

from ufp4_megatron.train import determinism
from ufp4_megatron.train.schema import Config, TrainConfig


def _cfg(on: bool = True) -> Config:
    return Config(train=TrainConfig(deterministic=on))


def test_scope_turns_everything_on_and_back_off(monkeypatch):
    for k in determinism.ENV_DEFAULTS:
        monkeypatch.delenv(k, raising=False)
    before = torch.are_deterministic_algorithms_enabled()
    with determinism.scope(_cfg(False)):
        assert torch.are_deterministic_algorithms_enabled() == before
        assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    with determinism.scope(_cfg()):
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert {k: os.environ[k] for k in determinism.ENV_DEFAULTS} == {
            "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
            "NCCL_ALGO": "Ring",
            "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
        }
        assert determinism.describe().startswith("deterministic: Megatron deterministic_mode")
    assert torch.are_deterministic_algorithms_enabled() == before
    assert not any(k in os.environ for k in determinism.ENV_DEFAULTS)


def test_a_value_the_user_set_is_kept(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    assert determinism.environment_problem(os.environ) is None
    with determinism.scope(_cfg()):
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


@pytest.mark.parametrize(
    "env,fragment",
    [
        ({"CUBLAS_WORKSPACE_CONFIG": ":0:0"}, "CUBLAS_WORKSPACE_CONFIG=':0:0' in the environment"),
        ({"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "1"}, "NVTE_ALLOW_NONDETERMINISTIC_ALGO='1'"),
        (
            {"NCCL_ALGO": "Tree"},
            "NCCL_ALGO='Tree' in the environment may reduce in a varying order",
        ),
        ({"NCCL_ALGO": "Ring,Tree"}, "NCCL_ALGO='Ring,Tree'"),
        ({"NCCL_ALGO": ""}, "NCCL_ALGO=''"),
    ],
)
def test_environment_values_that_are_not_deterministic_are_refused(env, fragment):
    problem = determinism.environment_problem(env)
    assert problem is not None and fragment in problem and "\n" not in problem
    assert determinism.environment_problem({"NCCL_ALGO": "Ring,^NVLS"}) is None
    assert determinism.environment_problem({}) is None


def test_megatron_gets_deterministic_mode():
    from _config import typed_default

    from ufp4_megatron.megatron.cpu_compat import cpu_compat
    from ufp4_megatron.train.model import transformer_config

    cfg = typed_default()
    for on in (False, True):
        c = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, deterministic=on))
        with cpu_compat():
            assert (
                transformer_config(c, torch.float32, torch.device("cpu")).deterministic_mode is on
            )


def test_two_deterministic_runs_are_bitwise_equal(tmp_path):
    """Under torch.use_deterministic_algorithms(True) any op without a deterministic kernel
    raises: the whole CPU path (Megatron's embedding gather, SDPA, the UFP4 linears, the
    optimizer, a checkpoint) runs under it, twice, to the same bits."""
    curves = []
    for i in range(2):
        cmd = train_cmd(
            tmp_path / f"run{i}",
            tmp_path / "cache",
            "train.steps=3",
            "train.deterministic=true",
            "checkpoint.interval=2",
            "logging.wandb.mode=disabled",
        )
        r = run(cmd, tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        assert (
            "deterministic: Megatron deterministic_mode, torch.use_deterministic_"
            "algorithms, CUBLAS_WORKSPACE_CONFIG=:4096:8 NCCL_ALGO=Ring" in r.stdout
        )
        curves.append(losses(tmp_path / f"run{i}"))
    assert len(curves[0]) == 3 and curves[0] == curves[1]

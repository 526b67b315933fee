"""configs/hydra/launcher/*: every launcher composes with the trainer's config and resolves to
hydra-submitit-launcher's classes with the settings the comments promise."""

from pathlib import Path

import pytest
from hydra import compose
from omegaconf import OmegaConf

from ufp4_megatron.configs import CONFIG_DIR
from ufp4_megatron.train.overrides import training_configs


@pytest.fixture(scope="module")
def launchers():
    out = {}
    with training_configs():
        for path in sorted((Path(CONFIG_DIR) / "hydra" / "launcher").glob("*.yaml")):
            cfg = compose(
                "config", overrides=[f"hydra/launcher={path.stem}"], return_hydra_config=True
            )
            out[path.stem] = OmegaConf.to_container(cfg.hydra.launcher, resolve=False)
    return out


def test_launchers_compose(launchers):
    assert set(launchers) == {"slurm", "slurm_cpu", "local"}
    prefix = "hydra_plugins.hydra_submitit_launcher.submitit_launcher."
    assert launchers["slurm"]["_target_"] == prefix + "SlurmLauncher"
    assert launchers["slurm_cpu"]["_target_"] == prefix + "SlurmLauncher"
    assert launchers["local"]["_target_"] == prefix + "LocalLauncher"


def test_slurm_launcher_requeues_and_keeps_multicast_off(launchers):
    slurm = launchers["slurm"]
    assert slurm["tasks_per_node"] == 1  # the trainer's ranks come from torchrun only
    assert slurm["signal_delay_s"] > 0 and slurm["max_num_timeout"] > 0
    setup = "\n".join(slurm["setup"])
    for var in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
        assert f"export {var}=${{oc.env:{var}," in setup  # a default the caller can override
    assert launchers["slurm_cpu"]["gpus_per_node"] is None

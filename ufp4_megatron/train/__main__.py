"""`python -m ufp4_megatron.train` / `ufp4-train`: the Hydra entry point.

    python -m ufp4_megatron.train model=tiny precision=ufp4 train.steps=200
    torchrun --nproc_per_node 2 -m ufp4_megatron.train parallel.tp=2 ...
"""
from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from ..configs import CONFIG_MODULE
from .schema import Config, register_configs


register_configs()


@hydra.main(version_base="1.3", config_path=CONFIG_MODULE, config_name="config")
def _hydra_main(dcfg: DictConfig) -> None:
    from .loop import train

    cfg: Config = OmegaConf.to_object(dcfg)  # the typed dataclasses; fails on MISSING values
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if int(os.environ.get("RANK", 0)) == 0:  # Hydra saved .hydra/config.yaml; keep a copy at top
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(dcfg, resolve=True))
    train(cfg, run_dir)


def main() -> None:
    # Megatron warns about missing apex/TE at import; the CPU path needs neither.
    warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine|apex).*")
    logging.getLogger("megatron").setLevel(logging.WARNING)  # dataset-index chatter
    _hydra_main()


if __name__ == "__main__":
    main()

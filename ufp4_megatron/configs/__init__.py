"""The Hydra configs, shipped as package data (found as `pkg://ufp4_megatron.configs`).

`config.yaml` lists the defaults; one folder per group (model/, precision/, ...). A user's own
configs join through Hydra's `--config-dir DIR` (a `model/mine.yaml` there is `model=mine`).
`CONFIG_DIR` is this folder on disk, for Hydra's compose API in tools and tests.
"""

from pathlib import Path

CONFIG_DIR = str(Path(__file__).resolve().parent)
CONFIG_MODULE = "pkg://ufp4_megatron.configs"

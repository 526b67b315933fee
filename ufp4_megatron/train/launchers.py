"""The Hydra launchers of configs/hydra/launcher/ and what they need installed.

`local` (a sweep's jobs as parallel local subprocesses), `slurm` and `slurm_cpu` run through
hydra-submitit-launcher, which the `[slurm]` extra installs (`pip install
'ufp4-megatron[slurm]'`; `make install` includes it). Without it Hydra says only that it cannot
find 'hydra/launcher/submitit_local'; the trainer says what to install instead.
"""

from __future__ import annotations

import importlib.util

# ours (configs/hydra/launcher/*.yaml) and the plugin's own names
SUBMITIT_LAUNCHERS = ("local", "slurm", "slurm_cpu", "submitit_local", "submitit_slurm")
PLUGIN = "hydra_plugins.hydra_submitit_launcher"


def plugin_installed() -> bool:
    try:
        return importlib.util.find_spec(PLUGIN) is not None
    except ModuleNotFoundError:  # no hydra_plugins namespace at all
        return False


def launcher_problem(overrides: list[str], installed=plugin_installed) -> str | None:
    """None, or one line when `overrides` choose a launcher whose plugin is not installed."""
    for override in overrides:
        key, sep, value = override.partition("=")
        chosen = sep and key.lstrip("+") == "hydra/launcher" and value in SUBMITIT_LAUNCHERS
        if chosen and not installed():
            return (
                f"hydra/launcher={value} runs the sweep's jobs through "
                "hydra-submitit-launcher, which is not installed here: pip install "
                "'ufp4-megatron[slurm]' (or hydra-submitit-launcher), or leave "
                "hydra/launcher out to run the jobs one after another"
            )
    return None

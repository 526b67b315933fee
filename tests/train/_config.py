"""The trainer's checks of a command line, in-process: what `python -m ufp4_megatron.train`
refuses before it writes anything (train/__main__.py: compose_problem, then checked_config),
in milliseconds instead of a subprocess. Use inside the hydra_configs fixture."""

from __future__ import annotations


def refusal(overrides: list[str], world_size: int | None = None) -> str | None:
    """None if the trainer would start with these overrides, else its one-line message."""
    from ufp4_megatron.train.overrides import composed
    from ufp4_megatron.train.validate import ConfigError, checked_config

    cfg, problem = composed(list(overrides))
    if problem:
        return problem
    try:
        checked_config(cfg, world_size=world_size)
    except ConfigError as e:
        return str(e)
    return None


def typed_default(*overrides: str):
    """The typed training config of these overrides (the defaults without any)."""
    from omegaconf import OmegaConf

    from ufp4_megatron.train.overrides import _configs, compose_training

    with _configs():
        return OmegaConf.to_object(compose_training(list(overrides)))

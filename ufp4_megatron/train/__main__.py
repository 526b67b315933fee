"""`python -m ufp4_megatron.train` / `ufp4-train`: the Hydra entry point.

    python -m ufp4_megatron.train model=tiny precision=ufp4 train.steps=200
    torchrun --nproc_per_node 2 -m ufp4_megatron.train parallel.tp=2 ...

Before anything is built or written: the config is validated (train/validate.py) and the run
dir checked (train/resume_check.py: fresh start, resume, or refusal). A refused config, and data
the trainer's data checks refuse (data/checks.py, at the start of the loop), print
`error: <what to change>` and exit 2, without a traceback; so do overrides Hydra cannot
compose (train/overrides.py: a mistyped key, a wrong type, an unknown group option).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from ..configs import CONFIG_MODULE
from ..data.checks import DataError
from . import resume_check
from .checkpoint import CheckpointError
from .identity import register_resolver
from .overrides import compose_problem, precheckable
from .quiet import hide_megatron_noise
from .schema import Config, register_configs
from .validate import ConfigError, checked_config

register_configs()
register_resolver()  # ${ufp4.run_id:} in hydra.run.dir / hydra.sweep.subdir


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", 1))


def _is_rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"


def _hydra_files(dcfg: DictConfig) -> dict[str, str]:
    """What Hydra itself writes to .hydra/ (turned off in configs/hydra/default.yaml so that
    nothing is written before the resume check)."""
    hc = HydraConfig.get()
    return {"config.yaml": OmegaConf.to_yaml(dcfg),
            "hydra.yaml": OmegaConf.to_yaml(OmegaConf.create({"hydra": hc})),
            "overrides.yaml": OmegaConf.to_yaml(hc.overrides.task)}


def start(dcfg: DictConfig, run_dir: Path) -> None:
    """Validate, check the run dir, record the start, train."""
    hide_megatron_noise()  # Hydra has configured logging; Megatron is not imported yet
    cfg: Config = checked_config(dcfg, world_size=_world_size())  # the typed dataclasses
    plan = resume_check.plan_start(cfg, run_dir)
    if _is_rank0():
        print(plan.message(), flush=True)
    if plan.complete:
        return
    hydra_files = _hydra_files(dcfg)
    if _is_rank0():
        resume_check.record(plan, OmegaConf.to_yaml(dcfg, resolve=True), hydra_files)
    from .loop import train

    try:
        train(cfg, run_dir)
    except (ConfigError, DataError):  # refused before the first step (data, process group)
        if _is_rank0() and plan.step == 0:
            _unrecord(run_dir, hydra_files)
        raise


def _unrecord(run_dir: Path, hydra_files: dict) -> None:
    """Removes what `record` wrote for a fresh start that was then refused, so that the run
    dir is as before (a rerun with the fix is a fresh start again, not a changed config)."""
    if (run_dir / resume_check.METRICS).exists():
        return
    for path in [run_dir / resume_check.CONFIG, *(run_dir / ".hydra" / n for n in hydra_files)]:
        path.unlink(missing_ok=True)
    for d in (run_dir / ".hydra", run_dir):
        try:
            d.rmdir()  # only if nothing else is there
        except OSError:
            pass


@hydra.main(version_base="1.3", config_path=CONFIG_MODULE, config_name="config")
def _hydra_main(dcfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        start(dcfg, run_dir)
    except (ConfigError, DataError, CheckpointError) as e:  # what the trainer refuses
        if os.environ.get("LOCAL_RANK", "0") == "0":  # once per node, not once per rank
            print(f"error: {e}", file=sys.stderr, flush=True)
        try:
            run_dir.rmdir()  # Hydra made it; leave nothing behind (only if it is empty)
        except OSError:
            pass
        sys.exit(2)


def main() -> None:
    plain = precheckable(sys.argv[1:])
    if plain is not None and (problem := compose_problem(*plain)):  # before Hydra says it in
        if os.environ.get("LOCAL_RANK", "0") == "0":                # 5-10 lines with exit 1
            print(f"error: {problem}", file=sys.stderr, flush=True)
        sys.exit(2)
    _hydra_main()


if __name__ == "__main__":
    main()

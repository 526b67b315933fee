"""The W&B run of one training run: offline unless a key is configured or mode=online.

Run name = <model>-<precision>-s<seed>, group = experiment. The config is logged as resolved
by Hydra; nothing here reads, prints or stores an API key (wandb finds its own, from
WANDB_API_KEY or ~/.netrc, only in online mode).
"""
from __future__ import annotations

import dataclasses
import os
import uuid
from pathlib import Path

from .schema import Config

MODES = ("offline", "online", "disabled", "auto")


def resolve_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"logging.wandb.mode={mode!r}; valid: {', '.join(MODES)}")
    if mode == "auto":  # online only when the user has put a key in the environment
        return "online" if os.environ.get("WANDB_API_KEY") else "offline"
    return mode


def run_name(cfg: Config) -> str:
    return f"{cfg.model.name}-{cfg.precision.name}-s{cfg.train.seed}"


def start(cfg: Config, run_dir: Path):
    """A wandb run (or None when disabled); resumes the same run id after a restart."""
    mode = resolve_mode(cfg.logging.wandb.mode)
    if mode == "disabled":
        return None
    import wandb

    w = cfg.logging.wandb
    wdir = Path(w.dir or run_dir)
    wdir.mkdir(parents=True, exist_ok=True)
    run_id = (run_dir / "wandb_id.txt")
    if not run_id.exists():
        run_id.write_text(uuid.uuid4().hex[:8])
    run = wandb.init(
        project=w.project, entity=w.entity, group=cfg.experiment, name=run_name(cfg),
        id=run_id.read_text().strip(), resume="allow", mode=mode, dir=str(wdir),
        config=dataclasses.asdict(cfg), settings=wandb.Settings(quiet=True),
    )
    # tokens as the charts' x-axis, so runs of different batch sizes line up (live gaps:
    # train/live_gap.py defines their own x)
    run.define_metric("tokens")
    for key in ("loss", "val_loss", "lr", "grad_norm", "diag/*"):
        run.define_metric(key, step_metric="tokens")
    return run

"""A training run's loss curve, from a run dir (metrics.jsonl), an offline W&B run, or an
online W&B run path (entity/project/run_id)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from . import wandb_offline


@dataclass
class Run:
    source: str
    model: str
    recipe: str  # precision.name: the label in tables and plots
    seed: int
    loss: dict[int, float]  # step -> training loss
    tokens: dict[int, int]  # step -> tokens seen
    val_loss: dict[int, float] = field(default_factory=dict)


def _from_rows(source: str, config: dict, rows: list[dict], step_key: str) -> Run:
    def get(*keys, default=None):
        node = config
        for k in keys:
            if not isinstance(node, dict) or k not in node:
                return default
            node = node[k]
        return node

    rows = [r for r in rows if step_key in r]
    return Run(
        source=source, model=get("model", "name", default="?"),
        recipe=get("precision", "name", default="?"), seed=get("train", "seed", default=0),
        loss={int(r[step_key]): float(r["loss"]) for r in rows if "loss" in r},
        tokens={int(r[step_key]): int(r["tokens"]) for r in rows if "tokens" in r},
        val_loss={int(r[step_key]): float(r["val_loss"]) for r in rows if "val_loss" in r},
    )


def _from_run_dir(path: Path) -> Run:
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines() if line]
    for name in ("config.yaml", ".hydra/config.yaml"):
        if (path / name).exists():
            config = OmegaConf.to_container(OmegaConf.load(path / name))
            break
    else:
        raise FileNotFoundError(f"{path} has metrics.jsonl but no config.yaml or "
                                f".hydra/config.yaml")
    return _from_rows(str(path), config, rows, "step")


def _from_wandb_file(path: Path) -> Run:
    run = wandb_offline.read_run(path)
    return _from_rows(str(path), run["config"], run["history"], "_step")


def _from_wandb_api(run_path: str) -> Run:
    import wandb

    run = wandb.Api().run(run_path)
    return _from_rows(run_path, dict(run.config), list(run.scan_history()), "_step")


def load_run(source: str) -> Run:
    path = Path(source)
    if path.is_dir() and (path / "metrics.jsonl").exists():
        return _from_run_dir(path)
    if path.suffix == ".wandb" or path.is_dir():
        return _from_wandb_file(path if path.is_file() else wandb_offline.find_run_file(path))
    if source.count("/") == 2 and not path.exists():
        return _from_wandb_api(source)
    raise FileNotFoundError(f"{source}: not a run dir with metrics.jsonl, an offline W&B run, "
                            f"or a W&B run path entity/project/run_id")

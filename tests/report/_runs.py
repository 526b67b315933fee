"""Run dirs in the trainer's format (config.yaml + metrics.jsonl), with chosen losses."""

from __future__ import annotations

import json
from pathlib import Path

import yaml


def write_run(
    path: Path,
    recipe: str,
    seed: int,
    losses: list[float],
    *,
    model: str = "tiny",
    experiment: str = "t",
    val_every: int = 0,
    precision: dict | None = None,
    tokens_per_step: int = 64,
    lr: list[float] | None = None,
    steps: int | None = None,
) -> str:
    """Step i+1 has loss losses[i] (val_loss = loss + 0.1 every val_every steps) and, given,
    learning rate lr[i]; steps: the config's train.steps (its planned length)."""
    path.mkdir(parents=True)
    config = {
        "experiment": experiment,
        "model": {"name": model},
        "precision": {"name": recipe, "recipe": recipe, **(precision or {})},
        "train": {
            "seed": seed,
            "global_batch": 2,
            "seq_len": 32,
            **({"steps": steps} if steps is not None else {}),
        },
        "logging": {"wandb": {"project": "ufp4-test", "diagnostics_layers": [0]}},
    }
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    rows = []
    for i, loss in enumerate(losses):
        step = i + 1
        row = {"step": step, "loss": loss, "tokens": tokens_per_step * step}
        if lr is not None:
            row["lr"] = lr[i]
        if val_every and step % val_every == 0:
            row["val_loss"] = loss + 0.1
        rows.append(json.dumps(row) + "\n")
    (path / "metrics.jsonl").write_text("".join(rows))
    return str(path)


def offline_env(tmp: Path) -> dict:
    """W&B offline, its dirs in tmp, no key: what every CLI test runs under."""
    import os

    env = dict(
        os.environ,
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        OMP_NUM_THREADS="1",
        WANDB_DIR=str(tmp / "wb"),
        WANDB_CACHE_DIR=str(tmp / "wbc"),
        WANDB_CONFIG_DIR=str(tmp / "wbcfg"),
        HOME=str(tmp / "home"),
        MPLCONFIGDIR=str(tmp / "mpl"),
    )
    env.pop("WANDB_API_KEY", None)
    return env


def logged_table(run_file: Path, key: str) -> list[dict]:
    """The rows of the last wandb.Table an offline run logged under `key`, as dicts."""
    from ufp4_megatron.report.wandb_offline import read_run

    history = read_run(run_file)["history"]
    path = [h[f"{key}.path"] for h in history if f"{key}.path" in h][-1]
    table = json.loads((Path(run_file).parent / "files" / path).read_text())
    return [dict(zip(table["columns"], row)) for row in table["data"]]

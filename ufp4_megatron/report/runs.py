"""A training run's loss curve and config, from a run dir (metrics.jsonl), an offline W&B run,
or an online W&B run path (entity/project/run_id).

Which one a RUN argument is: an existing path is local (a run dir, an offline W&B run dir or a
.wandb file); `wandb:entity/project/run_id` always goes to the W&B API; a bare
`entity/project/run_id` goes to the API only when no such local path exists and its first
part is not a local directory either (so a mistyped `runs/default/tiny-bf16-s1` is reported as
"no such run dir", not sent to W&B as a run id).
"""

from __future__ import annotations

import difflib
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from ..train.logs.metrics import read_metrics
from ..train.rundir import identity
from . import wandb_offline
from .errors import BadInput

_PART = r"[A-Za-z0-9_-][A-Za-z0-9_.-]*"
_WANDB_PATH = re.compile(rf"{_PART}/{_PART}/[A-Za-z0-9_-]+")  # entity/project/run_id


@dataclass
class Run:
    source: str
    model: str
    recipe: str  # precision.name, as the run was configured
    seed: int
    loss: dict[int, float]  # step -> training loss
    tokens: dict[int, int]  # step -> tokens seen
    val_loss: dict[int, float] = field(default_factory=dict)
    lr: dict[int, float] = field(default_factory=dict)  # step -> learning rate of its update
    # the resolved config; without one, the identity is (model, recipe, seed) only
    config: dict = field(default_factory=dict)
    label: str = ""  # the name in tables: recipe, or recipe#setting when two settings share it

    def __post_init__(self):
        if not self.config:
            self.config = {
                "model": {"name": self.model},
                "precision": {"name": self.recipe},
                "train": {"seed": self.seed},
            }
        self.label = self.label or self.recipe

    @property
    def run_id(self) -> str:
        """train.rundir.identity.run_id: equal for two runs of the same command."""
        return identity.run_id(self.config)

    @property
    def sibling(self) -> str:
        """Shared with the runs that differ only in precision (its BF16 and E2M1 references)."""
        return identity.sibling_key(self.config)

    @property
    def setting(self) -> str:
        """The run's identity without its seed: shared by the seeds of one recipe and setting."""
        cfg = dict(self.config)
        cfg["train"] = {**(cfg.get("train") or {}), "seed": None}
        return identity.run_id(cfg)

    @property
    def experiment(self) -> str | None:
        return self.config.get("experiment")


def config_value(config: dict, *keys, default=None):
    """config[k1][k2]... or the default where a key is missing."""
    node = config
    for k in keys:
        if not isinstance(node, dict) or k not in node:
            return default
        node = node[k]
    return node


def _from_rows(source: str, config: dict, rows: list[dict], step_key: str) -> Run:
    rows = [r for r in rows if step_key in r]
    run = Run(
        source=source,
        model=config_value(config, "model", "name", default="?"),
        recipe=config_value(config, "precision", "name", default="?"),
        seed=config_value(config, "train", "seed", default=0),
        loss={int(r[step_key]): float(r["loss"]) for r in rows if "loss" in r},
        tokens={int(r[step_key]): int(r["tokens"]) for r in rows if "tokens" in r},
        val_loss={int(r[step_key]): float(r["val_loss"]) for r in rows if "val_loss" in r},
        lr={int(r[step_key]): float(r["lr"]) for r in rows if "lr" in r},
        config={k: v for k, v in config.items() if not k.startswith("_")},  # not W&B's _wandb
    )
    if not run.loss:
        raise BadInput(f"{source}: no logged training loss (is it a training run?)")
    for key, series in (("loss", run.loss), ("val_loss", run.val_loss)):
        bad = [s for s in sorted(series) if not math.isfinite(series[s])]
        if bad:  # a diverged run: every mean and interval over it would be NaN
            raise BadInput(
                f"{source}: {key} is {series[bad[0]]} at step {bad[0]} ({len(bad)} "
                f"non-finite step(s)): the run diverged and has no gap to measure; "
                "leave it out"
            )
    return run


def _read_metrics(path: Path) -> list[dict]:
    """The trainer's own reader (a partial last line skipped with a note); a damaged line is
    bad input here."""
    try:
        return read_metrics(path, note=lambda message: print(f"note: {message}"))
    except ValueError as e:
        raise BadInput(str(e)) from None


def _from_run_dir(path: Path) -> Run:
    for name in ("config.yaml", ".hydra/config.yaml"):
        if (path / name).exists():
            config = OmegaConf.load(path / name)
            # Hydra's copy is unresolved: its rht/sr switches default to `${ufp4.preset:...}`
            # (train/schema.py); resolve them, or compare would read the strings as switches
            from ..train.precision_resolvers import (
                register_ablation_resolver,
                register_preset_resolver,
            )

            register_preset_resolver()
            register_ablation_resolver()  # precision.name of the package's YAMLs
            try:
                config = OmegaConf.to_container(config, resolve=True)
            except Exception as e:
                raise BadInput(
                    f"{path / name}: cannot resolve it ({e}); give the run dir its config.yaml"
                ) from None
            break
    else:
        raise BadInput(f"{path} has metrics.jsonl but no config.yaml or .hydra/config.yaml")
    return _from_rows(str(path), config, _read_metrics(path / "metrics.jsonl"), "step")


def _from_wandb_file(path: Path) -> Run:
    try:
        run = wandb_offline.read_run(path)
    except ValueError as e:
        raise BadInput(str(e)) from None
    return _from_rows(str(path), run["config"], run["history"], "_step")


def _from_wandb_api(run_path: str) -> Run:
    import wandb

    try:
        run = wandb.Api(timeout=30).run(run_path)
        rows = list(run.scan_history())
    except wandb.errors.UsageError as e:  # no API key: say so, offline mode included
        mode = os.environ.get("WANDB_MODE")
        raise BadInput(
            f"{run_path}: no such local run dir, and reading it as the W&B run "
            f"entity/project/run_id needs an API key ({str(e).strip()}"
            f"{'; WANDB_MODE=' + mode if mode else ''}): pass the run's local dir "
            f"or its offline-run-*/run-*.wandb, or `wandb login`"
        ) from None
    except Exception as e:  # network, permissions, unknown run: one line, not wandb's trace
        raise BadInput(
            f"{run_path}: W&B API: {type(e).__name__}: "
            f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        ) from None
    return _from_rows(run_path, dict(run.config), rows, "_step")


def _no_such_run(source: str) -> BadInput:
    path = Path(source)
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    hint = ""
    if parent.is_dir():
        names = [p.name for p in parent.iterdir() if p.is_dir()]
        first_missing = path.relative_to(parent).parts[0] if path != parent else path.name
        close = difflib.get_close_matches(first_missing, names, n=3)
        if close:
            hint = f" (in {parent}: did you mean {', '.join(close)}?)"
    return BadInput(f"no such run dir: {source}{hint}")


def load_run(source: str) -> Run:
    if source.startswith("wandb:"):
        return _from_wandb_api(source.removeprefix("wandb:"))
    path = Path(source)
    if path.is_file():
        if path.suffix == ".wandb":
            return _from_wandb_file(path)
        raise BadInput(f"{source}: not a run dir, an offline W&B run dir or a .wandb file")
    if path.is_dir():
        if (path / "metrics.jsonl").exists():
            return _from_run_dir(path)
        try:
            return _from_wandb_file(wandb_offline.find_run_file(path))
        except FileNotFoundError:
            raise BadInput(
                f"{source}: a directory without metrics.jsonl or an offline W&B run "
                f"(run-*.wandb): not a training run dir"
            ) from None
    first = Path(path.parts[0]) if path.parts else path
    if _WANDB_PATH.fullmatch(source) and not first.exists():
        return _from_wandb_api(source)
    raise _no_such_run(source)

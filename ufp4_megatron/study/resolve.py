"""Each planned run composed exactly as the trainer will compose it, before anything starts.

A misspelt override fails the study at plan time naming the run, not 48 runs later; and the
runner learns what it needs from the resolved config: the step count (progress, completion),
the labels compare pairs runs by (model name, recipe name, seed) and the data it must prepare.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .grid import RunSpec


@dataclass(frozen=True)
class RunInfo:
    steps: int
    model: str  # model.name
    recipe: str  # precision.name
    seed: int
    tokens_per_step: int
    embedded_data: Any  # the `data` config when it is the embedded corpus (prefixes empty)


def resolve(runs: list[RunSpec]) -> dict[str, RunInfo]:
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from ..train.overrides import compose_training, describe_error, schema_problem, training_configs

    out: dict[str, RunInfo] = {}
    with training_configs():  # one context for every run: composing is then milliseconds
        for run in runs:
            try:
                composed = compose_training(list(run.overrides))
                cfg = OmegaConf.to_object(composed)
            except (HydraException, OmegaConfBaseException) as e:
                raise SystemExit(
                    f"ufp4-launch study: run {run.name}: {describe_error(e)}"
                ) from None
            if problem := schema_problem(composed):
                raise SystemExit(f"ufp4-launch study: run {run.name}: {problem}")
            t = cfg.train
            out[run.name] = RunInfo(
                steps=t.steps,
                model=cfg.model.name,
                recipe=cfg.precision.name,
                seed=t.seed,
                tokens_per_step=t.global_batch * t.seq_len,
                embedded_data=None if cfg.data.prefixes else cfg.data,
            )
    check_distinct_labels(out)
    return out


def check_distinct_labels(infos: dict[str, RunInfo]) -> None:
    """compare pairs a run with the reference of the same model name and seed: two runs with
    the same (model, recipe, seed) would be silently confused."""
    seen: dict[tuple, str] = {}
    for name, i in infos.items():
        key = (i.model, i.recipe, i.seed)
        if key in seen:
            raise SystemExit(
                f"ufp4-launch study: runs {seen[key]} and {name} are both model "
                f"{i.model!r}, recipe {i.recipe!r}, seed {i.seed}; compare could "
                f"not tell them apart: give each axis value its own model.name"
            )
        seen[key] = name

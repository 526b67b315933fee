"""The `precision` config group -> a frozen Recipe, through get_recipe's overrides."""
from __future__ import annotations

from ..recipe import GEMMS, Recipe, get_recipe, list_recipes
from .schema import PrecisionConfig


def recipe_from_config(cfg: PrecisionConfig) -> Recipe:
    """The preset `cfg.recipe` with the config's RHT, SR and format fields applied.

    The YAML states every RHT/SR switch, so the command line edits one of them:
    precision.rht.fprop=false, precision.sr.dy=false, precision.grid=int4, and any single
    field by its get_recipe path: +precision.overrides.fprop.x.grid=e2m1.
    """
    if cfg.recipe not in list_recipes():
        raise ValueError(f"precision.recipe={cfg.recipe!r} is not a recipe; valid: "
                         f"{', '.join(list_recipes())}")
    overrides = {
        "rht": tuple(g for g in GEMMS if getattr(cfg.rht, g)),
        "rht_size": cfg.rht.size,
        "rht_seed": cfg.rht.seed,
        "sr": tuple(op for op in ("x", "w", "dy") if getattr(cfg.sr, op)),
    }
    for key in ("grid", "block", "scale", "block_2d"):
        if getattr(cfg, key) is not None:
            overrides[key] = getattr(cfg, key)
    overrides |= _dotted(cfg.overrides)
    try:
        return get_recipe(cfg.recipe, **overrides)
    except ValueError as e:
        raise ValueError(f"precision config {cfg.name!r}: {e}") from e


def _dotted(tree: dict, prefix: str = "") -> dict:
    """{'fprop': {'x': {'grid': 'e2m1'}}} -> {'fprop.x.grid': 'e2m1'} (get_recipe's paths)."""
    out = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        out |= _dotted(value, path + ".") if isinstance(value, dict) else {path: value}
    return out


def check_bf16_layers(cfg: PrecisionConfig, num_layers: int) -> None:
    start, end = cfg.bf16_layers.start, cfg.bf16_layers.end
    if start < 0 or end < 0 or start + end > num_layers:
        raise ValueError(f"precision.bf16_layers start={start} end={end} must be >= 0 and sum "
                         f"to at most model.num_layers={num_layers}")

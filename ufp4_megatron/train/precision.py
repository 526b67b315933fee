"""The `precision` config group <-> a frozen Recipe, through get_recipe's overrides.

    recipe_from_config(cfg)          precision group -> Recipe (ValueError naming what to change)
    switch_overrides(preset, ovr)    get_recipe's rht/sr overrides as precision-group overrides
    ABLATION_OVERRIDES               recipe.ABLATIONS on the command line (ufp4-launch, studies)

A precision YAML names a preset (`recipe:`) and states only what it changes; every rht and sr
switch it leaves unset resolves to the preset's (`${ufp4.preset:...}`, the schema's
defaults; train/precision_resolvers.py), so the run's config.yaml records every switch and a YAML
that omits `rht` runs its preset's RHT.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..quant.recipe import (
    ABLATION_PRESET,
    ABLATIONS,
    GEMMS,
    OPERAND_NAMES,
    PRESETS,
    Recipe,
    get_recipe,
    list_recipes,
)
from .precision_resolvers import preset_switches

if TYPE_CHECKING:
    from .schema import PrecisionConfig


def recipe_from_config(cfg: PrecisionConfig) -> Recipe:
    """The preset `cfg.recipe` with the config's RHT, SR and format fields applied.

    Unset (None) switches are the preset's. The command line edits one of them:
    precision.rht.fprop=false, precision.sr.dy=false, precision.grid=int4, and any single
    field by its get_recipe path: +precision.overrides.fprop.x.grid=e2m1.
    """
    if cfg.recipe not in list_recipes():
        raise ValueError(
            f"precision.recipe={cfg.recipe!r} is not a recipe; valid: {', '.join(list_recipes())}"
        )
    preset = preset_switches(PRESETS[cfg.recipe])
    rht = _or_preset(cfg.rht, preset["rht"])
    sr = _or_preset(cfg.sr, preset["sr"])
    overrides = {
        "rht": tuple(g for g in GEMMS if rht[g]),
        "rht_size": rht["size"],
        "rht_seed": rht["seed"],
        "sr": tuple(op for op in OPERAND_NAMES if sr[op]),
    }
    for key in ("grid", "block", "scale", "block_2d"):
        if getattr(cfg, key) is not None:
            overrides[key] = getattr(cfg, key)
    overrides |= _dotted(cfg.overrides)
    try:
        return get_recipe(cfg.recipe, **overrides)
    except ValueError as e:
        raise ValueError(f"precision config {cfg.name!r}: {e}") from e


def _or_preset(node, preset: dict) -> dict:
    return {k: preset[k] if getattr(node, k) is None else getattr(node, k) for k in preset}


def _dotted(tree: dict, prefix: str = "") -> dict:
    """{'fprop': {'x': {'grid': 'e2m1'}}} -> {'fprop.x.grid': 'e2m1'} (get_recipe's paths)."""
    out = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        out |= _dotted(value, path + ".") if isinstance(value, dict) else {path: value}
    return out


def switch_overrides(preset: str, overrides: Mapping[str, Any]) -> tuple[str, ...]:
    """get_recipe(preset, **overrides) as precision-group overrides of `precision=<preset>`:
    one `precision.rht.<gemm>=...` / `precision.sr.<operand>=...` per switch that changes.
    overrides: get_recipe's shorthand `rht` (GEMM names on) and `sr` (operand names on)."""
    stated = preset_switches(get_recipe(preset))
    out = []
    for key, value in overrides.items():
        if key not in ("rht", "sr") or isinstance(value, (str, bool)):
            raise ValueError(
                f"override {key}={value!r} has no precision switch; give rht or "
                "sr as a tuple of names, or use +precision.overrides.<path>"
            )
        names = GEMMS if key == "rht" else OPERAND_NAMES
        on = set(value)
        if on - set(names):
            raise ValueError(
                f"override {key}={value!r}: unknown names {sorted(on - set(names))}; "
                f"valid: {', '.join(names)}"
            )
        out += [
            f"precision.{key}.{n}={str(n in on).lower()}"
            for n in names
            if (n in on) != stated[key][n]
        ]
    return tuple(out)


# recipe.ABLATIONS as the launcher passes them after `precision=ufp4 precision.name=<name>`
ABLATION_OVERRIDES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {name: switch_overrides(ABLATION_PRESET, o) for name, o in ABLATIONS.items()}
)


def check_bf16_layers(cfg: PrecisionConfig, num_layers: int) -> None:
    start, end = cfg.bf16_layers.start, cfg.bf16_layers.end
    if start < 0 or end < 0 or start + end > num_layers:
        raise ValueError(
            f"precision.bf16_layers start={start} end={end} must be >= 0 and sum "
            f"to at most model.num_layers={num_layers}"
        )

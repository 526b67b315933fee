"""The `precision` config group <-> a frozen Recipe, through get_recipe's overrides.

    recipe_from_config(cfg)          precision group -> Recipe (ValueError naming what to change)
    preset_switches(recipe)          the rht/sr switches that state a preset
    switch_overrides(preset, ovr)    get_recipe's rht/sr overrides as precision-group overrides
    ABLATION_OVERRIDES               recipe.ABLATIONS on the command line (ufp4-launch, studies)

A precision YAML names a preset (`recipe:`) and states only what it changes; every rht and sr
switch it leaves unset resolves to the preset's (`${ufp4.preset:...}`, the schema's
defaults), so the run's config.yaml records every switch and a YAML that omits `rht` runs its
preset's RHT.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping

from ..recipe import (ABLATION_PRESET, ABLATIONS, GEMMS, OPERAND_NAMES, PRESETS, Recipe,
                      get_recipe, list_recipes)

if TYPE_CHECKING:
    from .schema import PrecisionConfig

PRESET_RESOLVER = "ufp4.preset"
RHT_SIZE = 16  # precision.rht.size of a preset without any RHT: the size a switch turns on


def recipe_from_config(cfg: PrecisionConfig) -> Recipe:
    """The preset `cfg.recipe` with the config's RHT, SR and format fields applied.

    Unset (None) switches are the preset's. The command line edits one of them:
    precision.rht.fprop=false, precision.sr.dy=false, precision.grid=int4, and any single
    field by its get_recipe path: +precision.overrides.fprop.x.grid=e2m1.
    """
    if cfg.recipe not in list_recipes():
        raise ValueError(f"precision.recipe={cfg.recipe!r} is not a recipe; valid: "
                         f"{', '.join(list_recipes())}")
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


def preset_switches(recipe: Recipe) -> dict[str, dict[str, Any]]:
    """{"rht": {fprop, dgrad, wgrad, size, seed}, "sr": {x, w, dy}}: the precision group's
    switches that state `recipe`, so that recipe_from_config gives it back unchanged. A recipe
    the switches cannot state (RHT sizes that differ between GEMMs, an operand rounded
    stochastically in one GEMM and not in another) is refused: state it by dotted overrides."""
    sizes = {spec.rht for g in GEMMS if (spec := getattr(recipe, g)) is not None and spec.rht}
    if len(sizes) > 1:
        raise ValueError(f"recipe {recipe.name!r} uses RHT sizes {sorted(sizes)}: one "
                         "precision.rht.size cannot state it")
    rht: dict[str, Any] = {g: getattr(recipe, g) is not None and getattr(recipe, g).rht is not None
                           for g in GEMMS}
    rht |= {"size": sizes.pop() if sizes else RHT_SIZE, "seed": recipe.rht_seed}
    sr = {}
    for name in OPERAND_NAMES:
        rounding = {op.rounding for g in GEMMS for n, op in recipe.operands(g)
                    if n == name and op is not None}
        if len(rounding) > 1:
            raise ValueError(f"recipe {recipe.name!r} rounds {name} stochastically in some "
                             f"GEMMs only: one precision.sr.{name} cannot state it")
        sr[name] = rounding == {"sr"}
    return {"rht": rht, "sr": sr}


def preset_switch(recipe_name: Any, key: str) -> Any:
    """precision.<key> ("rht.fprop", "sr.dy", ...) as preset `recipe_name` states it; None for
    a name that is not a preset (recipe_from_config then says so, as a one-line error)."""
    if not isinstance(recipe_name, str) or recipe_name not in PRESETS:
        return None
    group, field = key.split(".")
    return preset_switches(PRESETS[recipe_name])[group][field]


def register_preset_resolver() -> None:
    """`${ufp4.preset:<recipe>,<group>.<switch>}`: the schema's default of every rht and sr
    switch (train/schema.py). Registered with the schema (register_configs)."""
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver(PRESET_RESOLVER, preset_switch, replace=True)


def switch_overrides(preset: str, overrides: Mapping[str, Any]) -> tuple[str, ...]:
    """get_recipe(preset, **overrides) as precision-group overrides of `precision=<preset>`:
    one `precision.rht.<gemm>=...` / `precision.sr.<operand>=...` per switch that changes.
    overrides: get_recipe's shorthand `rht` (GEMM names on) and `sr` (operand names on)."""
    stated = preset_switches(get_recipe(preset))
    out = []
    for key, value in overrides.items():
        if key not in ("rht", "sr") or isinstance(value, (str, bool)):
            raise ValueError(f"override {key}={value!r} has no precision switch; give rht or "
                             "sr as a tuple of names, or use +precision.overrides.<path>")
        names = GEMMS if key == "rht" else OPERAND_NAMES
        on = set(value)
        if on - set(names):
            raise ValueError(f"override {key}={value!r}: unknown names {sorted(on - set(names))}; "
                             f"valid: {', '.join(names)}")
        out += [f"precision.{key}.{n}={str(n in on).lower()}" for n in names
                if (n in on) != stated[key][n]]
    return tuple(out)


# recipe.ABLATIONS as the launcher passes them after `precision=ufp4 precision.name=<name>`
ABLATION_OVERRIDES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {name: switch_overrides(ABLATION_PRESET, o) for name, o in ABLATIONS.items()})


def check_bf16_layers(cfg: PrecisionConfig, num_layers: int) -> None:
    start, end = cfg.bf16_layers.start, cfg.bf16_layers.end
    if start < 0 or end < 0 or start + end > num_layers:
        raise ValueError(f"precision.bf16_layers start={start} end={end} must be >= 0 and sum "
                         f"to at most model.num_layers={num_layers}")

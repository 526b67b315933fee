"""The rht and sr switches of the `precision` group that state a preset, and the resolver
`${ufp4.preset:<recipe>,<group>.<switch>}` through which the schema's defaults of those
switches are the preset's (train/schema.py). Below both the schema and the precision <->
Recipe conversion (train/precision.py), which read it.

    preset_switches(recipe)       {"rht": {...}, "sr": {...}} stating `recipe`, or ValueError
    preset_switch(name, key)      one switch of preset `name` (the resolver)
    register_preset_resolver()    registers it with OmegaConf (train/schema.register_configs)
"""

from __future__ import annotations

from typing import Any

from ..quant.recipe import GEMMS, OPERAND_NAMES, PRESETS, Recipe

PRESET_RESOLVER = "ufp4.preset"
RHT_SIZE = 16  # precision.rht.size of a preset without any RHT: the size a switch turns on


def preset_switches(recipe: Recipe) -> dict[str, dict[str, Any]]:
    """{"rht": {fprop, dgrad, wgrad, size, seed}, "sr": {x, w, dy}}: the precision group's
    switches that state `recipe`, so that recipe_from_config gives it back unchanged. A recipe
    the switches cannot state (RHT sizes that differ between GEMMs, an operand rounded
    stochastically in one GEMM and not in another) is refused: state it by dotted overrides."""
    sizes = {spec.rht for g in GEMMS if (spec := getattr(recipe, g)) is not None and spec.rht}
    if len(sizes) > 1:
        raise ValueError(
            f"recipe {recipe.name!r} uses RHT sizes {sorted(sizes)}: one "
            "precision.rht.size cannot state it"
        )
    rht: dict[str, Any] = {
        g: getattr(recipe, g) is not None and getattr(recipe, g).rht is not None for g in GEMMS
    }
    rht |= {"size": sizes.pop() if sizes else RHT_SIZE, "seed": recipe.rht_seed}
    sr = {}
    for name in OPERAND_NAMES:
        rounding = {
            op.rounding
            for g in GEMMS
            for n, op in recipe.operands(g)
            if n == name and op is not None
        }
        if len(rounding) > 1:
            raise ValueError(
                f"recipe {recipe.name!r} rounds {name} stochastically in some "
                f"GEMMs only: one precision.sr.{name} cannot state it"
            )
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

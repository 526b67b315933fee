"""The precision group's OmegaConf resolvers: the switches that state a preset, and the name
of an override ablation. Below both the schema and the precision <-> Recipe conversion
(train/precision.py), which read them.

The rht and sr switches of the `precision` group that state a preset, and the resolver
`${ufp4.preset:<recipe>,<group>.<switch>}` through which the schema's defaults of those
switches are the preset's (train/schema.py):

    preset_switches(recipe)       {"rht": {...}, "sr": {...}} stating `recipe`, or ValueError
    preset_switch(name, key)      one switch of preset `name` (the resolver)
    register_preset_resolver()    registers it with OmegaConf (train/schema.register_configs)

A readable name for an override ablation: `precision=ufp4 precision.rht.fprop=false` is
named `ufp4-rht.fprop=false`, not `ufp4` like the recipe it departs from.

The package's precision YAMLs set `name: ${ufp4.ablation_name:<preset>}`: the preset's name,
followed by every precision key whose value differs from what the preset states (an rht or sr
switch, grid/block/scale/block_2d set, a dotted `+precision.overrides.<path>`, BF16 layers),
sorted, joined by commas. precision.name is what the run dir, the W&B run name, compare's
labels and the W&B workspace's grouping use, so all of them tell the ablation from its recipe.
A name given on the command line (`precision.name=rht_off`) or in one's own YAML is kept as
it is.

The name is one path component: characters other than letters, digits and `._=,+-` become
`_`, and a long suffix is cut and ends with 8 hex digits of the whole (a name stays under the
run dir's 100-character limit, and two long ablations still differ).
"""

from __future__ import annotations

import hashlib
import re
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


ABLATION_RESOLVER = "ufp4.ablation_name"
_MAX_SUFFIX = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+-]")
_FIELDS = ("grid", "block", "scale", "block_2d")


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else str(value)


def _flat(prefix: str, value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [kv for k, v in value.items() for kv in _flat(f"{prefix}.{k}", v)]
    return [(prefix, value)]


def departures(precision: dict) -> list[str]:
    """`key=value` for each precision key that departs from its preset's value (sorted)."""
    recipe = precision.get("recipe")
    out = []
    for group in ("rht", "sr"):
        for key, value in (precision.get(group) or {}).items():
            if value != preset_switch(recipe, f"{group}.{key}"):
                out.append(f"{group}.{key}={_text(value)}")
    out += [f"{k}={_text(precision[k])}" for k in _FIELDS if precision.get(k) is not None]
    out += [f"{k}={_text(v)}" for k, v in _flat("overrides", precision.get("overrides") or {})]
    layers = precision.get("bf16_layers") or {}
    out += [f"bf16_layers.{k}={v}" for k, v in layers.items() if v]
    return sorted(out)


def ablation_name(base: str, precision: dict) -> str:
    """`base`, or `base-<departures>` when the precision node departs from its preset."""
    suffix = _UNSAFE.sub("_", ",".join(departures(precision)))
    if not suffix:
        return base
    if len(suffix) > _MAX_SUFFIX:
        digest = hashlib.sha256(suffix.encode()).hexdigest()[:8]
        suffix = f"{suffix[: _MAX_SUFFIX - 9]}~{digest}"
    return f"{base}-{suffix}"


def register_ablation_resolver() -> None:
    """`${ufp4.ablation_name:<base>}` in a precision node (the package's precision YAMLs)."""
    from omegaconf import Container, DictConfig, OmegaConf

    def resolve(base: str, *, _parent_: DictConfig) -> str:
        node = {}
        for key in _parent_:
            if key != "name":  # itself
                value = _parent_[key]  # resolves the preset switches' own interpolations
                node[key] = (
                    OmegaConf.to_container(value, resolve=True)
                    if isinstance(value, Container)
                    else value
                )
        return ablation_name(base, node)

    OmegaConf.register_new_resolver(ABLATION_RESOLVER, resolve, replace=True)

"""A readable name for an override ablation: `precision=ufp4 precision.rht.fprop=false` is
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

from .preset_switches import preset_switch

RESOLVER = "ufp4.ablation_name"
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


def register_resolver() -> None:
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

    OmegaConf.register_new_resolver(RESOLVER, resolve, replace=True)

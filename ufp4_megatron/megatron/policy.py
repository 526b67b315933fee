"""Which recipe each linear of a Megatron GPT runs: a default, rules by module path, and the
BF16 layer policy of Megatron's config. Plus the SR seed stream the chosen linears share.

Module paths are those of the linear in a pipeline-parallel-size-1 model, with the global
0-based layer index, e.g.
    decoder.layers.3.self_attention.linear_qkv      decoder.layers.3.mlp.linear_fc2
    decoder.layers.3.mlp.experts.linear_fc1         decoder.layers.3.mlp.shared_experts.linear_fc2
Rules are shell-style globs (fnmatch) on that path; the first matching rule wins:
    UFP4Policy("ufp4", rules={"*.linear_fc2": "e2m1"})       # every fc2 in E2M1, rest UFP4
    UFP4Policy("ufp4", rules={"decoder.layers.0.*": "bf16"})  # layer 0 unquantized
Layers that Megatron's `first_last_layers_bf16` / `num_layers_at_start_in_bf16` /
`num_layers_at_end_in_bf16` keep in BF16 get no UFP4 linear at all, whatever the rules say.
A linear whose recipe quantizes nothing keeps Megatron's own class, so `bf16` is exactly
Megatron's local spec. Embeddings, LM head, norms, attention core and router are never touched.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from megatron.core.fp8_utils import is_first_last_bf16_layer

from ..quant.recipe import Recipe, get_recipe
from .seeds import SRSeeds

RecipeLike = str | Recipe


@dataclass(frozen=True)
class UFP4Binding:
    """What one UFP4 linear needs beyond Megatron's arguments (passed through the spec)."""

    recipe: Recipe
    seeds: SRSeeds
    layer_number: int  # global, 1-based (Megatron's TransformerLayer.layer_number)
    path: str  # policy path, for errors and logs
    role: int  # stable id of the path without the layer index, mixed into SR seeds
    cache_weights: bool = False  # keep the weight's RTNE operands per step (quant/weight_cache.py)

    def __repr__(self) -> str:
        return f"UFP4Binding({self.path}, recipe={self.recipe.name}, layer={self.layer_number})"


WEIGHT_CACHE = ("experts", "all", "none")


class UFP4Policy:
    """Recipe per linear (default + path rules + Megatron's BF16 layers) and the SR seeds.

    weight_cache: which linears keep their weight's RTNE operands from one optimizer step to
    the next (quant/weight_cache.py; bit for bit the same results, at the memory of two
    quantized copies of each such weight, one where fprop's and dgrad's are the same bits):
    "experts" (routed experts, whose weights are the largest and are re-quantized for the
    fewest tokens; the default), "all" quantized linears, or "none".
    """

    def __init__(
        self,
        recipe: RecipeLike = "ufp4",
        *,
        rules: Mapping[str, RecipeLike] | Sequence[tuple[str, RecipeLike]] = (),
        sr_seed: int = 0,
        weight_cache: str = "experts",
    ):
        self.default = _resolve(recipe)
        items = rules.items() if isinstance(rules, Mapping) else rules
        self.rules = tuple((str(pattern), _resolve(r)) for pattern, r in items)
        self.seeds = SRSeeds(sr_seed)
        if weight_cache not in WEIGHT_CACHE:
            raise ValueError(f"weight_cache={weight_cache!r}; valid: {', '.join(WEIGHT_CACHE)}")
        self.weight_cache = weight_cache

    def recipe_for(self, path: str, *, layer_number: int, config=None) -> Recipe | None:
        """The recipe of the linear at `path` in global layer `layer_number` (1-based), or None
        when it stays in Megatron's BF16 module."""
        if config is not None and is_first_last_bf16_layer(config, layer_number - 1):
            return None
        recipe = next(
            (r for pattern, r in self.rules if fnmatch.fnmatchcase(path, pattern)), self.default
        )
        return recipe if recipe.quantized else None

    def bind(self, path: str, *, layer_number: int, config=None) -> UFP4Binding | None:
        recipe = self.recipe_for(path, layer_number=layer_number, config=config)
        if recipe is None:
            return None
        role = path.split(".", 3)[-1] if path.startswith("decoder.layers.") else path
        return UFP4Binding(
            recipe=recipe,
            seeds=self.seeds,
            layer_number=layer_number,
            path=path,
            role=_stable_id(role),
            cache_weights=self.caches_weights(path),
        )

    def caches_weights(self, path: str) -> bool:
        """Whether the linear at `path` keeps its weight operands (weight_cache)."""
        if self.weight_cache == "all":
            return True
        return self.weight_cache == "experts" and ".experts." in path

    def state_dict(self) -> dict:
        """The SR seed stream's state (recipes are configuration, not state)."""
        return {"sr_seeds": self.seeds.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.seeds.load_state_dict(state["sr_seeds"])

    def describe(self) -> str:
        lines = [f"UFP4Policy: default {self.default.name}, weight cache {self.weight_cache}"]
        lines += [f"  {pattern} -> {r.name}" for pattern, r in self.rules]
        return "\n".join(lines)


def _resolve(recipe: RecipeLike) -> Recipe:
    if isinstance(recipe, Recipe):
        return recipe
    if isinstance(recipe, str):
        return get_recipe(recipe)
    raise TypeError(
        f"a recipe is a preset name (see ufp4_megatron.list_recipes()) or a Recipe, "
        f"got {type(recipe).__name__}"
    )


def _stable_id(text: str) -> int:
    import zlib

    return zlib.crc32(text.encode())

"""Quantizer factories by name: what `--fp4-quantizer-factory ufp4_megatron.te.<name>` resolves.

Megatron-Core builds `CustomRecipe(qfactory=<the object at that dotted path>)` for every layer
it runs under FP4 (megatron/core/fp4_utils.py), and TE calls the factory once per quantizer
slot of a module (transformer_engine/pytorch/quantization.py, CustomRecipeState). The names:

    ufp4_megatron.te.<preset>       ufp4, e2m1, ufp4_int4, nvfp4, mxfp4 (recipe.PRESETS), bf16
    ufp4_megatron.te.<ablation>     ufp4_rht_none, ufp4_no_sr, ... (recipe.ABLATIONS)
    ufp4_megatron.te.factory        the recipe named by the environment at model build:
                                    UFP4_RECIPE = a preset or ablation name, or the path of a
                                    JSON file {"recipe": name, "overrides": {get_recipe keys}}
    factory_path(recipe)            any Recipe (the trainer's, with overrides): registers it in
                                    this process and returns its dotted path

Each name resolves to one object for the life of the process (TE keeps a module's quantizers
while the autocast recipe compares equal, and CustomRecipe compares its qfactory), which
pickles by name (TE pickles the recipe into every module's checkpoint extra state).

TransformerEngine is imported when a factory is called, not here (quantizers.py); the checks
that need no TE (version, recipe, parallel layout) are plain functions (checks.py).
"""

from __future__ import annotations

import hashlib
import json
import os

from ..quant.recipe import ABLATIONS, PRESETS, Recipe, ablation, get_recipe
from .checks import check_recipe

ENV = "UFP4_RECIPE"
# The globals a checkpoint holds for a custom recipe: TE pickles the recipe (a dataclass of
# plain fields) into every TE module's extra state, and a factory pickles as a lookup by name
# (UFP4QuantizerFactory.__reduce__). A checkpoint reader allows these beside TE's built-in
# recipes, and no other callable (train/trust.py, megatron/te_experts.py).
CHECKPOINT_GLOBALS = frozenset(
    {("transformer_engine.common.recipe", "CustomRecipe"), (__name__, "resolve")}
)
_REGISTERED: dict[str, Recipe] = {}
_FACTORIES: dict[str, UFP4QuantizerFactory] = {}


class UFP4QuantizerFactory:
    """A CustomRecipe qfactory for one recipe: role -> TE quantizer (quantizers.py)."""

    def __init__(self, name: str, recipe: Recipe | None):
        self.name = name
        self._recipe = recipe  # None: read from the environment at the first call (`factory`)

    @property
    def recipe(self) -> Recipe:
        return self._recipe if self._recipe is not None else recipe_from_env()

    def __call__(self, role):
        from .quantizers import quantizer_for  # TransformerEngine from here on

        return quantizer_for(self.recipe, role)

    def __reduce__(self):  # pickled by name, resolved again by name
        return resolve, (self.name,)

    def __repr__(self) -> str:
        return f"ufp4_megatron.te.{self.name}"


def resolve(name: str) -> UFP4QuantizerFactory:
    """The factory of `name` (module docstring); one object per name and process."""
    if name in _FACTORIES:
        return _FACTORIES[name]
    if name == "factory":
        recipe = None
    elif name in PRESETS:
        recipe = PRESETS[name]
    elif name in ABLATIONS:
        recipe = ablation(name)
    elif name in _REGISTERED:
        recipe = _REGISTERED[name]
    else:
        raise ValueError(
            f"ufp4_megatron.te has no quantizer factory {name!r}; valid: "
            f"{', '.join([*PRESETS, *ABLATIONS, 'factory'])} (factory: the recipe in ${ENV})"
        )
    if recipe is not None:
        check_recipe(recipe)
    return _FACTORIES.setdefault(name, UFP4QuantizerFactory(name, recipe))


def factory_path(recipe: Recipe) -> str:
    """The dotted path of a factory running `recipe`, for TransformerConfig's
    fp4_quantizer_factory: a preset's or ablation's name when it is one, else a name derived
    from the recipe's value, registered in this process (every rank builds its config)."""
    check_recipe(recipe)
    named = {**PRESETS, **{n: ablation(n) for n in ABLATIONS}}
    name = next((n for n, r in named.items() if r == recipe), None)
    if name is None:
        name = "recipe_" + hashlib.sha1(repr(recipe).encode()).hexdigest()[:12]
        _REGISTERED[name] = recipe
    return f"ufp4_megatron.te.{name}"


def recipe_from_env() -> Recipe:
    value = os.environ.get(ENV, "ufp4")
    if not value.endswith(".json"):
        return _checked(
            PRESETS[value]
            if value in PRESETS
            else ablation(value)
            if value in ABLATIONS
            else _unknown(value)
        )
    try:
        with open(value) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{ENV}={value}: cannot read it as JSON ({e})") from None
    if not isinstance(cfg, dict) or set(cfg) - {"recipe", "overrides"}:
        extra = sorted(set(cfg) - {"recipe", "overrides"}) if isinstance(cfg, dict) else cfg
        raise ValueError(
            f'{ENV}={value}: the TransformerEngine factory takes {{"recipe": name, '
            f'"overrides": {{...}}}}, got {extra!r} (per-module rules and sr_seed belong to '
            "the --spec route: TE's quantizer roles name no module, and SR seeds come from "
            "--seed)"
        )
    return _checked(get_recipe(cfg.get("recipe", "ufp4"), **cfg.get("overrides", {})))


def _unknown(value: str):
    raise ValueError(
        f"{ENV}={value!r} is not a recipe; valid: "
        f"{', '.join([*PRESETS, *ABLATIONS])}, or a .json file"
    )


def _checked(recipe: Recipe) -> Recipe:
    check_recipe(recipe)
    return recipe

"""Counts the parallel linears a Megatron-LM process builds, whatever its layer spec.

Test harness of gpu/megatron_lm.sh and gpu/te_check.sh, put on PYTHONPATH only there (never
imported by the package, never part of Megatron-LM). With UFP4_PROBE_OUT set, a torch
module-registration hook records every submodule that is a Megatron
ColumnParallelLinear/RowParallelLinear (the UFP4 linears are subclasses), with its class and
recipe, and every TransformerEngine linear module (Linear, LayerNormLinear, GroupedLinear,
LayerNormMLP); each torchrun worker appends one JSON line to UFP4_PROBE_OUT when it exits:
    {"rank": 0, "linears": 17, "ufp4": 16, "classes": {...}, "recipes": {"ufp4": 16},
     "te_linears": 0, "te_ufp4": 0, "te_recipes": {}}
A TE linear counts as UFP4 (te_ufp4, te_recipes) when its forward and backward quantizers
include ufp4_megatron.te layout quantizers that quantized at least one tensor each.
"""

import atexit
import json
import os

if os.environ.get("UFP4_PROBE_OUT") and os.environ.get("RANK") is not None:
    import torch

    _BASES = {
        ("megatron.core.tensor_parallel.layers", "ColumnParallelLinear"),
        ("megatron.core.tensor_parallel.layers", "RowParallelLinear"),
    }
    _TE = {
        (f"transformer_engine.pytorch.module.{m}", c)
        for m, c in (
            ("linear", "Linear"),
            ("layernorm_linear", "LayerNormLinear"),
            ("grouped_linear", "GroupedLinear"),
            ("layernorm_mlp", "LayerNormMLP"),
        )
    }
    _seen = {}
    _te = {}  # id -> module, kept alive to the end: its quantizers are read at exit

    def _record(module, name, submodule):
        if submodule is None or id(submodule) in _seen or id(submodule) in _te:
            return None
        mro = [(c.__module__, c.__name__) for c in type(submodule).__mro__]
        if any(key in _TE for key in mro):
            _te[id(submodule)] = submodule
        elif any(key in _BASES for key in mro):
            binding = getattr(submodule, "ufp4", None)
            _seen[id(submodule)] = (
                type(submodule).__name__,
                binding.recipe.name if binding is not None else None,
            )
        return None

    torch.nn.modules.module.register_module_module_registration_hook(_record)

    @atexit.register
    def _dump():
        classes, recipes = {}, {}
        for cls, recipe in _seen.values():
            classes[cls] = classes.get(cls, 0) + 1
            if recipe is not None:
                recipes[recipe] = recipes.get(recipe, 0) + 1
        te_recipes = {}
        for te_module in _te.values():
            recipe = _te_recipe(te_module)
            if recipe is not None:
                te_recipes[recipe] = te_recipes.get(recipe, 0) + 1
        line = {
            "rank": int(os.environ["RANK"]),
            "linears": len(_seen),
            "ufp4": sum(recipes.values()),
            "classes": classes,
            "recipes": recipes,
            "te_linears": len(_te),
            "te_ufp4": sum(te_recipes.values()),
            "te_recipes": te_recipes,
        }
        with open(os.environ["UFP4_PROBE_OUT"], "a") as f:
            f.write(json.dumps(line) + "\n")

    def _te_recipe(module):
        """The recipe of a TE linear's ufp4_megatron.te quantizers if they quantized in both
        forward and backward, else None (never quantized, or BF16 quantizers)."""
        found = {}
        for key in ("scaling_fwd", "scaling_bwd"):
            for q in getattr(module, "quantizers", {}).get(key, []) or []:
                for sub in (
                    getattr(q, "rowwise_quantizer", None),
                    getattr(q, "columnwise_quantizer", None),
                ):
                    if type(sub).__name__ == "UFP4LayoutQuantizer" and sub.stats.calls:
                        found[key] = sub.plan.recipe.name
        return found.get("scaling_fwd") if len(found) == 2 else None

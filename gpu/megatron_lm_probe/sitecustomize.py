"""Counts the parallel linears a Megatron-LM process builds, whatever its layer spec.

Test harness of gpu/megatron_lm.sh, put on PYTHONPATH only there (never imported by the
package, never part of Megatron-LM). With UFP4_PROBE_OUT set, a torch module-registration hook
records every submodule that is a Megatron ColumnParallelLinear/RowParallelLinear (the UFP4
linears are subclasses), with its class and recipe, and each torchrun worker appends one JSON
line to UFP4_PROBE_OUT when it exits:
    {"rank": 0, "linears": 17, "ufp4": 16, "classes": {...}, "recipes": {"ufp4": 16}}
"""
import atexit
import json
import os

if os.environ.get("UFP4_PROBE_OUT") and os.environ.get("RANK") is not None:
    import torch

    _BASES = {("megatron.core.tensor_parallel.layers", "ColumnParallelLinear"),
              ("megatron.core.tensor_parallel.layers", "RowParallelLinear")}
    _seen = {}

    def _record(module, name, submodule):
        if submodule is None or id(submodule) in _seen:
            return None
        if any((c.__module__, c.__name__) in _BASES for c in type(submodule).__mro__):
            binding = getattr(submodule, "ufp4", None)
            _seen[id(submodule)] = (type(submodule).__name__,
                                    binding.recipe.name if binding is not None else None)
        return None

    torch.nn.modules.module.register_module_module_registration_hook(_record)

    @atexit.register
    def _dump():
        classes, recipes = {}, {}
        for cls, recipe in _seen.values():
            classes[cls] = classes.get(cls, 0) + 1
            if recipe is not None:
                recipes[recipe] = recipes.get(recipe, 0) + 1
        line = {"rank": int(os.environ["RANK"]), "linears": len(_seen),
                "ufp4": sum(recipes.values()), "classes": classes, "recipes": recipes}
        with open(os.environ["UFP4_PROBE_OUT"], "a") as f:
            f.write(json.dumps(line) + "\n")

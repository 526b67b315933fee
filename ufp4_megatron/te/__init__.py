"""UFP4 inside TransformerEngine models: quantizer factories for Megatron-Core's custom FP4 recipe.

    pretrain_gpt.py ... --transformer-impl transformer_engine \\
        --fp4-format e2m1 --fp4-recipe custom --fp4-quantizer-factory ufp4_megatron.te.ufp4

Megatron-Core wraps each transformer layer in TE's autocast with CustomRecipe(qfactory=...);
TE's Linear, LayerNormLinear and GroupedLinear then ask the factory for their input, weight and
grad_output quantizers and run their GEMMs on what those hold: the recipe's fake-quantized
operands, the same values as the local route's (quant/ops.py), bit for bit (layouts.py, the data
flow; quantizers.py, the TE classes; seeds.py, the SR stream). `--fp4-format` only switches
Megatron's FP4 path on; the grid, blocks, scales, RHT and SR are the recipe's.

Factories (factories.py): `ufp4_megatron.te.<name>` for every preset (ufp4, e2m1, ufp4_int4,
nvfp4, mxfp4, bf16) and ablation (ufp4_rht_none, ufp4_no_sr, ...); `ufp4_megatron.te.factory`
reads UFP4_RECIPE (a name, or a JSON file {"recipe": ..., "overrides": {...}});
`factory_path(recipe)` gives the dotted path of any Recipe. An unknown name raises ValueError
listing the valid ones (Megatron resolves the path with getattr, which would hide an
AttributeError behind a generic message); names starting with "_", and the names of this
package's modules, raise AttributeError.

TransformerEngine is imported only when a factory is called: this package imports without it,
and nothing else in ufp4_megatron imports it.
"""

import importlib.util

from .checks import TE_MIN_VERSION
from .factories import ENV, UFP4QuantizerFactory, factory_path, resolve

__all__ = ["ENV", "TE_MIN_VERSION", "UFP4QuantizerFactory", "factory_path", "resolve"]


def __getattr__(name: str):
    # privates, and this package's modules not imported yet (`from ufp4_megatron.te import
    # seeds` asks here first), are AttributeErrors: Python then imports the module
    if name.startswith("_") or importlib.util.find_spec(f"{__name__}.{name}") is not None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return resolve(name)

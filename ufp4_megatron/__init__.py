"""ufp4-megatron: UFP4 uniform-grid 4-bit training recipes for Megatron-Core.

Public API (imports without Megatron):
    quantize(x, fmt, *, block=16, scale="fp32", rounding="rtne", dim=-1, rht=None, seed=0)
    RHT(size=16, seed=0)                  .rotate(x, dim), .inverse(x, dim)
    Recipe, OperandSpec, GemmSpec         frozen recipe values
    get_recipe(name, **overrides), list_recipes()
    quantized_linear(x, weight, bias, recipe)
    diagnostics                           alpha, SQNR, dSQNR, shrinkage bias, bucket ratio
"""

from .numerics.grids import GRIDS, Grid, get_grid
from .numerics.hadamard import RHT
from .quant.fake_quant import quantize
from .quant.ops import quantized_linear
from .quant.recipe import GemmSpec, OperandSpec, Recipe, get_recipe, list_recipes

__all__ = [
    "quantize",
    "RHT",
    "Recipe",
    "OperandSpec",
    "GemmSpec",
    "get_recipe",
    "list_recipes",
    "quantized_linear",
    "diagnostics",
    "Grid",
    "GRIDS",
    "get_grid",
]
__version__ = "0.1.0"


def __getattr__(name):  # `ufp4_megatron.diagnostics` (quant/diagnostics.py) without importing
    if name == "diagnostics":  # it eagerly: it is also a `python -m` entry point, which must
        import importlib  # not be pre-imported

        return importlib.import_module(".quant.diagnostics", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

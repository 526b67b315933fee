"""The core: what a recipe is and how a quantized linear computes with it.

    recipe.py        OperandSpec, GemmSpec (fprop / dgrad / wgrad), Recipe, presets, ablations
    fake_quant.py    quantize() and the backend dispatch (the kernels or the reference)
    ops.py           the three GEMMs of a linear layer and its autograd function
    grouped_ops.py   the same GEMMs for all experts of a grouped layer at once
    weight_cache.py  a weight's RTNE operands, kept until the weight changes
    diagnostics.py   alpha, SQNR, dSQNR, shrinkage bias, bucket ratio (`ufp4-diagnostics`)

Everything here imports without Megatron, Hydra, W&B or Triton. The package's public API
(`ufp4_megatron/__init__.py`) re-exports the user-facing names; this file imports nothing, so
that `python -m ufp4_megatron.quant.diagnostics` runs its module once.
"""

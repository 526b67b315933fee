"""Triton kernels, bit-identical twins of numerics/ (one file per op, named after its twin).

`supports(x, grid, **kw)` says whether the kernel path reproduces the reference for these
arguments; `quantize_view` is the twin of numerics.quantize.quantize_view, `quantize_dual`
writes the row-wise and column-wise layouts of one tensor from one read.
"""
from .quantize_triton import quantize_dual, quantize_view, supports

__all__ = ["supports", "quantize_view", "quantize_dual"]

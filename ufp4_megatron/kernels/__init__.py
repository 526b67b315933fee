"""Triton kernels, bit-identical twins of numerics/ (one file per op, named after its twin).

`unsupported(x, grid, **kw)` says what the kernel path does not reproduce for these
arguments (None: all of it; `supports` is its boolean); `quantize_view` is the twin of
numerics.quantize.quantize_view, `quantize_pair` quantizes the two operands of one GEMM in one
launch where it can, `quantize_dual` writes the row-wise and column-wise layouts of one tensor
from one read. Host side (plans, launches): launch.py.
"""
from .launch import (INTERPRETED, check_device, quantize_dual, quantize_pair, quantize_view,
                     supports, unsupported)

__all__ = ["supports", "unsupported", "check_device", "quantize_view", "quantize_pair",
           "quantize_dual", "INTERPRETED"]

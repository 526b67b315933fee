"""Triton kernels, bit-identical twins of numerics/ (one file per op, named after its twin).

`unsupported(x, grid, **kw)` says what the kernel path does not reproduce for these
arguments (None: all of it; `supports` is its boolean); `quantize_view` is the twin of
numerics.quantize.quantize_view, `quantize_pair` quantizes the two operands of one GEMM in one
launch where it can. Modules, each importing only those above it:
  fp32_triton, philox_triton, hadamard_triton, scaling_triton, rounding_triton,
  segments_triton    building blocks (the twins of numerics/, the shared fp32 arithmetic);
  pipeline_triton    the QDQ steps both kernel families share, in the reference's order;
  quantize_triton    the generic tile kernel; quantize16_triton the 16-tensor kernels;
  launch             kernel[grid](...) with Triton's per-call binding cached per
                     specialization (on by default; UFP4_CACHED_LAUNCH=0 turns it off);
  dispatch           host side: what the kernels cover, cached launch plans, the launches.
"""

from .dispatch import INTERPRETED, check_device, quantize_pair, quantize_view, supports, unsupported

__all__ = [
    "supports",
    "unsupported",
    "check_device",
    "quantize_view",
    "quantize_pair",
    "INTERPRETED",
]

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
  keys_triton        an SR call's key table drawn on the device (the draw counter there);
  dispatch           host side: what the kernels cover, cached launch plans, the launches,
                     `prepare`: one or two operands' launch prepared once per shape,
                     `tensor_amax`: a view's e4m3 tensor amax (one per segment with
                     segments), and `tensor_amax_pair`: an operand's two e4m3 tensor
                     amaxes in one read.
"""

from .dispatch import (
    INTERPRETED,
    PreparedQDQ,
    check_device,
    is_device_key,
    prepare,
    quantize_pair,
    quantize_view,
    supports,
    tensor_amax,
    tensor_amax_pair,
    unsupported,
)

__all__ = [
    "supports",
    "unsupported",
    "check_device",
    "quantize_view",
    "quantize_pair",
    "prepare",
    "PreparedQDQ",
    "is_device_key",
    "tensor_amax",
    "tensor_amax_pair",
    "INTERPRETED",
]

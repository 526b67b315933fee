"""`quantize`: the public fake-quantization entry point, and the backend dispatch.

CUDA tensors go to the fused Triton kernels (bit-identical to the reference in numerics/);
CPU tensors, or backend="torch", run the reference.
"""
from __future__ import annotations

import torch

from .numerics.hadamard import as_rht
from .numerics.quantize import quantize_view as _reference_view
from .recipe import check_operand_fields

BACKENDS = ("auto", "torch", "triton")


def quantize_view(x: torch.Tensor, grid, *, backend: str = "auto", **kw) -> torch.Tensor:
    """Dispatching twin of numerics.quantize.quantize_view (same arguments)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
    if backend == "triton" or (backend == "auto" and x.is_cuda):
        from . import kernels  # lazy: triton is only needed on the kernel path

        if backend == "triton" or kernels.supports(x, grid, **kw):
            return kernels.quantize_view(x, grid, **kw)
    return _reference_view(x, grid, **kw)


def quantize(x: torch.Tensor, fmt, *, block: int = 16, scale: str = "fp32",
             rounding: str = "rtne", dim: int = -1, rht=None, seed: int = 0,
             block_2d: bool = False, origin: tuple[int, int] = (0, 0),
             backend: str = "auto") -> torch.Tensor:
    """Fake-quantize `x` along `dim` in 1 x `block` blocks; same shape and dtype as x.

    fmt:      grid name ("e2m1", "e1m2", "int4", "int4_asym") or a codebook tuple.
    scale:    "fp32" | "e4m3" | "e8m0".   rounding: "rtne" | "sr".
    rht:      None, a size (16, 32, 64, 128) or an RHT: values are returned in the rotated
              domain (apply `RHT.inverse` to compare with x).
    seed, origin: stochastic-rounding key; origin = (row, column) of x's first element in a
              larger tensor's 2D view (rows: all other dims flattened; columns: `dim`), so a
              shard reproduces the full tensor's bits.
    block_2d: block x block tiles over (rows, dim) instead of 1 x block.
    Sizes along dim that are not a multiple of the block are zero-padded internally.
    """
    check_operand_fields(fmt, block, scale, rounding)
    if not (x.is_floating_point()):
        raise TypeError(f"quantize takes a floating-point tensor, got {x.dtype}")
    r = as_rht(rht)
    if x.dim() == 0:
        raise ValueError("quantize needs at least one dimension to block along")
    dim = dim % x.dim()
    if r is not None and x.shape[dim] % r.size:
        raise ValueError(f"with rht={r.size} the size along dim {dim} ({x.shape[dim]}) must be "
                         f"a multiple of {r.size}: the result lives in the rotated domain and "
                         "cannot be unpadded; pad x or pass rht=None")
    if x.numel() == 0:
        return x.clone()
    moved = x.movedim(dim, -1)
    view = moved.reshape(-1, moved.shape[-1])
    q = quantize_view(view, fmt, block=block, block_2d=block_2d, scale=scale,
                      rounding=rounding, rht=r, seed=seed, origin=origin, backend=backend)
    return q.reshape(moved.shape).movedim(-1, dim)

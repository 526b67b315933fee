"""`quantize`: the public fake-quantization entry point, and the backend dispatch.

CUDA tensors go to the fused Triton kernels (bit-identical to the reference in numerics/)
where they cover the arguments, the reference otherwise; CPU tensors, or backend="torch", run
the reference; backend="triton" runs the kernels or says why it cannot. An operand's format
travels as one OperandFormat (a recipe operand's `OperandSpec.format(rht)`) from here to the
kernels' plan cache; only the reference takes it apart, into its keywords.
"""

from __future__ import annotations

import torch

from ..numerics.checks import check_bool, check_dim, check_float_tensor, check_int, check_seed
from ..numerics.hadamard import as_rht
from ..numerics.quantize import OperandFormat, format_of, output_dtype
from ..numerics.quantize import quantize_view as _reference_view
from .recipe import check_operand_fields

BACKENDS = ("auto", "torch", "triton")


def _kernels():
    from .. import kernels  # lazy: triton is only needed on the kernel path

    return kernels


def _reference(x: torch.Tensor, fmt: OperandFormat, call: dict) -> torch.Tensor:
    """numerics.quantize.quantize_view; an SR key in device memory (a 1-element int64 tensor
    of a key table) is read back to the host first, which the reference needs (on CUDA a
    synchronisation: only the reference path pays it)."""
    seed = call.get("seed")
    if isinstance(seed, torch.Tensor):
        call = dict(call, seed=int(seed.item()))
    return _reference_view(x, fmt.grid, **fmt.options(), **call)


def quantize_view(
    x: torch.Tensor,
    grid=None,
    *,
    fmt: OperandFormat | None = None,
    backend: str = "auto",
    **kw,
) -> torch.Tensor:
    """Dispatching twin of numerics.quantize.quantize_view: the format as fmt=, or as the
    reference takes it (a grid and its keywords); the call's own keywords (seed, origin,
    segments, tensor_amax, out_dtype) as the reference's, seed also an SR key in device
    memory (a 1-element int64 tensor)."""
    fmt, call = format_of(grid, fmt, kw)
    if backend == "auto":
        if x.is_cuda:  # the kernels where they cover the arguments (None: they do not)
            q = _kernels().quantize_view(x, fmt=fmt, strict=False, **call)
            if q is not None:
                return q
        return _reference(x, fmt, call)
    if backend == "torch":
        return _reference(x, fmt, call)
    if backend == "triton":  # the kernels, or a one-line error saying what they lack
        if x.numel() == 0:  # nothing to launch: the reference's empty result is exact
            return _reference(x, fmt, call)
        return _kernels().quantize_view(x, fmt=fmt, **call)
    raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")


def quantize_pair(
    a: torch.Tensor, a_kw: dict, b: torch.Tensor, b_kw: dict, *, backend: str = "auto"
):
    """(quantize_view(a, **a_kw), quantize_view(b, **b_kw)), each format in its kw dict
    (fmt=, or grid and its keywords): the two operands of one GEMM, in one kernel launch
    where the kernels cover both."""
    if (
        a.numel()
        and b.numel()
        and (backend == "triton" or (backend == "auto" and a.is_cuda and b.is_cuda))
    ):
        pair = _kernels().quantize_pair(a, a_kw, b, b_kw, strict=backend == "triton")
        if pair is not None:
            return pair
    return quantize_view(a, backend=backend, **a_kw), quantize_view(b, backend=backend, **b_kw)


def quantize(
    x: torch.Tensor,
    fmt,
    *,
    block: int = 16,
    scale: str = "fp32",
    rounding: str = "rtne",
    dim: int = -1,
    rht=None,
    seed: int = 0,
    block_2d: bool = False,
    origin: tuple[int, int] = (0, 0),
    backend: str = "auto",
) -> torch.Tensor:
    """Fake-quantize `x` along `dim` in 1 x `block` blocks; same shape as x, same dtype
    except that rotated float16 comes back in float32 (a rotated block can exceed fp16's
    range: 16 values of 16400 rotate to 65600).

    fmt:      grid name ("e2m1", "e1m2", "int4", "int4_asym") or a codebook tuple.
    scale:    "fp32" | "e4m3" | "e8m0".   rounding: "rtne" | "sr".
    rht:      None, a size (16, 32, 64, 128) or an RHT: values are returned in the rotated
              domain (apply `RHT.inverse` to compare with x).
    seed, origin: stochastic-rounding key; seed an int in [0, 2^63); origin = (row, column)
              of x's first element in a larger tensor's 2D view (rows: all other dims
              flattened; columns: `dim`), so a shard reproduces the full tensor's bits.
    block_2d: block x block tiles over (rows, dim) instead of 1 x block.
    backend:  "auto" (kernels for CUDA tensors where they apply), "torch", "triton".
    Sizes along dim that are not a multiple of the block are zero-padded internally. NaN or
    Inf makes its own block NaN, in every scale mode (e4m3's tensor scale ignores it).

    Gradients (x.requires_grad): the straight-through estimator, as quantization-aware
    training uses it (torchao's fake quantizers, TransformerEngine's QAT): the rounding and
    the block scales count as the identity, so the gradient of the result with respect to x is
    the identity without rht, and with rht the transpose of the rotation (`RHT.inverse`: the
    result is x rotated, then rounded). The rounding is piecewise constant, so differentiating
    it as computed would give zero everywhere but at each block's amax (through its scale).
    """
    check_float_tensor(x, "x", "quantize")
    check_operand_fields(fmt, block, scale, rounding)
    check_bool(block_2d, "block_2d")
    seed = check_seed(seed)
    origin = _check_origin(origin, rounding)
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
    dim = check_dim(dim, x.dim())
    r = as_rht(rht)
    if r is not None and x.shape[dim] % r.size:
        raise ValueError(
            f"with rht={r.size} the size along dim {dim} ({x.shape[dim]}) must be "
            f"a multiple of {r.size}: the result lives in the rotated domain and "
            "cannot be unpadded; pad x or pass rht=None"
        )
    if x.numel() == 0:
        return x.to(output_dtype(x.dtype, r), copy=True)
    operand = OperandFormat(
        fmt, block=block, block_2d=block_2d, scale=scale, rounding=rounding, rht=r
    )
    call = dict(seed=seed, origin=origin, backend=backend)
    if x.requires_grad and torch.is_grad_enabled():
        return _StraightThrough.apply(x, operand, dim, call)
    return _quantize_along(x, operand, dim, call)


def _quantize_along(x: torch.Tensor, fmt: OperandFormat, dim: int, call: dict) -> torch.Tensor:
    moved = x if dim == x.dim() - 1 else x.movedim(dim, -1)
    q = quantize_view(moved.reshape(-1, moved.shape[-1]), fmt=fmt, **call)
    q = q.reshape(moved.shape)
    return q if moved is x else q.movedim(-1, dim)


class _StraightThrough(torch.autograd.Function):
    """quantize() forward; backward: the identity, or RHT.inverse along dim with rht."""

    @staticmethod
    def forward(ctx, x, fmt, dim, call):
        ctx.dim, ctx.rht, ctx.dtype = dim, fmt.rht, x.dtype
        return _quantize_along(x.detach(), fmt, dim, call)

    @staticmethod
    def backward(ctx, grad):
        if ctx.rht is not None:
            grad = ctx.rht.inverse(grad, ctx.dim)
        return grad.to(ctx.dtype), None, None, None


def _check_origin(origin, rounding: str) -> tuple[int, int]:
    if not isinstance(origin, (tuple, list)) or len(origin) != 2:
        raise ValueError(f"origin must be a (row, column) pair of ints >= 0, got {origin!r}")
    r0 = check_int(origin[0], "origin row", 0)
    c0 = check_int(origin[1], "origin column", 0)
    if rounding == "sr" and c0 % 4:
        raise ValueError(
            f"with rounding='sr' the origin column must be a multiple of 4 (one "
            f"Philox call serves 4 neighbours), got {c0}"
        )
    return r0, c0

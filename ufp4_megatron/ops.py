"""The three GEMMs of a quantized linear layer, and its autograd function.

    fprop  Y  = X  W^T   x [M,K] row-wise,  w [N,K] row-wise      reduction K
    dgrad  dX = dY W     dy [M,N] row-wise, w [N,K] column-wise   reduction N
    wgrad  dW = dY^T X   dy [M,N] column-wise, x [M,K] column-wise reduction M

Each operand is fake-quantized from the high-precision tensor along the GEMM's reduction
dim (rotated first when the GEMM has an RHT; the same rotation on both operands cancels in
the product), then the product runs in the operands' dtype with fp32 accumulation. Both
operands are zero-padded along the reduction dim to a common multiple of block and RHT
size; zeros add nothing to the product. Backward quantizes from the tensors BF16 saves
anyway (x, w): no extra copies are kept for backward.

Origins are each operand's (row, column) offset in the full tensor, natural layout (dy:
tokens x N, x: tokens x K, w: N x K): a tensor-parallel shard passes its offset and gets the
stochastic-rounding bits of the unsharded tensor.
"""
from __future__ import annotations

import functools

import torch

from .fake_quant import quantize_view
from .numerics.hadamard import RHT
from .numerics.philox import mix_seed
from .numerics.quantize import padded_length
from .recipe import GEMMS, GemmSpec, OperandSpec, Recipe

_GEMM_ID = {g: i for i, g in enumerate(GEMMS)}


@functools.lru_cache(maxsize=32)
def _rht(size: int, seed: int) -> RHT:
    # An RHT is a pure function of (size, seed); building one costs ~20 us of host time
    # per GEMM, which shows in host-bound layers (docs/performance.md).
    return RHT(size, seed)


def _prepare(t: torch.Tensor, spec: OperandSpec | None, *, along_rows: bool, length: int,
             rht: RHT | None, seed: int, origin: tuple[int, int], dtype: torch.dtype,
             backend: str) -> torch.Tensor:
    """Operand t quantized along its columns (along_rows=False) or rows, padded to `length`
    along that dim, returned in t's natural orientation and `dtype`."""
    view = t.t() if along_rows else t
    view_origin = (origin[1], origin[0]) if along_rows else origin
    if spec is None:  # high precision, but still rotated so the RHT cancels
        out = view.to(torch.float32)
        if length != view.shape[1]:
            out = torch.nn.functional.pad(out, (0, length - view.shape[1]))
        if rht is not None:
            out = rht.rotate_fp32_lastdim(out)
        out = out.to(dtype)
    else:
        out = quantize_view(view, spec.grid, block=spec.block, block_2d=spec.block_2d,
                            scale=spec.scale, rounding=spec.rounding, rht=rht, seed=seed,
                            origin=view_origin, keep_padding=True, out_dtype=dtype,
                            backend=backend)
        if out.shape[1] != length:  # the other operand needed a longer padding unit
            out = torch.nn.functional.pad(out, (0, length - out.shape[1]))
    return out.t() if along_rows else out


def _gemm_operands(gemm: str, spec: GemmSpec, a, b, *, a_rows: bool, b_rows: bool,
                   reduction: int, recipe: Recipe, seed: int, a_origin, b_origin, backend):
    rht = _rht(spec.rht, recipe.rht_seed) if spec.rht else None
    length = max(padded_length(reduction, op.block, rht) if op else
                 padded_length(reduction, 1, rht) for op in (spec.a, spec.b))
    gid = _GEMM_ID[gemm]
    dtype = a.dtype
    qa = _prepare(a, spec.a, along_rows=a_rows, length=length, rht=rht,
                  seed=mix_seed(seed, gid, 0), origin=a_origin, dtype=dtype, backend=backend)
    qb = _prepare(b, spec.b, along_rows=b_rows, length=length, rht=rht,
                  seed=mix_seed(seed, gid, 1), origin=b_origin, dtype=dtype, backend=backend)
    return qa, qb


def fprop(x: torch.Tensor, w: torch.Tensor, recipe: Recipe, *, seed: int = 0,
          x_origin=(0, 0), w_origin=(0, 0), backend: str = "auto") -> torch.Tensor:
    """Y = Q(X) Q(W)^T: x [M, K], w [N, K] -> [M, N]."""
    w = w.to(x.dtype)
    if recipe.fprop is None:
        return x @ w.t()
    qx, qw = _gemm_operands("fprop", recipe.fprop, x, w, a_rows=False, b_rows=False,
                            reduction=x.shape[1], recipe=recipe, seed=seed,
                            a_origin=x_origin, b_origin=w_origin, backend=backend)
    return qx @ qw.t()


def dgrad(dy: torch.Tensor, w: torch.Tensor, recipe: Recipe, *, seed: int = 0,
          dy_origin=(0, 0), w_origin=(0, 0), backend: str = "auto") -> torch.Tensor:
    """dX = Q(dY) Q(W): dy [M, N], w [N, K] -> [M, K]; W quantized along N (its columns)."""
    w = w.to(dy.dtype)
    if recipe.dgrad is None:
        return dy @ w
    qdy, qw = _gemm_operands("dgrad", recipe.dgrad, dy, w, a_rows=False, b_rows=True,
                             reduction=dy.shape[1], recipe=recipe, seed=seed,
                             a_origin=dy_origin, b_origin=w_origin, backend=backend)
    return qdy @ qw


def wgrad(dy: torch.Tensor, x: torch.Tensor, recipe: Recipe, *, seed: int = 0,
          dy_origin=(0, 0), x_origin=(0, 0), backend: str = "auto") -> torch.Tensor:
    """dW = Q(dY)^T Q(X): dy [M, N], x [M, K] -> [N, K]; both quantized along tokens M."""
    x = x.to(dy.dtype)
    if recipe.wgrad is None:
        return dy.t() @ x
    qdy, qx = _gemm_operands("wgrad", recipe.wgrad, dy, x, a_rows=True, b_rows=True,
                             reduction=dy.shape[0], recipe=recipe, seed=seed,
                             a_origin=dy_origin, b_origin=x_origin, backend=backend)
    return qdy.t() @ qx


class _QuantizedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, recipe: Recipe, seed: int, backend: str):
        x2d = x.reshape(-1, x.shape[-1])
        y = fprop(x2d, weight, recipe, seed=seed, backend=backend)
        if bias is not None:
            y = y + bias.to(y.dtype)
        ctx.save_for_backward(x, weight)
        ctx.recipe, ctx.seed, ctx.backend = recipe, seed, backend
        ctx.has_bias = bias is not None
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dy2d = dy.reshape(-1, dy.shape[-1]).to(x.dtype)
        x2d = x.reshape(-1, x.shape[-1])
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = dgrad(dy2d, weight, ctx.recipe, seed=ctx.seed, backend=ctx.backend)
            dx = dx.reshape(x.shape)
        if ctx.needs_input_grad[1]:
            dw = wgrad(dy2d, x2d, ctx.recipe, seed=ctx.seed, backend=ctx.backend)
            dw = dw.to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2d.sum(0)
        return dx, dw, db, None, None, None


def quantized_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     recipe: Recipe, *, seed: int | None = None,
                     backend: str = "auto") -> torch.Tensor:
    """y = x W^T + b with the recipe's fake-quantized GEMMs in forward and backward.

    x: [..., K]; weight: [N, K]; bias: [N] or None. seed keys stochastic rounding; None
    draws one from torch's default generator when (and only when) the recipe uses SR, so
    runs without SR consume no random numbers.
    """
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a Recipe (see get_recipe), got {type(recipe).__name__}")
    if x.shape[-1] != weight.shape[-1]:
        raise ValueError(f"x has {x.shape[-1]} features but weight is {tuple(weight.shape)} "
                         "([out_features, in_features])")
    if seed is None:
        seed = int(torch.randint(0, 2**62, ()).item()) if uses_sr(recipe) else 0
    return _QuantizedLinear.apply(x, weight, bias, recipe, seed, backend)


def uses_sr(recipe: Recipe) -> bool:
    return any(op is not None and op.rounding == "sr"
               for g in GEMMS if getattr(recipe, g) is not None
               for op in (getattr(recipe, g).a, getattr(recipe, g).b))

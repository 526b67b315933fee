"""The three GEMMs of a quantized linear layer, and its autograd function.

    fprop  Y  = X  W^T   x [M,K] row-wise,  w [N,K] row-wise      reduction K
    dgrad  dX = dY W     dy [M,N] row-wise, w [N,K] column-wise   reduction N
    wgrad  dW = dY^T X   dy [M,N] column-wise, x [M,K] column-wise reduction M

Each operand is fake-quantized from the high-precision tensor along the GEMM's reduction
dim (rotated first when the GEMM has an RHT; the same rotation on both operands cancels in
the product), then the product runs in the operands' dtype with fp32 accumulation (float16
with an RHT: operands in float32, a rotated block can exceed fp16's range, and the product
cast to float16 once). Both operands are zero-padded along the reduction dim to a common
multiple of block and RHT size; zeros add nothing to the product. Which operand is reduced
along which dim, and how each is quantized, is the recipe's (recipe.reduction_dim,
recipe.operand): an operand's OperandSpec goes whole to fake_quant.quantize_operand(_pair),
which runs both of a GEMM in one kernel launch where the kernels cover them. Backward
quantizes from the tensors BF16 saves anyway (x, w): no extra copies are kept for backward.

Origins are each operand's (row, column) offset in the full tensor, natural layout (dy:
tokens x N, x: tokens x K, w: N x K): a tensor-parallel shard passes its offset and gets the
stochastic-rounding bits of the unsharded tensor.
"""

from __future__ import annotations

import functools

import torch

from .fake_quant import BACKENDS, quantize_operand, quantize_operand_pair
from .numerics.checks import check_float_tensor, check_seed
from .numerics.hadamard import RHT, get_rht, rotated_dtype
from .numerics.philox import mix_seed
from .numerics.quantize import padded_length
from .recipe import GEMMS, OPERANDS, GemmSpec, Recipe, reduction_dim

_GEMM_ID = {g: i for i, g in enumerate(GEMMS)}
# per GEMM, whether each operand (OPERANDS order) is reduced along its rows, so quantized as
# its transpose: read once from the recipe's table
_ALONG_ROWS = {g: tuple(reduction_dim(g, name) == 0 for name in OPERANDS[g]) for g in GEMMS}


@functools.lru_cache(maxsize=256)
def _gemm_plan(spec: GemmSpec, gemm: str, rht_seed: int, reduction: int, dtype: torch.dtype):
    """What one GEMM's operand preparation needs that depends only on the recipe, the
    reduction length and the dtype, built once (host time shows in small layers): the RHT,
    the common padded length and the operands' dtype (fp32 for rotated fp16: a rotated block
    can exceed fp16's range)."""
    rht = get_rht(spec.rht, rht_seed) if spec.rht else None
    length = max(
        padded_length(reduction, op.block if op else 1, rht)
        for op in (getattr(spec, name) for name in OPERANDS[gemm])
    )
    return rht, length, rotated_dtype(dtype) if rht is not None else dtype


def _rotated(view: torch.Tensor, length: int, rht: RHT | None, dtype) -> torch.Tensor:
    """An operand left in high precision, padded to `length` and still rotated (so the RHT
    cancels in the product), in `dtype`."""
    out = view.to(torch.float32)
    if length != view.shape[1]:
        out = torch.nn.functional.pad(out, (0, length - view.shape[1]))
    if rht is not None:
        out = rht.rotate_fp32_lastdim(out)
    return out.to(dtype)


def _pad(q: torch.Tensor, length: int) -> torch.Tensor:
    if q.shape[1] != length:  # the other operand needed a longer padding unit
        q = torch.nn.functional.pad(q, (0, length - q.shape[1]))
    return q


def _gemm_operands(gemm: str, recipe: Recipe, tensors, origins, *, seed: int, backend: str):
    """`gemm`'s two operands (natural layouts, OPERANDS order) quantized along the GEMM's
    reduction dim as the recipe says, padded to a common length along it, in natural
    orientation. An operand reduced along its rows is quantized as its transpose (origin
    swapped); the two quantizations run in one kernel launch where the kernels cover both."""
    spec: GemmSpec = getattr(recipe, gemm)
    names, along_rows = OPERANDS[gemm], _ALONG_ROWS[gemm]
    first = tensors[0]
    reduction = first.shape[0 if along_rows[0] else 1]
    rht, length, dtype = _gemm_plan(spec, gemm, recipe.rht_seed, reduction, first.dtype)
    gid = _GEMM_ID[gemm]
    views, keys, ops = [], [], []
    for i, (name, t, origin, rows) in enumerate(zip(names, tensors, origins, along_rows)):
        op = getattr(spec, name)
        views.append(t.t() if rows else t)
        # seeds only matter to SR (RTNE results do not depend on them)
        keys.append(
            dict(
                origin=(origin[1], origin[0]) if rows else origin,
                seed=mix_seed(seed, gid, i) if op is not None and op.rounding == "sr" else 0,
            )
        )
        ops.append(op)
    if ops[0] is not None and ops[1] is not None:
        q = quantize_operand_pair(views, ops, keys, rht=rht, out_dtype=dtype, backend=backend)
    else:
        q = [
            quantize_operand(v, op, rht=rht, out_dtype=dtype, backend=backend, **key)
            if op is not None
            else _rotated(v, length, rht, dtype)
            for v, op, key in zip(views, ops, keys)
        ]
    return tuple(
        _pad(qi, length).t() if rows else _pad(qi, length) for qi, rows in zip(q, along_rows)
    )


def fprop(
    x: torch.Tensor,
    w: torch.Tensor,
    recipe: Recipe,
    *,
    seed: int = 0,
    x_origin=(0, 0),
    w_origin=(0, 0),
    backend: str = "auto",
) -> torch.Tensor:
    """Y = Q(X) Q(W)^T: x [M, K], w [N, K] -> [M, N]."""
    w = w.to(x.dtype)
    if recipe.fprop is None:
        return x @ w.t()
    qx, qw = _gemm_operands(
        "fprop", recipe, (x, w), (x_origin, w_origin), seed=seed, backend=backend
    )
    return (qx @ qw.t()).to(x.dtype)


def dgrad(
    dy: torch.Tensor,
    w: torch.Tensor,
    recipe: Recipe,
    *,
    seed: int = 0,
    dy_origin=(0, 0),
    w_origin=(0, 0),
    backend: str = "auto",
) -> torch.Tensor:
    """dX = Q(dY) Q(W): dy [M, N], w [N, K] -> [M, K]; W quantized along N (its columns)."""
    w = w.to(dy.dtype)
    if recipe.dgrad is None:
        return dy @ w
    qdy, qw = _gemm_operands(
        "dgrad", recipe, (dy, w), (dy_origin, w_origin), seed=seed, backend=backend
    )
    return (qdy @ qw).to(dy.dtype)


def wgrad(
    dy: torch.Tensor,
    x: torch.Tensor,
    recipe: Recipe,
    *,
    seed: int = 0,
    dy_origin=(0, 0),
    x_origin=(0, 0),
    backend: str = "auto",
) -> torch.Tensor:
    """dW = Q(dY)^T Q(X): dy [M, N], x [M, K] -> [N, K]; both quantized along tokens M."""
    x = x.to(dy.dtype)
    if recipe.wgrad is None:
        return dy.t() @ x
    qdy, qx = _gemm_operands(
        "wgrad", recipe, (dy, x), (dy_origin, x_origin), seed=seed, backend=backend
    )
    return (qdy.t() @ qx).to(dy.dtype)


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


def quantized_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    recipe: Recipe,
    *,
    seed: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """y = x W^T + b with the recipe's fake-quantized GEMMs in forward and backward.

    x: [..., K]; weight: [N, K]; bias: [N] or None; floating-point tensors (weight and bias
    are cast to x's dtype). seed keys stochastic rounding (an int in [0, 2^63)); None draws
    one from torch's default generator when (and only when) the recipe uses SR, so runs
    without SR consume no random numbers.
    """
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a Recipe (see get_recipe), got {type(recipe).__name__}")
    _check_linear_args(x, weight, bias)
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
    if seed is None:
        seed = int(torch.randint(0, 2**62, ()).item()) if recipe.uses_sr else 0
    else:
        seed = check_seed(seed)
    return _QuantizedLinear.apply(x, weight, bias, recipe, seed, backend)


def _check_linear_args(x, weight, bias) -> None:
    """Refuse what torch would silently accept and we would get wrong: integer tensors
    (truncated products), or a bias that broadcasts in forward and fails only in backward."""
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is not None or name != "bias":
            check_float_tensor(t, name, "quantized_linear")
    if weight.dim() != 2 or x.dim() < 1:
        raise ValueError(
            f"quantized_linear takes x [..., in_features] and weight "
            f"[out_features, in_features], got x {tuple(x.shape)} and weight "
            f"{tuple(weight.shape)}"
        )
    if x.shape[-1] != weight.shape[-1]:
        raise ValueError(
            f"x has {x.shape[-1]} features but weight is {tuple(weight.shape)} "
            "([out_features, in_features])"
        )
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(
            f"bias must have shape ({weight.shape[0]},) (out_features), got {tuple(bias.shape)}"
        )

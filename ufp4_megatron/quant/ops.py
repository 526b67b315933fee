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
recipe.operand): an operand's OperandSpec becomes one OperandFormat (OperandSpec.format),
passed whole to fake_quant and the kernels, and both
operands of a GEMM run in one kernel launch where the kernels cover them (prepared once per
shape: kernels/dispatch.py PreparedQDQ). Backward
quantizes from the tensors BF16 saves anyway (x, w): no extra copies are kept for backward.

Origins are each operand's (row, column) offset in the full tensor, natural layout (dy:
tokens x N, x: tokens x K, w: N x K): a tensor-parallel shard passes its offset and gets the
stochastic-rounding bits of the unsharded tensor.
"""

from __future__ import annotations

import functools

import torch

from ..numerics.checks import check_float_tensor, check_seed
from ..numerics.hadamard import RHT, as_rht, rotated_dtype
from ..numerics.philox import key_row, mix_seed
from ..numerics.quantize import padded_length
from .fake_quant import BACKENDS, quantize_pair, quantize_view
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
    rht = as_rht(spec.rht, rht_seed)
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


def _pad(q: torch.Tensor, length: int, rows: bool = False) -> torch.Tensor:
    """q (natural orientation) padded along the reduction dim (dim 0 when rows) to length:
    the other operand needed a longer padding unit."""
    dim = 0 if rows else 1
    if q.shape[dim] != length:
        q = torch.nn.functional.pad(
            q, (0, 0, 0, length - q.shape[0]) if rows else (0, length - q.shape[1])
        )
    return q


def _gemm_operands(
    gemm: str,
    recipe: Recipe,
    tensors,
    origins,
    *,
    seed,
    backend: str,
    given=(None, None),
    amax=(None, None),
):
    """`gemm`'s two operands (natural layouts, OPERANDS order) quantized along the GEMM's
    reduction dim as the recipe says, padded to a common length along it, in natural
    orientation. An operand reduced along its rows is quantized as its transpose (origin
    swapped); the two quantizations run in one kernel launch where the kernels cover both.
    given[i]: operand i already quantized so (the weight cache), used as it is.
    seed: the call's SR seed (an int), or its key table in device memory
    (numerics.philox.operand_keys: int64 [6, E], the call's column first).
    amax[i]: operand i's e4m3 tensor amax already taken (`tensor_amaxes`), or None."""
    plan = _operands_plan(gemm, recipe, tensors, origins, seed, backend, given)
    return plan(tensors, seed, given, amax)


_PLANS: dict = {}


def _operands_plan(gemm, recipe, tensors, origins, seed, backend, given) -> _OperandsPlan:
    """The cached plan of a GEMM's operand preparation for these shapes, strides, dtypes,
    device, origins, recipe, seed kind and given operands (host time per call)."""
    a, b = tensors
    key = (
        gemm,
        id(recipe),
        backend,
        a.shape,
        a.stride(),
        a.dtype,
        b.shape,
        b.stride(),
        b.dtype,
        a.device,
        origins,
        isinstance(seed, int),
        given[0] is None,
        given[1] is None,
    )
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) > 1024:  # shapes are few per model; never grow without bound
            _PLANS.clear()
        plan = _PLANS[key] = _OperandsPlan(gemm, recipe, tensors, origins, seed, backend, given)
    return plan


class _OperandsPlan:
    """What `_gemm_operands` computes once per key (_operands_plan): the recipe's specs, the
    RHT, the common length and dtype, each operand's fixed keyword arguments (its
    OperandFormat, output dtype and origin), and where the kernels cover the operands, a
    prepared launch (kernels/dispatch.py PreparedQDQ)."""

    def __init__(self, gemm, recipe, tensors, origins, seed, backend, given):
        spec: GemmSpec = getattr(recipe, gemm)
        self.recipe = recipe  # keeps id(recipe) of the key alive and unique
        self.gid, self.along_rows = _GEMM_ID[gemm], _ALONG_ROWS[gemm]
        self.ops = tuple(getattr(spec, name) for name in OPERANDS[gemm])
        first = tensors[0]
        reduction = first.shape[0 if self.along_rows[0] else 1]
        self.rht, self.length, self.dtype = _gemm_plan(
            spec, gemm, recipe.rht_seed, reduction, first.dtype
        )
        self.backend = backend
        self.origins = tuple(
            (o[1], o[0]) if rows else o for o, rows in zip(origins, self.along_rows)
        )
        self.kws = tuple(
            None
            if op is None
            else dict(fmt=op.format(self.rht), out_dtype=self.dtype, origin=origin)
            for op, origin in zip(self.ops, self.origins)
        )
        # the operands this plan quantizes: quantized by the recipe and not given
        self.todo = tuple(i for i, op in enumerate(self.ops) if op is not None and given[i] is None)
        self.prepared = None
        if on_kernels(backend, first) and self.todo:
            from ..kernels import prepare  # lazy: triton is only needed on the kernel path

            self.prepared = prepare(
                [tensors[i] for i in self.todo],
                [self.along_rows[i] for i in self.todo],
                [self.kws[i] for i in self.todo],
                [self._seed(seed, i, prepared=True) for i in self.todo],
            )

    def _seed(self, seed, i: int, prepared: bool = False):
        """Operand i's SR key: mix_seed(seed, gemm, i) of a host seed; of a key table its
        entry (prepared: as (table, element offset), else as a 1-element view); 0 for RTNE."""
        op = self.ops[i]
        if op is None or op.rounding != "sr":
            return 0
        if isinstance(seed, int):
            return mix_seed(seed, self.gid, i)
        offset = key_row(self.gid, i) * seed.stride(0)
        return (seed, offset) if prepared else _key_view(seed, offset)

    def __call__(self, tensors, seed, given, amax=(None, None)):
        q = list(given)
        if self.prepared is not None:  # never e4m3 (kernels.prepare): no tensor amax
            outs = self.prepared(
                [tensors[i] for i in self.todo],
                [self._seed(seed, i, prepared=True) for i in self.todo],
            )
            for i, out in zip(self.todo, outs):
                q[i] = out
        elif self.todo:
            views = [t.t() if rows else t for t, rows in zip(tensors, self.along_rows)]
            keys = [
                dict(self.kws[i], seed=self._seed(seed, i))
                | ({} if amax[i] is None else {"tensor_amax": amax[i]})
                for i in range(2)
                if i in self.todo
            ]
            if len(self.todo) == 2:
                qs = quantize_pair(views[0], keys[0], views[1], keys[1], backend=self.backend)
            else:
                qs = (quantize_view(views[self.todo[0]], backend=self.backend, **keys[0]),)
            for i, qi in zip(self.todo, qs):
                q[i] = qi.t() if self.along_rows[i] else qi
        for i, (t, rows) in enumerate(zip(tensors, self.along_rows)):
            if q[i] is None:  # left in high precision (still rotated: the RHT cancels)
                q[i] = _rotated(t.t() if rows else t, self.length, self.rht, self.dtype)
                q[i] = q[i].t() if rows else q[i]
        return tuple(_pad(qi, self.length, rows) for qi, rows in zip(q, self.along_rows))


def _key_view(table: torch.Tensor, offset: int) -> torch.Tensor:
    """The 1-element view of `table`'s element at storage offset `offset` from its own."""
    return torch.as_strided(table, (1,), (1,), table.storage_offset() + offset)


def cacheable(recipe: Recipe, gemm: str, name: str = "w") -> bool:
    """Whether operand `name` of `gemm` is quantized with RTNE: deterministic, so `operand`
    can be computed once and reused (weight_cache.py); SR and unquantized operands are not."""
    spec = getattr(recipe, gemm)
    op = None if spec is None else getattr(spec, name)
    return op is not None and op.rounding == "rtne"


@functools.lru_cache(maxsize=256)
def shares_weight_operand(recipe: Recipe, n: int, k: int, dtype: torch.dtype) -> bool:
    """Whether fprop's and dgrad's kept operands of a weight [n, k] (`operand`, natural
    orientation) are one tensor, bit for bit: both GEMMs quantize w with the same RTNE
    format in square tiles, unrotated (NVFP4's 16x16 weight tiles), in w's dtype, and
    neither pads it (n and k whole tiles). dgrad's tiles along n then hold the elements of
    fprop's tiles along k, with the same scales and rounding, so the weight cache keeps one
    operand for both (parallel_gemm.kept_weight, experts._kept)."""
    if not (cacheable(recipe, "fprop") and cacheable(recipe, "dgrad")):
        return False
    plans = [
        _gemm_plan(getattr(recipe, gemm), gemm, recipe.rht_seed, reduction, dtype)
        for gemm, reduction in (("fprop", k), ("dgrad", n))
    ]
    (rht_f, length_f, dtype_f), (rht_d, length_d, dtype_d) = plans
    fmt_f, fmt_d = recipe.fprop.w.format(rht_f), recipe.dgrad.w.format(rht_d)
    return (
        fmt_f == fmt_d
        and fmt_f.same_tiles(fmt_d)
        and (length_f, length_d) == (k, n)
        and dtype_f == dtype_d
    )


# A tensor quantized for two GEMMs, with the GEMM quantizing it along its rows' length
# first: x (fprop along K, wgrad along tokens), dY (dgrad along N, wgrad along tokens) and
# w (fprop along K, dgrad along N).
SHARED = {"x": ("fprop", "wgrad"), "dy": ("dgrad", "wgrad"), "w": ("fprop", "dgrad")}
assert all(
    not _ALONG_ROWS[a][OPERANDS[a].index(n)] and _ALONG_ROWS[b][OPERANDS[b].index(n)]
    for n, (a, b) in SHARED.items()
)


def takes_tensor_amaxes(name: str, recipe: Recipe) -> bool:
    """Whether both GEMMs of SHARED[name] quantize operand `name` with e4m3 scales, each
    taking its tensor amax (NVFP4): what the recipe alone says, before any tensor."""
    specs = [getattr(recipe, gemm) for gemm in SHARED[name]]
    return all(
        spec is not None and getattr(spec, name) is not None and getattr(spec, name).scale == "e4m3"
        for spec in specs
    )


def shared_formats(name: str, t: torch.Tensor, recipe: Recipe):
    """The two OperandFormats with which the GEMMs of SHARED[name] quantize `t` (operand
    `name`: "x" [M, K], "dy" [M, N] or "w" [N, K]; the first along t's rows' length, the
    second along its columns), or None unless both quantize it with e4m3 scales (their
    tensor amax)."""
    if not takes_tensor_amaxes(name, recipe):
        return None
    gemms = SHARED[name]
    specs = [getattr(recipe, gemm) for gemm in gemms]
    ops = [getattr(spec, name) for spec in specs]
    return tuple(
        op.format(_gemm_plan(spec, gemm, recipe.rht_seed, t.shape[dim], t.dtype)[0])
        for op, spec, gemm, dim in zip(ops, specs, gemms, (1, 0))
    )


def on_kernels(backend: str, t: torch.Tensor) -> bool:
    """Whether a call with `backend` quantizes `t` through the Triton kernels: "triton", or
    "auto" on a CUDA tensor (elsewhere "auto" takes the reference)."""
    return backend == "triton" or (backend == "auto" and t.is_cuda)


def tensor_amaxes(name: str, t: torch.Tensor, recipe: Recipe, *, backend: str = "auto"):
    """The e4m3 tensor amax of `t` for both GEMMs of SHARED[name] (`shared_formats`) from one
    read of t (kernels.tensor_amax_pair), each what that GEMM's quantization would take
    itself, bit for bit; pass them as its `x_amax` / `dy_amax`. (None, None) where not both
    GEMMs quantize t with e4m3 scales on the kernel path (NVFP4 does, on a GPU): each then
    takes its own, as without this call."""
    fmts = shared_formats(name, t, recipe) if on_kernels(backend, t) else None
    if fmts is None:
        return None, None
    from .. import kernels as k  # lazy: triton is only needed on the kernel path

    pair = k.tensor_amax_pair(t, *fmts)
    return (None, None) if pair is None else (pair[0], pair[1])


def operand(
    gemm: str, name: str, t: torch.Tensor, recipe: Recipe, *, origin=(0, 0), backend: str = "auto"
) -> torch.Tensor:
    """Operand `name` of `gemm` (natural layout, origin in it) quantized exactly as
    _gemm_operands quantizes it for that GEMM (natural orientation, padded to the GEMM's
    reduction unit), for an RTNE operand (`cacheable`): what the weight cache stores. The
    same kernel job as the pair launch runs, so the same bits."""
    if not cacheable(recipe, gemm, name):
        raise ValueError(f"{gemm}.{name} is not an RTNE-quantized operand of {recipe.name}")
    spec: GemmSpec = getattr(recipe, gemm)
    i = OPERANDS[gemm].index(name)
    op = getattr(spec, name)
    rows = _ALONG_ROWS[gemm][i]
    reduction = t.shape[0 if rows else 1]
    rht, length, dtype = _gemm_plan(spec, gemm, recipe.rht_seed, reduction, t.dtype)
    q = quantize_view(
        t.t() if rows else t,
        fmt=op.format(rht),
        out_dtype=dtype,
        origin=(origin[1], origin[0]) if rows else origin,
        seed=0,
        backend=backend,
    )
    return _pad(q.t() if rows else q, length, rows)


def fprop(
    x: torch.Tensor,
    w: torch.Tensor,
    recipe: Recipe,
    *,
    seed=0,
    x_origin=(0, 0),
    w_origin=(0, 0),
    backend: str = "auto",
    qw: torch.Tensor | None = None,
    qx: torch.Tensor | None = None,
    x_amax: torch.Tensor | None = None,
    w_amax: torch.Tensor | None = None,
) -> torch.Tensor:
    """Y = Q(X) Q(W)^T: x [M, K], w [N, K] -> [M, N]. qw, qx: Q(W), Q(X) already made by
    `operand("fprop", "w" or "x", ...)` (the weight cache; one x for a strided weight's
    chunks), used as they are. x_amax, w_amax: their e4m3 tensor amaxes (`tensor_amaxes`),
    w's of w in its own dtype."""
    if w.dtype != x.dtype:  # the cast below may change w's amax
        w_amax = None
    w = w.to(x.dtype)
    if recipe.fprop is None:
        return x @ w.t()
    qx, qw = _gemm_operands(
        "fprop",
        recipe,
        (x, w),
        (x_origin, w_origin),
        seed=seed,
        backend=backend,
        given=(qx, qw),
        amax=(x_amax, w_amax),
    )
    return (qx @ qw.t()).to(x.dtype)


def dgrad(
    dy: torch.Tensor,
    w: torch.Tensor,
    recipe: Recipe,
    *,
    seed=0,
    dy_origin=(0, 0),
    w_origin=(0, 0),
    backend: str = "auto",
    qw: torch.Tensor | None = None,
    dy_amax: torch.Tensor | None = None,
    w_amax: torch.Tensor | None = None,
) -> torch.Tensor:
    """dX = Q(dY) Q(W): dy [M, N], w [N, K] -> [M, K]; W quantized along N (its columns).
    qw: Q(W) already made by `operand("dgrad", "w", w, ...)`, used as it is. dy_amax,
    w_amax: their e4m3 tensor amaxes (`tensor_amaxes`), w's of w in its own dtype."""
    if w.dtype != dy.dtype:  # the cast below may change w's amax
        w_amax = None
    w = w.to(dy.dtype)
    if recipe.dgrad is None:
        return dy @ w
    qdy, qw = _gemm_operands(
        "dgrad",
        recipe,
        (dy, w),
        (dy_origin, w_origin),
        seed=seed,
        backend=backend,
        given=(None, qw),
        amax=(dy_amax, w_amax),
    )
    return (qdy @ qw).to(dy.dtype)


def wgrad(
    dy: torch.Tensor,
    x: torch.Tensor,
    recipe: Recipe,
    *,
    seed=0,
    dy_origin=(0, 0),
    x_origin=(0, 0),
    backend: str = "auto",
    qx: torch.Tensor | None = None,
    dy_amax: torch.Tensor | None = None,
    x_amax: torch.Tensor | None = None,
) -> torch.Tensor:
    """dW = Q(dY)^T Q(X): dy [M, N], x [M, K] -> [N, K]; both quantized along tokens M.
    qx: Q(X) already made by `operand("wgrad", "x", x, ...)`, used as it is. dy_amax,
    x_amax: their e4m3 tensor amaxes (`tensor_amaxes`), x's of x in its own dtype."""
    if x.dtype != dy.dtype:  # the cast below may change x's amax
        x_amax = None
    x = x.to(dy.dtype)
    if recipe.wgrad is None:
        return dy.t() @ x
    qdy, qx = _gemm_operands(
        "wgrad",
        recipe,
        (dy, x),
        (dy_origin, x_origin),
        seed=seed,
        backend=backend,
        given=(None, qx),
        amax=(dy_amax, x_amax),
    )
    return (qdy.t() @ qx).to(dy.dtype)


class _QuantizedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, recipe: Recipe, seed: int, backend: str):
        x2d = x.reshape(-1, x.shape[-1])
        # NVFP4: x's tensor amax for fprop and wgrad in one read where wgrad will run, w's
        # for fprop and dgrad where dgrad will (and fprop quantizes w in its own dtype)
        none = (None, None)
        x_amax = (
            tensor_amaxes("x", x2d, recipe, backend=backend) if ctx.needs_input_grad[1] else none
        )
        dgrad_runs = ctx.needs_input_grad[0] and weight.dtype == x.dtype
        w_amax = tensor_amaxes("w", weight, recipe, backend=backend) if dgrad_runs else none
        y = fprop(
            x2d, weight, recipe, seed=seed, backend=backend, x_amax=x_amax[0], w_amax=w_amax[0]
        )
        if bias is not None:
            y = y + bias.to(y.dtype)
        ctx.save_for_backward(x, weight)
        ctx.x_amax, ctx.w_amax = x_amax[1], w_amax[1]
        ctx.recipe, ctx.seed, ctx.backend = recipe, seed, backend
        ctx.has_bias = bias is not None
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dy2d = dy.reshape(-1, dy.shape[-1]).to(x.dtype)
        x2d = x.reshape(-1, x.shape[-1])
        dx = dw = db = None
        amax = (None, None)
        if ctx.needs_input_grad[0] and ctx.needs_input_grad[1]:  # dY quantized for both
            amax = tensor_amaxes("dy", dy2d, ctx.recipe, backend=ctx.backend)
        if ctx.needs_input_grad[0]:
            dx = dgrad(
                dy2d,
                weight,
                ctx.recipe,
                seed=ctx.seed,
                backend=ctx.backend,
                dy_amax=amax[0],
                w_amax=ctx.w_amax,
            )
            dx = dx.reshape(x.shape)
        if ctx.needs_input_grad[1]:
            dw = wgrad(
                dy2d,
                x2d,
                ctx.recipe,
                seed=ctx.seed,
                backend=ctx.backend,
                dy_amax=amax[1],
                x_amax=ctx.x_amax,
            )
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

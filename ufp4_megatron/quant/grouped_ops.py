"""The three GEMMs of E experts' linear layers at once (MoE), and their per-expert twin.

Expert e owns a segment of the token matrix (Megatron's dispatcher sorts tokens by local
expert) and the weight w[e] of a stacked w [E, N, K]. All three GEMMs run on one padded
layout (`ExpertGroups`): each expert's tokens are zero-padded to a multiple of `align` (16,
or the recipe's block/RHT unit if larger), so every segment starts at a multiple of it:

    fprop  Y_e  = Q(X_e) Q(W_e)^T    x [Mp,K] row-wise, w [E*N,K] row-wise       one launch each
    dgrad  dX_e = Q(dY_e) Q(W_e)     dy [Mp,N] row-wise, w [E*N,K] column-wise   one launch each
    wgrad  dW_e = Q(dY_e)^T Q(X_e)   dy, x column-wise (blocks along tokens)     one launch each

Blocks along K (fprop) and N (dgrad) never cross an expert (N and K are multiples of the
recipe's block/RHT unit), and blocks along tokens (wgrad) start at each expert's first token,
exactly as a per-expert GEMM pads its tokens; so one quantization launch covers all experts.
Products go through `torch._grouped_mm` (one kernel for all experts; bf16 on sm90+, and its
CPU implementation), or a loop of matmuls where it is unavailable; no host sync per expert.
The padding also gives every group the 16-row alignment the grouped CUTLASS kernels expect
(Megatron-Core's own bf16 grouped MoE path aligns to 16 too); padded rows are zeros, their
outputs are dropped (`grouped_linear` pads and unpads).

Stochastic-rounding keys are per expert, so an expert's bits never depend on the grouping
(how many tokens the other experts got, how many experts share the call, the EP layout).
A call keyed by `seed` (one draw per grouped linear and forward) gives global expert g the
seed `expert_seed(seed, g) = mix_seed(seed, g)`; from it each GEMM operand takes
`mix_seed(., gemm, operand)` exactly as ops does for a single linear, and positions count
from the expert's own first token (row origin 0 there, plus the caller's origin) and its own
first weight row. So expert g's SR bits are those of `ops` on its tokens alone with seed
`expert_seed(seed, g)`; one quantization launch per operand keys every expert's segment so
(numerics/segments.py, kernels/segments_triton.py). Megatron's per-expert host
(megatron/experts.py, UFP4SequentialMLP) keys its experts' linears the same way, so both
hosts draw the same bits. `reference_fprop/dgrad/wgrad` run the same GEMMs one expert at a
time through `ops`, on each expert's padded segment with that seed: the twin every grouped
result equals bit for bit on CPU. Operand dtypes follow ops: float16 with an RHT quantizes
into float32 (a rotated block can exceed fp16's range) and the product is cast to float16
once. E4M3 (NVFP4) operands keep a per-expert tensor scale: segments give each expert its
own in the same one launch per operand (its amax in one read for all experts); the stacked
weight's serves fprop and dgrad both (`weight_amax`: the same 16x16 tiles in both layouts).
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field

import torch

from ..numerics.checks import check_int, check_seed
from ..numerics.hadamard import RHT, as_rht, rotated_dtype
from ..numerics.philox import key_row, mix_seed, mix_seeds
from ..numerics.quantize import padded_length
from ..numerics.segments import Segments, tensor_scale_segments_problem
from . import ops
from .fake_quant import quantize_view
from .recipe import GEMMS, OPERANDS, GemmSpec, OperandSpec, Recipe, reduction_dim

_GEMM_ID = {g: i for i, g in enumerate(GEMMS)}
GEMM_BACKENDS = ("auto", "grouped", "loop")
GROUP_ALIGN = 16  # rows per expert group of the grouped GEMM kernels (bf16: 32 bytes)


# ----------------------------------------------------------------------------- token layout


@dataclass(frozen=True)
class ExpertGroups:
    """Token counts per local expert, and the padded layout all grouped GEMMs run on.

    align: every expert's padded segment is a multiple of it, so segments start at multiples
    of `align`: quantization blocks along tokens never cross experts, and zero-token experts
    own no rows at all.
    """

    counts: tuple[int, ...]
    align: int = GROUP_ALIGN
    _device: dict = field(default_factory=dict, compare=False, repr=False)  # tensors per device

    def __post_init__(self):
        if any(c < 0 for c in self.counts) or self.align < 1:
            raise ValueError(
                f"token counts must be >= 0 and align >= 1, got {self.counts}, {self.align}"
            )

    @functools.cached_property
    def ends(self) -> tuple[int, ...]:
        return tuple(itertools.accumulate(self.counts))

    @functools.cached_property
    def starts(self) -> tuple[int, ...]:
        return (0, *self.ends[:-1])

    @functools.cached_property
    def padded_counts(self) -> tuple[int, ...]:
        return tuple(-(-c // self.align) * self.align for c in self.counts)

    @functools.cached_property
    def padded_ends(self) -> tuple[int, ...]:
        return tuple(itertools.accumulate(self.padded_counts))

    @functools.cached_property
    def padded_starts(self) -> tuple[int, ...]:
        return (0, *self.padded_ends[:-1])

    @property
    def total(self) -> int:
        return self.ends[-1] if self.counts else 0

    @property
    def padded_total(self) -> int:
        return self.padded_ends[-1] if self.counts else 0

    @property
    def needs_padding(self) -> bool:
        return self.padded_counts != self.counts

    def offsets(self, device) -> torch.Tensor:
        """int32 cumulative ends of the padded segments, `torch._grouped_mm`'s `offs`, on
        `device` (copied without a host sync)."""
        return self._cached(
            "offs", device, lambda: torch.tensor(self.padded_ends, dtype=torch.int32)
        )

    def token_experts(self, device) -> torch.Tensor:
        """int64 [M]: the local expert of each (unpadded) token row."""
        return self._cached(
            "experts",
            device,
            lambda: torch.repeat_interleave(
                torch.arange(len(self.counts)),
                torch.tensor(self.counts, dtype=torch.int64),
                output_size=self.total,
            ),
        )

    def pad(self, t: torch.Tensor) -> torch.Tensor:
        """[M, C] token matrix -> [padded_total, C]: each expert's rows at its padded
        segment, zeros elsewhere."""
        if not self.needs_padding:
            return t
        return t.new_zeros(self.padded_total, t.shape[1]).index_copy_(0, self._rows(t.device), t)

    def unpad(self, t: torch.Tensor) -> torch.Tensor:
        """[padded_total, C] -> [M, C]: the tokens' rows, in the original order."""
        return t if not self.needs_padding else t.index_select(0, self._rows(t.device))

    def _rows(self, device) -> torch.Tensor:
        """int64 [M]: the padded row of each token."""
        return self._cached(
            "rows",
            device,
            lambda: (
                torch.arange(self.total)
                + torch.tensor(
                    [p - s for p, s in zip(self.padded_starts, self.starts)]
                ).repeat_interleave(
                    torch.tensor(self.counts, dtype=torch.int64), output_size=self.total
                )
            ),
        )

    def _cached(self, name: str, device, make) -> torch.Tensor:
        key = (name, str(device))
        if key not in self._device:
            self._device[key] = _to_device(make(), device)
        return self._device[key]


@functools.lru_cache(maxsize=8)
def expert_groups(counts: tuple[int, ...], align: int = GROUP_ALIGN) -> ExpertGroups:
    """A shared ExpertGroups per (counts, align): fc1 and fc2 of one MoE layer reuse it."""
    return ExpertGroups(tuple(int(c) for c in counts), align)


def token_alignment(recipe: Recipe) -> int:
    """The padding unit of each expert's tokens: GROUP_ALIGN, and the unit ops would pad a
    single expert's token dim to in wgrad (block and RHT size of both wgrad operands, 4 for
    Philox words under SR)."""
    return GROUP_ALIGN if recipe.wgrad is None else math.lcm(GROUP_ALIGN, recipe.wgrad.unit)


def _to_device(t: torch.Tensor, device) -> torch.Tensor:
    device = torch.device(device)
    if device.type != "cuda":
        return t.to(device)
    # pinned + non_blocking: a pageable copy would synchronise the stream with the host
    return t.pin_memory().to(device, non_blocking=True)


# ----------------------------------------------------------------------------- the product


def grouped_mm(
    a: torch.Tensor, b: torch.Tensor, groups: ExpertGroups, *, backend: str = "auto"
) -> torch.Tensor:
    """Per-expert products in one call, over the padded token layout (Mp rows).

    a [Mp, K], b [E, K, N] -> [Mp, N]: rows of expert e times b[e] (fprop, dgrad);
    a [N, Mp], b [Mp, K]   -> [E, N, K]: columns/rows of expert e contracted (wgrad).
    backend "grouped" is torch._grouped_mm, "loop" a loop of matmuls (the reference, bitwise
    equal on CPU), "auto" the first where torch supports it (bf16 on sm90+, or CPU), else
    the loop.
    """
    if backend not in GEMM_BACKENDS:
        raise ValueError(f"unknown grouped GEMM backend {backend!r}; valid: {GEMM_BACKENDS}")
    weights_3d = b.dim() == 3
    if groups.total == 0:  # no tokens at all: nothing to launch
        return (
            a.new_zeros(0, b.shape[2])
            if weights_3d
            else a.new_zeros(len(groups.counts), a.shape[0], b.shape[1])
        )
    starts, ends = groups.padded_starts, groups.padded_ends
    if backend == "grouped" or (backend == "auto" and _grouped_mm_supported(a, b)):
        out = torch._grouped_mm(a, b, offs=groups.offsets(a.device))
        if not weights_3d:  # an expert without tokens contracts nothing: exact zeros
            for e, c in enumerate(groups.counts):
                if c == 0:
                    out[e].zero_()
        return out
    if weights_3d:
        out = a.new_empty(a.shape[0], b.shape[2])
        for e, (s, t) in enumerate(zip(starts, ends)):
            torch.matmul(a[s:t], b[e], out=out[s:t])
        return out
    return torch.stack([a[:, s:t] @ b[s:t] for s, t in zip(starts, ends)])


def _grouped_mm_supported(a: torch.Tensor, b: torch.Tensor) -> bool:
    if not hasattr(torch, "_grouped_mm") or a.dtype != b.dtype:
        return False
    if not a.is_cuda:
        return True  # torch's CPU implementation: any float dtype
    return (
        a.dtype == torch.bfloat16
        and _capability(a.device) >= (9, 0)
        and all(_aligned(t) for t in (a, b))
    )


@functools.cache
def _capability(device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def _aligned(t: torch.Tensor) -> bool:
    """CUTLASS needs 16-byte aligned leading strides and base pointers."""
    per = 16 // t.element_size()
    return (
        (t.stride(-1) == 1 and t.stride(-2) % per == 0)
        or (t.stride(-2) == 1 and t.stride(-1) % per == 0)
    ) and t.data_ptr() % 16 == 0


# ----------------------------------------------------------------------------- SR keys


def expert_seed(seed: int, expert: int) -> int:
    """The SR seed of global expert `expert` in a call keyed by `seed`; the seed `ops` gets
    for that expert's GEMMs (it mixes in the GEMM and operand itself)."""
    return mix_seed(seed, expert)


@functools.lru_cache(maxsize=64)
def _operand_seeds(
    seed: int, first_expert: int, experts: int, gemm: str, operand: int
) -> tuple[int, ...]:
    """Per local expert, the seed ops keys this GEMM operand with:
    mix_seed(expert_seed(seed, g), gemm id, operand), vectorized (mix_seeds)."""
    per_expert = mix_seeds([seed] * experts, list(range(first_expert, first_expert + experts)))
    return tuple(mix_seeds(per_expert, _GEMM_ID[gemm], operand))


def _segment_seeds(seed, first_expert: int, experts: int, gemm: str, operand: int):
    """Per local expert, this GEMM operand's SR key: of a host seed _operand_seeds; of a key
    table drawn on the device (megatron/seeds.py: [6, E], numerics.philox.operand_keys, the
    same values) its row, read in place by the kernels (no host copy per call)."""
    if isinstance(seed, torch.Tensor):
        if seed.shape[1] != experts:
            raise ValueError(f"a key table of {seed.shape[1]} experts for {experts} experts")
        return seed[key_row(_GEMM_ID[gemm], operand)]
    return _operand_seeds(seed, first_expert, experts, gemm, operand)


# ----------------------------------------------------------------------------- operands


def _check_shapes(name: str, reduction: int, spec: GemmSpec, rht: RHT | None) -> None:
    for op in (getattr(spec, operand) for operand in OPERANDS[name]):
        unit = padded_length(1, op.block if op else 1, rht)
        if reduction % unit:
            raise ValueError(
                f"grouped {name}: reduction size {reduction} is not a multiple of "
                f"{unit} (block/RHT unit): stacked experts' blocks would straddle "
                "experts; choose expert sizes divisible by it"
            )


def _operand(
    view: torch.Tensor,
    spec: OperandSpec | None,
    *,
    rht: RHT | None,
    seeds: tuple[int, ...],
    origin: tuple[int, int],
    starts: tuple[int, ...],
    along_columns: bool,
    dtype: torch.dtype,
    backend: str,
    tensor_amax: torch.Tensor | None = None,
) -> torch.Tensor:
    """A [R, C] view quantized along C, in the view's orientation and `dtype`. The experts'
    segments start at `starts` along the rows (along the columns with along_columns); blocks
    never cross them, and under SR expert e's segment is keyed by seeds[e] with `origin` at
    its first row (column) (numerics/segments.py).

    E4M3 scales carry a tensor-level amax: that tensor is one expert's operand (as in a
    per-expert GEMM), so each segment takes its own (segments do that in one launch); only
    where a 16x16 weight tile would span two experts (N not a multiple of 16) is each segment
    quantized on its own call. tensor_amax: the segments' amaxes already taken (fp32 [E],
    `weight_amax`), for the one launch only (weight_amax gives none elsewhere)."""
    if spec is None:  # high precision, still rotated so the RHT cancels
        out = view.to(torch.float32)
        return (rht.rotate_fp32_lastdim(out) if rht is not None else out).to(dtype)
    sr = spec.rounding == "sr"
    if sr and view.shape[1] > 0 and origin[1] % 4:
        raise ValueError(f"SR keys need a column origin that is a multiple of 4, got {origin}")
    fmt = spec.format(rht)
    kw = dict(origin=origin, out_dtype=dtype, backend=backend)
    e4m3 = spec.scale == "e4m3"
    segments = (
        Segments(1 if along_columns else 0, starts, seeds)
        if (sr or e4m3) and view.numel()
        else None
    )
    if (
        segments is None
        or not e4m3
        or tensor_scale_segments_problem(
            segments,
            block=spec.block,
            block_2d=spec.block_2d,
            rht_size=rht.size if rht is not None else None,
        )
        is None
    ):
        return quantize_view(
            view, fmt=fmt, seed=0, segments=segments, tensor_amax=tensor_amax, **kw
        )
    parts = []
    ends = (*starts[1:], view.shape[1 if along_columns else 0])
    for s, t, seed in zip(starts, ends, seeds):
        part = view[:, s:t] if along_columns else view[s:t]
        parts.append(
            quantize_view(part, fmt=fmt, seed=seed if sr else 0, **kw)
            if part.numel()
            else part.to(dtype)
        )
    return torch.cat(parts, dim=1 if along_columns else 0) if parts else view.to(dtype)


def _gemm_operand(
    gemm: str,
    name: str,
    t: torch.Tensor,
    spec: GemmSpec,
    *,
    rht: RHT | None,
    seed: int,
    first_expert: int,
    experts: int,
    origin: tuple[int, int],
    starts: tuple[int, ...],
    dtype: torch.dtype,
    backend: str,
    tensor_amax: torch.Tensor | None = None,
) -> torch.Tensor:
    """Operand `name` of `gemm` (natural layout; experts' segments start at `starts` along
    its rows) quantized along the GEMM's reduction dim, in natural orientation. An operand
    reduced along its rows is quantized as its transpose (the kernels' column layout; origin
    swapped, segments then along the columns). tensor_amax: its per-expert e4m3 tensor amax
    already taken (`weight_amax`), or None."""
    rows = reduction_dim(gemm, name) == 0
    q = _operand(
        t.t() if rows else t,
        getattr(spec, name),
        rht=rht,
        seeds=_segment_seeds(seed, first_expert, experts, gemm, OPERANDS[gemm].index(name)),
        origin=(origin[1], origin[0]) if rows else origin,
        starts=starts,
        along_columns=rows,
        dtype=dtype,
        backend=backend,
        tensor_amax=tensor_amax,
    )
    return q.t() if rows else q


def _gemm_setup(gemm: str, recipe: Recipe, x: torch.Tensor, reduction: int | None = None):
    """(spec, rht, operand dtype): fp32 for fp16 with an RHT, as in ops."""
    spec: GemmSpec = getattr(recipe, gemm)
    rht = as_rht(spec.rht, recipe.rht_seed)
    if reduction is not None:
        _check_shapes(gemm, reduction, spec, rht)
    return spec, rht, rotated_dtype(x.dtype) if rht is not None else x.dtype


def _weight_starts(E: int, N: int) -> tuple[int, ...]:
    return tuple(e * N for e in range(E))


def _token_rows(groups: ExpertGroups):
    return list(zip(groups.padded_starts, groups.padded_ends))


def _check_layout(name: str, t: torch.Tensor, groups: ExpertGroups, recipe: Recipe) -> None:
    if t.shape[0] != groups.padded_total:
        raise ValueError(
            f"grouped {name}: expected the padded token layout of "
            f"{groups.padded_total} rows (ExpertGroups.pad), got {t.shape[0]}"
        )
    if groups.align % token_alignment(recipe):
        raise ValueError(
            f"grouped {name}: experts' tokens are padded to {groups.align}, the "
            f"recipe needs a multiple of {token_alignment(recipe)}; build the "
            "groups with token_alignment(recipe)"
        )


# ----------------------------------------------------------------------------- the GEMMs
# seed: the call's SR seed; first_expert: the global index of local expert 0 (EP rank *
# local experts); origins: each expert's, at its first token (and weight row).


def fprop(
    x: torch.Tensor,
    w: torch.Tensor,
    groups: ExpertGroups,
    recipe: Recipe,
    *,
    seed=0,
    first_expert: int = 0,
    x_origin=(0, 0),
    w_origin=(0, 0),
    backend: str = "auto",
    gemm_backend: str = "auto",
    qw: torch.Tensor | None = None,
    qx: torch.Tensor | None = None,
    w_amax: torch.Tensor | None = None,
    x_amax: torch.Tensor | None = None,
) -> torch.Tensor:
    """Y_e = Q(X_e) Q(W_e)^T: x [Mp, K] (padded layout), w [E, N, K] -> [Mp, N]. qw: the
    weight's operand made by `weight_operand("fprop", ...)` (the weight cache), as it is;
    qx: x's made by `input_operand("fprop", ...)` (one x for a strided weight's chunks);
    w_amax: w's per-expert e4m3 tensor amax from `weight_amax` (same backend), of w in its
    own dtype; x_amax: x's from `input_amaxes("x", ...)[0]`."""
    E, N, K = w.shape
    if w.dtype != x.dtype:  # the cast below may change w's amax
        w_amax = None
    w = w.to(x.dtype)
    _check_layout("fprop", x, groups, recipe)
    if recipe.fprop is None:
        return grouped_mm(x, w.transpose(1, 2), groups, backend=gemm_backend)
    spec, rht, dtype = _gemm_setup("fprop", recipe, x, K)
    kw = dict(
        rht=rht, seed=seed, first_expert=first_expert, experts=E, dtype=dtype, backend=backend
    )
    if qx is None:
        qx = _gemm_operand(
            "fprop",
            "x",
            x,
            spec,
            origin=x_origin,
            starts=groups.padded_starts,
            tensor_amax=x_amax,
            **kw,
        )
    if qw is None:
        qw = _gemm_operand(
            "fprop",
            "w",
            w.reshape(E * N, K),
            spec,
            origin=w_origin,
            starts=_weight_starts(E, N),
            tensor_amax=w_amax,
            **kw,
        )
    y = grouped_mm(qx, qw.view(E, N, K).transpose(1, 2), groups, backend=gemm_backend)
    return y.to(x.dtype)


def dgrad(
    dy: torch.Tensor,
    w: torch.Tensor,
    groups: ExpertGroups,
    recipe: Recipe,
    *,
    seed=0,
    first_expert: int = 0,
    dy_origin=(0, 0),
    w_origin=(0, 0),
    backend: str = "auto",
    gemm_backend: str = "auto",
    qw: torch.Tensor | None = None,
    w_amax: torch.Tensor | None = None,
    dy_amax: torch.Tensor | None = None,
) -> torch.Tensor:
    """dX_e = Q(dY_e) Q(W_e): dy [Mp, N] (padded layout), w [E, N, K] -> [Mp, K]; W
    quantized along N. qw: the weight's operand made by `weight_operand("dgrad", ...)`;
    w_amax: w's per-expert e4m3 tensor amax from `weight_amax` (same backend), of w in its
    own dtype; dy_amax: dy's from `input_amaxes("dy", ...)[0]`."""
    E, N, K = w.shape
    if w.dtype != dy.dtype:  # the cast below may change w's amax
        w_amax = None
    w = w.to(dy.dtype)
    _check_layout("dgrad", dy, groups, recipe)
    if recipe.dgrad is None:
        return grouped_mm(dy, w, groups, backend=gemm_backend)
    spec, rht, dtype = _gemm_setup("dgrad", recipe, dy, N)
    kw = dict(
        rht=rht, seed=seed, first_expert=first_expert, experts=E, dtype=dtype, backend=backend
    )
    qdy = _gemm_operand(
        "dgrad",
        "dy",
        dy,
        spec,
        origin=dy_origin,
        starts=groups.padded_starts,
        tensor_amax=dy_amax,
        **kw,
    )
    # the stack [E*N, K] quantized along N: its transpose in the kernels' column layout
    if qw is None:
        qw = _gemm_operand(
            "dgrad",
            "w",
            w.reshape(E * N, K),
            spec,
            origin=w_origin,
            starts=_weight_starts(E, N),
            tensor_amax=w_amax,
            **kw,
        )
    dx = grouped_mm(qdy, qw.reshape(E, N, K), groups, backend=gemm_backend)
    return dx.to(dy.dtype)


def wgrad(
    dy: torch.Tensor,
    x: torch.Tensor,
    groups: ExpertGroups,
    recipe: Recipe,
    *,
    seed=0,
    first_expert: int = 0,
    dy_origin=(0, 0),
    x_origin=(0, 0),
    backend: str = "auto",
    gemm_backend: str = "auto",
    qx: torch.Tensor | None = None,
    dy_amax: torch.Tensor | None = None,
    x_amax: torch.Tensor | None = None,
) -> torch.Tensor:
    """dW_e = Q(dY_e)^T Q(X_e): dy [Mp, N], x [Mp, K] (padded layout) -> [E, N, K]; both
    quantized along tokens, in blocks that start at each expert's first token. qx: x's
    operand made by `input_operand("wgrad", ...)`, as it is; dy_amax, x_amax: their
    per-expert e4m3 tensor amaxes from `input_amaxes` (same backend), [1] of each pair."""
    if x.dtype != dy.dtype:  # the cast below may change x's amax
        x_amax = None
    x = x.to(dy.dtype)
    _check_layout("wgrad", dy, groups, recipe)
    if recipe.wgrad is None:
        return grouped_mm(dy.t(), x, groups, backend=gemm_backend)
    E = len(groups.counts)
    spec, rht, dtype = _gemm_setup("wgrad", recipe, dy)
    kw = dict(
        rht=rht,
        seed=seed,
        first_expert=first_expert,
        experts=E,
        dtype=dtype,
        backend=backend,
        starts=groups.padded_starts,
    )
    qdy = _gemm_operand("wgrad", "dy", dy, spec, origin=dy_origin, tensor_amax=dy_amax, **kw)
    if qx is None:
        qx = _gemm_operand("wgrad", "x", x, spec, origin=x_origin, tensor_amax=x_amax, **kw)
    return grouped_mm(qdy.t(), qx, groups, backend=gemm_backend).to(dy.dtype)


def input_operand(
    gemm: str,
    x: torch.Tensor,
    groups: ExpertGroups,
    recipe: Recipe,
    *,
    seed=0,
    first_expert: int = 0,
    x_origin=(0, 0),
    backend: str = "auto",
) -> torch.Tensor:
    """x's operand of `gemm` ("fprop" or "wgrad"; x [Mp, K] in the padded layout) exactly as
    that GEMM's call quantizes it with the same keys: made once and passed as `qx` to the
    calls of a strided weight's chunks, which share x."""
    if gemm not in ("fprop", "wgrad") or getattr(recipe, gemm) is None:
        raise ValueError(f"{gemm}: no quantized x operand in {recipe.name}")
    spec, rht, dtype = _gemm_setup(gemm, recipe, x, x.shape[1] if gemm == "fprop" else None)
    return _gemm_operand(
        gemm,
        "x",
        x,
        spec,
        origin=x_origin,
        starts=groups.padded_starts,
        rht=rht,
        seed=seed,
        first_expert=first_expert,
        experts=len(groups.counts),
        dtype=dtype,
        backend=backend,
    )


def weight_operand(
    gemm: str,
    w: torch.Tensor,
    recipe: Recipe,
    *,
    origin=(0, 0),
    dtype: torch.dtype | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """The stacked weight's operand of `gemm` ("fprop" or "dgrad", an RTNE operand:
    ops.cacheable) exactly as fprop / dgrad quantize it for activations of `dtype` (None:
    w's): what the weight cache keeps."""
    if not ops.cacheable(recipe, gemm):
        raise ValueError(f"{gemm}.w is not an RTNE-quantized operand of {recipe.name}")
    w = w.to(dtype or w.dtype)
    E, N, K = w.shape
    spec, rht, dtype = _gemm_setup(gemm, recipe, w, K if gemm == "fprop" else N)
    return _gemm_operand(
        gemm,
        "w",
        w.reshape(E * N, K),
        spec,
        rht=rht,
        seed=0,
        first_expert=0,
        experts=E,
        origin=origin,
        starts=_weight_starts(E, N),
        dtype=dtype,
        backend=backend,
    )


def weight_amax(w: torch.Tensor, recipe: Recipe, *, backend: str = "auto") -> torch.Tensor | None:
    """The per-expert e4m3 tensor amax of a stacked weight w [E, N, K] for fprop and dgrad
    from one read (kernels.tensor_amax with the experts' segments), fp32 [E]: bit for bit
    what each GEMM's quantization of w takes itself; pass it to both as `w_amax`. Only on
    the kernel path, where both GEMMs quantize w with e4m3 scales in the same square tiles,
    unrotated (NVFP4's weight: the tiles of both layouts hold the same elements), each in one
    segmented launch; else None (each GEMM takes its own, as without this call)."""
    E, N, K = w.shape
    w2d = w.reshape(E * N, K)
    fmts = (
        ops.shared_formats("w", w2d, recipe) if ops.on_kernels(backend, w) and w.numel() else None
    )
    if fmts is None or not fmts[0].same_tiles(fmts[1]):
        return None
    from .. import kernels  # lazy: triton is only needed on the kernel path

    starts, seeds = _weight_starts(E, N), (0,) * E
    segments = [Segments(axis, starts, seeds) for axis in (0, 1)]
    views = (w2d, w2d.t())
    # both quantizations in one segmented kernel launch: neither the per-expert calls nor
    # the reference (where backend "auto" falls back to it) take an amax per segment
    if any(
        kernels.unsupported(view, fmt=fmt, segments=seg) is not None
        for view, fmt, seg in zip(views, fmts, segments)
    ):
        return None
    return kernels.tensor_amax(w2d, fmts[0], segments=segments[0])


def input_amaxes(
    name: str, t: torch.Tensor, groups: ExpertGroups, recipe: Recipe, *, backend: str = "auto"
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """NVFP4's per-expert e4m3 tensor amaxes of x [Mp, K] (name "x": for fprop and wgrad) or
    dY [Mp, N] ("dy": for dgrad and wgrad) in the padded layout, from one read of t
    (kernels.tensor_amax_pair with the experts' token segments), fp32 [E] each: bit for bit
    what each GEMM's quantization of t takes itself; pass them as `x_amax` / `dy_amax`.
    (None, None) where not both GEMMs quantize t with e4m3 scales in the kernels' segmented
    pass (on the kernel path, x and dY of NVFP4): each then takes its own."""
    fmts = ops.shared_formats(name, t, recipe) if ops.on_kernels(backend, t) and t.numel() else None
    if fmts is None:
        return None, None
    from .. import kernels  # lazy: triton is only needed on the kernel path

    pair = kernels.tensor_amax_pair(t, *fmts, starts=groups.padded_starts)
    return (None, None) if pair is None else (pair[0], pair[1])


# ----------------------------------------------------------------------------- the twin
# One expert at a time through ops, on each expert's padded segment, with its own seed
# (expert_seed) and the same origins: the definition the grouped GEMMs implement.


def reference_fprop(
    x,
    w,
    groups: ExpertGroups,
    recipe: Recipe,
    *,
    seed: int = 0,
    first_expert: int = 0,
    x_origin=(0, 0),
    w_origin=(0, 0),
    backend: str = "auto",
) -> torch.Tensor:
    return _cat(
        [
            ops.fprop(
                x[s:t],
                w[e],
                recipe,
                seed=expert_seed(seed, first_expert + e),
                backend=backend,
                x_origin=x_origin,
                w_origin=w_origin,
            )
            for e, (s, t) in enumerate(_token_rows(groups))
        ],
        x,
        w.shape[1],
    )


def reference_dgrad(
    dy,
    w,
    groups: ExpertGroups,
    recipe: Recipe,
    *,
    seed: int = 0,
    first_expert: int = 0,
    dy_origin=(0, 0),
    w_origin=(0, 0),
    backend: str = "auto",
) -> torch.Tensor:
    return _cat(
        [
            ops.dgrad(
                dy[s:t],
                w[e],
                recipe,
                seed=expert_seed(seed, first_expert + e),
                backend=backend,
                dy_origin=dy_origin,
                w_origin=w_origin,
            )
            for e, (s, t) in enumerate(_token_rows(groups))
        ],
        dy,
        w.shape[2],
    )


def reference_wgrad(
    dy,
    x,
    groups: ExpertGroups,
    recipe: Recipe,
    *,
    seed: int = 0,
    first_expert: int = 0,
    dy_origin=(0, 0),
    x_origin=(0, 0),
    backend: str = "auto",
) -> torch.Tensor:
    return torch.stack(
        [
            ops.wgrad(
                dy[s:t],
                x[s:t],
                recipe,
                seed=expert_seed(seed, first_expert + e),
                backend=backend,
                dy_origin=dy_origin,
                x_origin=x_origin,
            )
            for e, (s, t) in enumerate(_token_rows(groups))
        ]
    )


def _cat(parts: list, like: torch.Tensor, cols: int) -> torch.Tensor:
    return torch.cat(parts) if parts else like.new_zeros(0, cols)


# ----------------------------------------------------------------------------- autograd


class _GroupedLinear(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        x,
        weight,
        bias,
        groups: ExpertGroups,
        recipe: Recipe,
        seed: int,
        first_expert: int,
        backend: str,
    ):
        xp = groups.pad(x)
        # NVFP4: the per-expert amaxes of x (fprop, wgrad) and w (fprop, dgrad) from one read
        # each, where both of their GEMMs run
        x_amax = (
            input_amaxes("x", xp, groups, recipe, backend=backend)
            if ctx.needs_input_grad[1]
            else (None, None)
        )
        w_amax = weight_amax(weight, recipe, backend=backend) if ctx.needs_input_grad[0] else None
        y = fprop(
            xp,
            weight,
            groups,
            recipe,
            seed=seed,
            first_expert=first_expert,
            backend=backend,
            x_amax=x_amax[0],
            w_amax=w_amax,
        )
        y = groups.unpad(y)
        if bias is not None:
            y = y + bias.index_select(0, groups.token_experts(x.device)).to(y.dtype)
        given = (x_amax[1], w_amax)  # wgrad's of x, dgrad's of w
        ctx.amax_given = tuple(a is not None for a in given)
        ctx.save_for_backward(xp, weight, *(a for a in given if a is not None))
        ctx.groups, ctx.recipe, ctx.seed, ctx.backend = groups, recipe, seed, backend
        ctx.first_expert = first_expert
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        xp, weight, *rest = ctx.saved_tensors
        given = iter(rest)
        x_amax, w_amax = (next(given) if saved else None for saved in ctx.amax_given)
        groups = ctx.groups
        dy = dy.contiguous().to(xp.dtype)
        dyp = groups.pad(dy)
        dx = dw = db = None
        kw = dict(seed=ctx.seed, first_expert=ctx.first_expert, backend=ctx.backend)
        dy_amax = (
            input_amaxes("dy", dyp, groups, ctx.recipe, backend=ctx.backend)
            if ctx.needs_input_grad[0] and ctx.needs_input_grad[1]
            else (None, None)
        )
        if ctx.needs_input_grad[0]:
            dx = dgrad(dyp, weight, groups, ctx.recipe, **kw, w_amax=w_amax, dy_amax=dy_amax[0])
            dx = groups.unpad(dx)
        if ctx.needs_input_grad[1]:
            dw = wgrad(dyp, xp, groups, ctx.recipe, **kw, dy_amax=dy_amax[1], x_amax=x_amax)
            dw = dw.to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = per_expert_sum(dy, groups)
        return dx, dw, db, None, None, None, None, None


def per_expert_sum(t: torch.Tensor, groups: ExpertGroups) -> torch.Tensor:
    """[M, N] (unpadded) -> [E, N]: the sum of each expert's rows (bias gradients)."""
    return (
        t.new_zeros(len(groups.counts), t.shape[1], dtype=torch.float32)
        .index_add_(0, groups.token_experts(t.device), t.float())
        .to(t.dtype)
    )


def grouped_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    tokens_per_expert,
    recipe: Recipe,
    *,
    seed: int | None = None,
    first_expert: int = 0,
    backend: str = "auto",
) -> torch.Tensor:
    """y = x_e W_e^T (+ b_e) for the tokens of each expert, all GEMMs grouped.

    x: [M, K], rows sorted by expert; weight: [E, N, K]; bias: [E, N] or None;
    tokens_per_expert: E ints summing to M. seed as in ops.quantized_linear; local expert e
    is global expert first_expert + e and takes the SR seed expert_seed(seed, that index).
    """
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a Recipe (see get_recipe), got {type(recipe).__name__}")
    counts = tuple(int(c) for c in tokens_per_expert)
    if weight.dim() != 3 or len(counts) != weight.shape[0]:
        raise ValueError(
            f"weight must be [experts, out, in] with one token count per expert, "
            f"got weight {tuple(weight.shape)} and {len(counts)} counts"
        )
    if x.dim() != 2 or x.shape[1] != weight.shape[2] or sum(counts) != x.shape[0]:
        raise ValueError(
            f"x must be [tokens, {weight.shape[2]}] with tokens = sum of the "
            f"counts ({sum(counts)}), got {tuple(x.shape)}"
        )
    if seed is None:
        seed = int(torch.randint(0, 2**62, ()).item()) if recipe.uses_sr else 0
    seed, first_expert = check_seed(seed), check_int(first_expert, "first_expert", 0)
    groups = expert_groups(counts, token_alignment(recipe))
    return _GroupedLinear.apply(x, weight, bias, groups, recipe, seed, first_expert, backend)

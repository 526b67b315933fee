"""Host side of the QDQ kernels: what they cover, cached launch plans, and the launches.

Entry points (re-exported by kernels/__init__.py):
  unsupported / supports   why (or whether) the kernels can reproduce the reference here;
  quantize_view            twin of numerics.quantize.quantize_view;
  quantize_pair            two views (the two operands of one GEMM): one launch when both
                           take the 16-tensor kernels, else two.
Which kernel runs: 1x16 blocks with RHT16 or none take the 16-tensor kernels
(quantize16_triton.py), and so do 1x32 blocks (RHT16 or none) in the column layout unless a
segment starts inside a block (MXFP4's dgrad and wgrad operands, grouped experts' too: two
groups of 16 a block); everything else takes the generic tile kernel (quantize_triton.py); both
run the steps of pipeline_triton.py. One layout per launch: a fused both-layouts kernel was
measured slower than two passes (docs/kernel-notes.md) and is gone.

Host time is what small and medium layers pay per QDQ (docs/kernel-notes.md). Everything that
depends only on the operand's format (numerics.quantize.OperandFormat), the input dtype, the
device and the output dtype (level tables, signs, constexpr arguments) is built once into a
`_Plan` cached by those four; a call computes only the shapes, the output and its scalars
(seed, origin, the e4m3 tensor amax: in one read by amax_triton.py, bit for bit the
reference's, divided into the tensor scale in the kernels). Every entry point takes the
format as `fmt=`, or as the reference does: a grid and its keywords (block, scale, rounding,
rht, ...).

Segment-keyed SR (`segments=`, numerics/segments.py: one seed and origin per row or column
range, the experts of a grouped GEMM) passes three small device tables per layout
(segments_triton.py); their static parts are cached by segment starts, the seeds are copied
per call. Under e4m3 scales each segment also gets its own tensor scale (its amax in one
read for all segments, `_tensor_amax`), the kernels reading it through the same
tables. Without SR or e4m3 the segments change nothing and are not passed.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import NamedTuple

import torch
from triton.runtime.interpreter import InterpretedFunction

from ..numerics.checks import SEED_LIMIT
from ..numerics.grids import Grid, codebook_levels, get_grid
from ..numerics.hadamard import RHT
from ..numerics.quantize import OperandFormat, format_of, output_dtype, padded_length
from ..numerics.rounding import midpoints, minifloat_mantissa, uniform_step
from ..numerics.segments import Segments, tensor_scale_segments_problem
from . import quantize16_triton as k16
from .amax_triton import (
    _tensor_amax16_kernel,
    _tensor_amax_kernel,
    _tensor_amax_pair16_kernel,
    _tensor_amax_pair_kernel,
)
from .launch import Prepared, _spec, launch
from .quantize_triton import _qdq_kernel

SCALES = {"fp32": 0, "e4m3": 1, "e8m0": 2}
BLOCKS = (16, 32)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# (rows, cols, warps) of a generic-kernel tile of the [A, B] input per layout; widened to the
# spec's unit.
TILES = {"row": (16, 128, 4), "col": (128, 16, 4)}  # H200 sweep
# per program: col16 (groups of 16 rows, columns, warps), col32 (blocks of 32 rows, columns,
# warps: the same 32 rows a program), row16 (rows, blocks, warps)
TILES16 = {"col16": (2, 128, 4), "col32": (1, 128, 4), "row16": (8, 16, 4)}
# Kernels decorated under TRITON_INTERPRET=1 run in Triton's CPU interpreter (the CPU tests).
INTERPRETED = isinstance(_qdq_kernel, InterpretedFunction)


@dataclass(frozen=True, eq=False)
class _Plan:
    """What one operand format needs at launch, for one input dtype, device and output
    dtype."""

    fmt: OperandFormat
    grid: Grid
    block: int
    block_2d: bool
    rht: RHT | None
    unit: int  # padding unit along the quantized dim
    keep_padding: bool
    out_dtype: torch.dtype
    lv: torch.Tensor  # levels (+ g_max repeated), device fp32
    mid: torch.Tensor  # midpoints, device fp32
    sign: torch.Tensor  # RHT signs (or a dummy), device fp32
    # e4m3 block scales under a tensor scale: the kernels read the tensor amax and divide it
    # by 448 g_max themselves (pipeline_triton.block_scales)
    e4m3: bool
    scalars: tuple  # (norm, gmax, gneg)
    consts: dict  # constexprs of the generic kernel
    consts16: dict | None  # constexprs of the 16-tensor kernels; None: generic kernel only
    prefixed: dict | None  # consts16 named for either job of the pair kernel: "A_", "B_"


class _Layout(NamedTuple):
    """One call's layout: its plan, runtime arguments and lengths. length: padded length
    along the quantized dim; other: padded length along the other dim (2D tiles); out_len:
    quantized-dim length written."""

    plan: _Plan
    args: tuple  # lv, mid, st, sign, norm, gmax, gneg, seed, origin0, origin1, + 4 segment args
    length: int
    other: int
    out_len: int
    seg: int  # SR keys and e4m3 tensor scales: 0 one for the view, 1 per row segment, 2 per
    #           column segment
    seed_ptr: int  # 1: the SR seed is read from device memory (args' seed is a 1-element
    #                int64 tensor, a key table's entry), 0: a host integer
    whole_blocks: bool  # no segment starts inside a block along the quantized dim
    # the view's transpose laid out in the row layout in its place (`_tiles_transpose`): the
    # result is the transpose of that quantization
    transposed: bool = False


_PLANS: dict = {}


def _plan(dtype, device, fmt: OperandFormat, out_dtype) -> _Plan | str:
    """The cached plan of a format, or the reason the kernels do not cover it."""
    try:
        key = (dtype, device, fmt, out_dtype)
        hit = _PLANS.get(key)
    except TypeError:  # an unhashable codebook (a list): key it by its levels
        try:
            grid = codebook_levels(fmt.grid)
        except (TypeError, ValueError) as e:
            return str(e)
        return _plan(dtype, device, dataclasses.replace(fmt, grid=grid), out_dtype)
    if hit is None:
        if len(_PLANS) > 1024:  # formats are few; never grow without bound
            _PLANS.clear()
        hit = _PLANS[key] = _build_plan(dtype, device, fmt, out_dtype)
    return hit


def rht16_constexpr(rht: RHT) -> int:
    """The 16-tensor kernels' RHT constexpr for an RHT16: 2^16 plus its sign mask (bit j set
    where sign j is -1), so that the signs fold into the kernel as constants
    (hadamard_triton.rht16). One sign vector per run (Recipe.rht_seed): one compile."""
    return (1 << 16) | sum(1 << j for j, s in enumerate(rht.signs.tolist()) if s < 0)


def _build_plan(dtype, device, fmt: OperandFormat, out_dtype) -> _Plan | str:
    block, block_2d, scale, rounding = fmt.block, fmt.block_2d, fmt.scale, fmt.rounding
    rht, keep_padding = fmt.rht, fmt.keep_padding
    try:
        g = get_grid(fmt.grid)
    except ValueError as e:
        return str(e)
    if dtype not in DTYPES:
        return f"dtype {dtype} (kernels cover float32, bfloat16, float16)"
    if out_dtype is not None and out_dtype not in DTYPES:
        return f"out_dtype {out_dtype} (kernels cover float32, bfloat16, float16)"
    if isinstance(block, bool) or block not in BLOCKS:
        return f"block={block!r} (kernels cover blocks {', '.join(map(str, BLOCKS))})"
    if not isinstance(block_2d, bool) or not isinstance(keep_padding, bool):
        return "block_2d/keep_padding that are not bools"
    if scale not in SCALES:
        return f"scale={scale!r}"
    if rounding not in ("rtne", "sr"):
        return f"rounding={rounding!r}"
    if scale == "e4m3" and g.neg_extra is not None:
        return (
            "e4m3 scales on the two's-complement grid (its tensor scale depends on every "
            "block's sign)"
        )
    if rht is not None and not isinstance(rht, RHT):
        return f"rht={rht!r} (pass an RHT)"
    lv = g.levels_tensor()  # the reference's level table (numerics/quantize.py)
    if g.neg_extra is not None:
        lv = torch.cat([lv, lv.new_tensor([g.neg_extra])])
    d = uniform_step(lv) or 0.0  # the reference's own test, on the same table
    if d < 2.0**-60:  # SR's u * d would underflow (rounding_triton._round_stepped_sr)
        d = 0.0
    fp_m = 0 if d else minifloat_mantissa(lv) or 0  # e2m1: rounding within v's binade
    mid = midpoints(lv).to(device)
    lv = torch.cat([lv, lv[-1:]]).to(device)
    sign = rht.signs.to(device) if rht is not None else lv
    log_h = int(math.log2(rht.size)) if rht is not None else 0
    # one set of constexprs of the pipeline (pipeline_triton.py), shared by both kernels
    steps = dict(
        SCALE=SCALES[scale],
        SR=rounding == "sr",
        NLEV=len(lv) - 1,
        ASYM=g.neg_extra is not None,
        D=d,
        INV_D=1.0 / d if d else 0.0,
        FP_M=fp_m,
        EXACT_DIV=INTERPRETED or g.levels[1] < 2.0**-30,
    )
    consts = dict(steps, BLOCK=block, BLOCK_2D=block_2d, LOG_H=log_h)
    consts16 = prefixed = None
    if not block_2d and log_h in (0, 4):  # the 16-tensor kernels apply (1x32: columns only)
        consts16 = dict(steps, RHT=rht16_constexpr(rht) if log_h == 4 else 0, GROUPS=block // 16)
        prefixed = {p: {p + k: v for k, v in consts16.items()} for p in ("A_", "B_")}
    return _Plan(
        fmt=fmt,
        grid=g,
        block=block,
        block_2d=block_2d,
        rht=rht,
        unit=padded_length(1, block, rht),
        keep_padding=keep_padding,
        out_dtype=output_dtype(dtype, rht, out_dtype),
        lv=lv,
        mid=mid,
        sign=sign,
        e4m3=scale == "e4m3",
        scalars=(
            rht.norm if rht is not None else 1.0,
            g.g_max,
            g.neg_extra if g.neg_extra is not None else g.g_max,
        ),
        consts=consts,
        consts16=consts16,
        prefixed=prefixed,
    )


def _is_int(v) -> bool:
    return type(v) is int or (isinstance(v, numbers.Integral) and not isinstance(v, bool))


def is_device_key(seed) -> bool:
    """Whether `seed` is an SR key in device memory: a 1-element int64 tensor (an entry of a
    key table, numerics.philox.operand_keys, drawn by keys_triton.py)."""
    return isinstance(seed, torch.Tensor) and seed.dtype == torch.int64 and seed.numel() == 1


def _call_reason(x, fmt: OperandFormat, seed, origin, segments, tensor_amax) -> str | None:
    """What the kernels refuse in a call's own arguments (shape, seed, origin, segments)."""
    rounding, scale = fmt.rounding, fmt.scale
    if x.dim() != 2:
        return f"a {x.dim()}-D view (kernels take 2D views)"
    if x.numel() == 0:
        return "an empty tensor"
    if is_device_key(seed):
        if seed.device != x.device:
            return f"an SR key on {seed.device} for a tensor on {x.device}"
    elif not (_is_int(seed) and 0 <= seed < SEED_LIMIT):
        return f"seed={seed!r} (an int in [0, 2^63), or a 1-element int64 tensor)"
    if len(origin) != 2 or not (
        _is_int(origin[0]) and _is_int(origin[1]) and origin[0] >= 0 and origin[1] >= 0
    ):
        return f"origin={origin!r} (two non-negative ints)"
    if rounding == "sr" and origin[1] % 4:
        return f"an SR column origin of {origin[1]} (a multiple of 4)"
    if segments is not None:
        if not isinstance(segments, Segments):
            return f"segments={segments!r} (pass numerics.segments.Segments)"
        keyed = "SR" if rounding == "sr" else "e4m3" if scale == "e4m3" else None
        if keyed and any(s % 16 for s in segments.starts):
            return (
                f"{keyed} segments starting at {segments.starts} (the kernels' tables hold "
                "one entry per 16 positions: starts must be multiples of 16)"
            )
        if scale == "e4m3" and tensor_amax is None:  # the reference refuses these too
            return tensor_scale_segments_problem(
                segments,
                block=fmt.block,
                block_2d=fmt.block_2d,
                rht_size=fmt.rht.size if fmt.rht is not None else None,
            )
    return None


def unsupported(
    x: torch.Tensor,
    grid=None,
    *,
    fmt: OperandFormat | None = None,
    seed: int = 0,
    origin: tuple[int, int] = (0, 0),
    tensor_amax=None,
    out_dtype: torch.dtype | None = None,
    segments: Segments | None = None,
    **format_kw,
) -> str | None:
    """None when the kernels reproduce the reference for these arguments (the format as
    fmt=, or a grid and quantize_view's format keywords), else what they do not implement
    (the caller then runs the reference, or, for backend="triton", says so).
    Not implemented: blocks other than 16/32, dtypes other than fp32/bf16/fp16, e4m3 scales
    on the two's-complement grid (its tensor scale depends on every block's sign), empty
    tensors, SR segments that do not start at multiples of 16, and arguments the reference
    itself rejects."""
    fmt, _ = format_of(grid, fmt, format_kw)
    plan = _plan(x.dtype, x.device, fmt, out_dtype)
    if isinstance(plan, str):
        return plan
    return _call_reason(x, plan.fmt, seed, origin, segments, tensor_amax)


def supports(x: torch.Tensor, grid, **kw) -> bool:
    """True when the kernel path reproduces the reference for these arguments."""
    return unsupported(x, grid, **kw) is None


def check_device(x: torch.Tensor) -> None:
    if not x.is_cuda and not INTERPRETED:
        raise ValueError(
            f"backend='triton' needs a CUDA tensor (or TRITON_INTERPRET=1 for the "
            f"CPU interpreter), got a tensor on {x.device}: move it to the GPU or "
            "use backend='auto'"
        )


def _extents(plan: _Plan, shape) -> tuple[int, int]:
    """(length, other) of a [R, C] view: C padded to the plan's unit (blocks, RHT groups),
    and R, padded to whole 2D blocks where blocks are 2D."""
    R, C = shape
    other = _cdiv(R, plan.block) * plan.block if plan.block_2d else R
    return _cdiv(C, plan.unit) * plan.unit, other


def _layout(
    view: torch.Tensor,
    grid=None,
    *,
    fmt: OperandFormat | None = None,
    seed=0,
    origin=(0, 0),
    tensor_amax=None,
    out_dtype=None,
    segments=None,
    strict=True,
    **format_kw,
) -> _Layout | None:
    """The call's layout (its format as fmt=, or a grid and its keywords); for arguments the
    kernels do not implement a ValueError naming them (strict) or None (the caller runs the
    reference)."""
    fmt, _ = format_of(grid, fmt, format_kw)
    plan = _plan(view.dtype, view.device, fmt, out_dtype)
    reason = (
        plan
        if isinstance(plan, str)
        else _call_reason(view, plan.fmt, seed, origin, segments, tensor_amax)
    )
    if reason is not None:
        if not strict:
            return None
        raise ValueError(
            f"the Triton kernels do not implement {reason}: use backend='auto' "
            "(it runs the reference for such arguments) or backend='torch'"
        )
    if _tiles_transpose(view, plan):
        lay = _layout(
            view.t(),
            fmt=plan.fmt,
            origin=(origin[1], origin[0]),
            tensor_amax=tensor_amax,
            out_dtype=out_dtype,
            segments=None
            if segments is None
            else dataclasses.replace(segments, axis=1 - segments.axis),
        )
        return lay._replace(transposed=True)
    check_device(view)
    rounding = plan.fmt.rounding
    length, other = _extents(plan, view.shape)
    # segments key SR, and e4m3's tensor scale (one per segment); otherwise they change nothing
    keyed = segments is not None and (rounding == "sr" or plan.e4m3)
    seg = 1 + segments.axis if keyed else 0
    tables = (
        _segment_tables(
            segments,
            _segmented_extent(segments, length, other),
            view.device,
            sr=rounding == "sr",
        )
        if seg
        else (plan.lv, 1, plan.lv, plan.lv)
    )  # unused without segments
    st = plan.lv
    if plan.e4m3:  # the e4m3 tensor amax, in one pass of a kernel
        if tensor_amax is None:
            tensor_amax = _tensor_amax(view, plan, length, other, segments, tables)
        # the kernels read it and divide it by 448 g_max themselves (block_scales)
        st = tensor_amax.to(torch.float32).reshape(-1)
        if seg and st.numel() == 1:  # one tensor amax given for every segment
            st = st.expand(len(segments.starts)).contiguous()
    # the view's own seed: only SR without segments reads it (a device key in place)
    seed_ptr = int(seg == 0 and rounding == "sr" and isinstance(seed, torch.Tensor))
    seed_arg = seed if seed_ptr else 0 if isinstance(seed, torch.Tensor) else int(seed)
    args = (
        plan.lv,
        plan.mid,
        st,
        plan.sign,
        *plan.scalars,
        seed_arg,
        int(origin[0]),
        int(origin[1]),
        *tables,
    )
    out_len = length if plan.keep_padding else view.shape[1]
    whole_blocks = seg != 2 or all(s % plan.block == 0 for s in segments.starts)
    return _Layout(plan, args, length, other, out_len, seg, seed_ptr, whole_blocks)


_SEGMENT_TABLES: dict = {}
_UNREAD_SEEDS: dict = {}


def _segment_tables(segments: Segments, length: int, device, *, sr: bool = True) -> tuple:
    """(idx, n16, seeds, starts) of segments over `length` positions along their axis: the
    segment of every 16 positions (int32, n16 entries; segments_triton.py clamps positions
    past it), each segment's seed (int64) and start (int32). The first two and the last
    depend on the layout only and are cached; the seeds change every call under SR (copied
    from the host, or a device key table's row used in place). Without SR (segments there
    only pick e4m3 tensor scales) no kernel reads a seed: a cached table of zeros stands in,
    with no copy from the host per call."""
    idx, n16, starts = _static_segment_tables(segments, length, device)
    if isinstance(segments.seeds, torch.Tensor):  # a key table's row: read in place
        seeds = segments.seeds.to(device)
    elif not sr:
        n = len(segments.starts)
        seeds = _bounded_cache(
            _UNREAD_SEEDS,
            (n, str(device)),
            lambda: torch.zeros(n, dtype=torch.int64, device=device),
        )
    else:
        seeds = _to_device(torch.tensor(segments.seeds, dtype=torch.int64), device)
    return idx, n16, seeds, starts


def _bounded_cache(cache: dict, key, make):
    """cache[key], made by make() where missing. Segment layouts change with routing, so a
    cache past 256 entries starts over instead of growing without bound."""
    value = cache.get(key)
    if value is None:
        if len(cache) > 256:
            cache.clear()
        value = cache[key] = make()
    return value


def _segmented_extent(segments: Segments, length: int, other: int) -> int:
    """The extent of the axis segments cut, of a view with `length` along its blocks and
    `other` across them: row segments (axis 0) cut across the blocks."""
    return other if segments.axis == 0 else length


def _static_segment_tables(segments: Segments, length: int, device) -> tuple:
    """(idx, n16, starts): _segment_tables' parts that depend on the layout only, cached."""
    n16 = max(1, -(-length // 16))

    def make():
        idx = segments.index(torch.arange(n16, dtype=torch.int64) * 16).to(torch.int32)
        starts = torch.tensor(segments.starts, dtype=torch.int32)
        return _to_device(idx, device), _to_device(starts, device)

    idx, starts = _bounded_cache(_SEGMENT_TABLES, (segments.starts, n16, str(device)), make)
    return idx, n16, starts


def _to_device(t: torch.Tensor, device) -> torch.Tensor:
    device = torch.device(device)
    if device.type != "cuda":
        return t.to(device)
    # pinned + non_blocking: a pageable copy would synchronise the stream with the host
    return t.pin_memory().to(device, non_blocking=True)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _orient(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(row-major tensor t, along_rows): a transposed view of a row-major tensor (x.t() with
    stride (1, n)) is quantized along t's rows, so loads and stores stay coalesced."""
    if x.stride(0) == 1 and x.stride(1) != 1 and x.shape[0] > 1:
        return x.t(), True
    return (x if x.stride(1) == 1 or x.shape[1] == 1 else x.contiguous()), False


def _tiles_transpose(view: torch.Tensor, plan: _Plan) -> bool:
    """Whether the column layout of `view` (a transposed view of a row-major tensor) is the
    transpose of the row layout of that tensor: square 2D tiles, unrotated, rounded to
    nearest (SR keys an element by its position in the view), every tile whole (no padding
    along either dim). The tiles then hold the same elements and take the same scales and
    rounding, so the row layout gives the same bits, and the generic kernel's row layout
    runs faster than its column layout, which transposes every tile in registers (NVFP4's
    16x16 weight tiles along columns: 71% of the copy bandwidth that way, 89% this way on an
    H100, docs/performance.md). Such a call's `tiles` are then its "row" entry."""
    R, C = view.shape
    return (
        plan.block_2d
        and plan.rht is None
        and plan.fmt.rounding == "rtne"
        and R % plan.block == 0
        and C % plan.block == 0
        and view.stride(0) == 1
        and view.stride(1) != 1
        and R > 1
    )


def _takes16(lay: _Layout, along_rows: bool) -> bool:
    """Whether a layout runs the 16-tensor kernels: 1x16 blocks (RHT16 or none) in either
    layout; 1x32 blocks in the column layout, unless a segment starts inside a block (the
    kernel keys a block's SR bits by the segment of its first element)."""
    if lay.plan.consts16 is None:
        return False
    return lay.plan.block == 16 or (along_rows and lay.whole_blocks)


def _tile16_name(plan: _Plan, along_rows: bool) -> str:
    """The TILES16 entry (and `tiles=` key) of a 16-tensor job."""
    return ("col16" if plan.block == 16 else "col32") if along_rows else "row16"


def _grid16(lay: _Layout, along_rows: bool, shape, tile) -> tuple[tuple[int, int], int, int, int]:
    """((n0, n1) programs, t0, t1, warps) of a 16-tensor job on row-major [A, B]."""
    A, B = shape
    t0, t1, warps = tile or TILES16[_tile16_name(lay.plan, along_rows)]
    blocks = lay.length // lay.plan.block
    n = (_cdiv(blocks, t0), _cdiv(B, t1)) if along_rows else (_cdiv(A, t0), _cdiv(blocks, t1))
    return n, t0, t1, warps


def _job16(t: torch.Tensor, lay: _Layout, along_rows: bool, tile):
    """(output, its returned view, program grid (n0, n1), warps, runtime args, tile) of one
    16-tensor job on row-major t [A, B]: along_rows=False quantizes along B ([A, B'] out),
    True along A ([B, A'] view out)."""
    A, B = t.shape
    n, t0, t1, warps = _grid16(lay, along_rows, t.shape, tile)
    shape = (lay.out_len, B) if along_rows else (A, lay.out_len)
    out = torch.empty(shape, dtype=lay.plan.out_dtype, device=t.device)
    view = out.t() if along_rows else out
    return out, view, n, warps, (t, t.stride(0), A, B, out, lay.out_len, *lay.args), (t0, t1)


def _launch16(t: torch.Tensor, lay: _Layout, along_rows: bool, tile=None) -> torch.Tensor:
    """One layout of row-major t [A, B] through the 16-tensor kernels (quantize16_triton)."""
    _, view, n, warps, args, (t0, t1) = _job16(t, lay, along_rows, tile)
    if along_rows:
        launch(
            k16._col16_kernel,
            n,
            *args,
            BG=t0,
            BB=t1,
            num_warps=warps,
            INTERP=INTERPRETED,
            SEG=lay.seg,
            SEED_PTR=lay.seed_ptr,
            **lay.plan.consts16,
        )
    else:
        launch(
            k16._row16_kernel,
            n,
            *args,
            BR=t0,
            BG=t1,
            num_warps=warps,
            INTERP=INTERPRETED,
            SEG=lay.seg,
            SEED_PTR=lay.seed_ptr,
            **lay.plan.consts16,
        )
    return view


def _generic_grid(shape, plan: _Plan, length: int, other: int, along_rows: bool, tile=None):
    """(BA, BB, warps, program grid) of the generic tile kernels on row-major [A, B]: tiles
    widened to the padding unit along the quantized dim; the grid covers the padded lengths
    (length along the quantized dim, other along the other one)."""
    A, B = shape
    ba, bb, warps = tile or TILES["col" if along_rows else "row"]
    # 2D blocks: the tile spans exactly one block along the other dim (scaling_triton's
    # _tile_reduce reduces over it without a reshape that compiles to a replicated layout)
    if along_rows:  # the tile's quantized dim is A
        ba, bb = max(ba, plan.unit), plan.block if plan.block_2d else bb
        a_len, b_len = max(A, length), max(B, other)
    else:
        ba, bb = plan.block if plan.block_2d else ba, max(bb, plan.unit)
        a_len, b_len = max(A, other), max(B, length)
    return ba, bb, warps, (_cdiv(a_len, ba), _cdiv(b_len, bb))


def _launch(t: torch.Tensor, lay: _Layout, along_rows: bool, tile=None) -> torch.Tensor:
    """One layout of row-major t [A, B] through the generic tile kernel (quantize_triton):
    along B ([A, B'] out) or, along_rows, along A (the [B, A'] view of its output)."""
    A, B = t.shape
    plan = lay.plan
    ba, bb, warps, grid = _generic_grid(t.shape, plan, lay.length, lay.other, along_rows, tile)
    shape = (lay.out_len, B) if along_rows else (A, lay.out_len)
    out = torch.empty(shape, dtype=plan.out_dtype, device=t.device)
    launch(
        _qdq_kernel,
        grid,
        t,
        t.stride(0),
        A,
        B,
        out,
        lay.out_len,
        *lay.args,
        BA=ba,
        BB=bb,
        COL=along_rows,
        SEG=lay.seg,
        SEED_PTR=lay.seed_ptr,
        INTERP=INTERPRETED,
        num_warps=warps,
        **plan.consts,
    )
    return out.t() if along_rows else out


_SEGMENT_POSITIONS: dict = {}
AMAX16_TILE = TILES16["col16"]  # (groups of 16 rows, cols, warps) of the 16-tensor amax kernels


def _amax16_grid(shape, unit: int = 1):
    """(BG, BB, warps, program grid) of the 16-tensor amax kernels on row-major [A, B]: the
    col16 QDQ kernel's tile, its columns widened to `unit` (the pair's row blocks)."""
    bg, bb, warps = AMAX16_TILE
    bb = max(bb, unit)
    return bg, bb, warps, (_cdiv(_cdiv(shape[0], 16), bg), _cdiv(shape[1], bb))


def _tensor_amax(
    view: torch.Tensor,
    plan: _Plan,
    length: int,
    other: int,
    segments: Segments | None = None,
    tables=None,
    generic: bool = False,
) -> torch.Tensor:
    """e4m3's tensor amax of a view in one read (amax_triton.py), bit for bit the
    reference's: a fp32 device scalar (numerics.quantize.e4m3_tensor_amax), or with segments
    one per segment (numerics.segments.segment_tensor_amax; `tables` are the layout's
    segment tables): the generic kernel reduces segments of view rows itself (an atomic max
    per 16 rows); otherwise the kernel keeps a maximum per view row or per block column,
    reduced per segment by one scatter, a few launches whatever the number of segments. The
    column layout of 1x16 blocks (RHT16 or none) takes the 16-tensor kernel, unless
    `generic`."""
    t, along_rows = _orient(view)
    keep = 0 if segments is None else 1 + segments.axis
    col16 = along_rows and plan.consts16 is not None and plan.block == 16 and not generic
    if col16:
        bg, bb, warps, grid = _amax16_grid(t.shape)
        ba = 16 * bg
    else:
        ba, bb, warps, grid = _generic_grid(t.shape, plan, length, other, along_rows)
    # the view's extent the programs cover: (programs, tile) along its rows and its columns
    (n_r, tile_r), (n_c, tile_c) = (
        ((grid[1], bb), (grid[0], ba)) if along_rows else ((grid[0], ba), (grid[1], bb))
    )
    n_pos, n_other = {
        0: (1, grid[0] * grid[1]),
        1: (n_r * tile_r, n_c),
        2: (n_c * tile_c // plan.block, n_r),
    }[keep]
    # segments of view rows start at multiples of 16 (the tables' unit): each group of 16
    # rows in a tile lies in one, and the kernel takes its maximum into it
    atomic = keep == 1 and not col16 and tile_r % 16 == 0
    if atomic:  # atomic maxima start from 0, every amax's least value
        partial = torch.zeros(len(segments.starts), dtype=torch.float32, device=t.device)
    else:
        partial = torch.empty(n_other * n_pos, dtype=torch.float32, device=t.device)
    if col16:
        kernel, args = _tensor_amax16_kernel, (plan.scalars[0], partial)
        consts = dict(BG=bg, BB=bb, COL_RHT=plan.consts16["RHT"])
    else:
        kernel = _tensor_amax_kernel
        # the segment table where the kernel reduces segments, else unread stand-ins
        args = (plan.sign, plan.scalars[0], partial, *(tables[:2] if atomic else (partial, 1)))
        consts = dict(
            BA=ba,
            BB=bb,
            COL=along_rows,
            BLOCK=plan.block,
            BLOCK_2D=plan.block_2d,
            LOG_H=plan.consts["LOG_H"],
        )
    launch(
        kernel,
        grid,
        t,
        t.stride(0),
        t.shape[0],
        t.shape[1],
        *args,
        KEEP=3 if atomic else keep,
        num_warps=warps,
        **consts,
    )
    if segments is None:
        return partial.amax()
    if atomic:
        return partial
    per_position = partial.view(n_other, n_pos).amax(0)
    idx16, n16 = tables[0], tables[1]
    key = (segments.starts, n_pos, n16, keep, plan.block, str(t.device))

    def owners():  # the segment of each row / block column: the layout's, cached
        step = 1 if keep == 1 else plan.block  # block column k starts at view column k B
        at = torch.arange(n_pos, device=t.device) * step // 16
        return idx16[at.clamp(max=n16 - 1)].to(torch.int64)

    owner = _bounded_cache(_SEGMENT_POSITIONS, key, owners)
    seg = torch.zeros(len(segments.starts), dtype=torch.float32, device=t.device)
    return seg.scatter_reduce_(0, owner, per_position, "amax")


PAIR_TILE = (64, 64, 4)  # (rows, cols, warps) of _tensor_amax_pair_kernel, widened to units


def tensor_amax(
    view: torch.Tensor,
    fmt: OperandFormat,
    *,
    segments: Segments | None = None,
    generic: bool = False,
) -> torch.Tensor:
    """The e4m3 tensor amax a quantization of `view` in format `fmt` takes (one pass of the
    amax kernel): numerics.quantize.e4m3_tensor_amax's value bit for bit, a fp32 device
    scalar; with `segments` one per segment, fp32 [segments], what quantize_view(view,
    fmt=fmt, segments=segments) takes (the `tensor_amax=` to give it). A format or segments
    the kernels do not cover raise ValueError naming what. generic: the generic kernel even
    where the 16-tensor one applies (1x16 column blocks; the same value, the amax benchmark
    times one against the other)."""
    plan = _plan(view.dtype, view.device, fmt, None)
    reason = (
        plan if isinstance(plan, str) else _call_reason(view, plan.fmt, 0, (0, 0), segments, None)
    )
    if reason is not None:
        raise ValueError(f"the Triton kernels do not implement {reason}")
    check_device(view)
    length, other = _extents(plan, view.shape)
    tables = (
        None
        if segments is None
        else _static_segment_tables(
            segments, _segmented_extent(segments, length, other), view.device
        )
    )  # _layout's tables (idx and n16), without the seeds an amax does not read
    return _tensor_amax(view, plan, length, other, segments, tables, generic=generic)


def tensor_amax_pair(
    t: torch.Tensor,
    row_fmt: OperandFormat,
    col_fmt: OperandFormat,
    *,
    starts: tuple[int, ...] | None = None,
    generic: bool = False,
) -> torch.Tensor | None:
    """The e4m3 tensor amax of a 2-D tensor t for two quantizations in one read: along its
    rows' length as `row_fmt` (the view t) and along its columns as `col_fmt` (the view
    t.t()), as fp32 [2]; each bit for bit what quantize_view computes for its view (the
    `tensor_amax=` to give it). None where the pass does not apply (a format without e4m3
    scales, a layout the kernels do not cover, a strided t): the quantizations then take
    their own amax passes. Square 2D tiles of one size, unrotated, in both layouts (NVFP4's
    weight for fprop and dgrad) are the same tiles, so the same amax: one pass of the amax
    kernel gives it for both. generic: the generic pair kernel even where the 16-tensor one
    applies (the same values; the amax benchmark times one against the other).

    starts: t's rows cut into segments starting there (a grouped GEMM's experts' tokens):
    fp32 [2, segments], one amax per segment for each quantization, what quantize_view takes
    with Segments(0, starts, ...) on t and Segments(1, starts, ...) on t.t(). Only the
    16-tensor pass takes segments (NVFP4's x and dY, segments starting at multiples of 16);
    elsewhere None."""
    if t.dim() != 2 or t.stride(1) != 1 or t.shape[1] == 1:
        return None
    if starts is not None and any(s % 16 for s in starts):
        return None
    plans = []
    for axis, fmt, view in ((0, row_fmt, t), (1, col_fmt, t.t())):
        plan = _plan(t.dtype, t.device, fmt, None)
        if isinstance(plan, str) or not plan.e4m3:
            return None
        segments = None if starts is None else Segments(axis, starts, (0,) * len(starts))
        if _call_reason(view, plan.fmt, 0, (0, 0), segments, None) is not None:
            return None
        plans.append(plan)
    check_device(t)
    row, col = plans
    tiles_2d = row.block_2d or col.block_2d
    # NVFP4's x and dY: an unrotated row layout, 1x16 column blocks
    takes16 = (
        not tiles_2d
        and row.rht is None
        and col.consts16 is not None
        and col.block == 16
        and not generic
    )
    if starts is not None:  # only the 16-tensor pass keeps a maximum per segment
        return _tensor_amax_pair16(t, row, col, starts) if takes16 else None
    if tiles_2d:
        if not row.fmt.same_tiles(col.fmt):
            return None
        return _tensor_amax(t, row, *_extents(row, t.shape)).expand(2)
    if takes16:
        return _tensor_amax_pair16(t, row, col)
    A, B = t.shape
    ba, bb, warps = PAIR_TILE
    ba, bb = max(ba, col.unit), max(bb, row.unit)
    grid = (_cdiv(A, ba), _cdiv(B, bb))
    partial = torch.empty((2, grid[0] * grid[1]), dtype=torch.float32, device=t.device)
    launch(
        _tensor_amax_pair_kernel,
        grid,
        t,
        t.stride(0),
        A,
        B,
        row.sign,
        row.scalars[0],
        col.sign,
        col.scalars[0],
        partial,
        BA=ba,
        BB=bb,
        ROW_BLOCK=row.block,
        ROW_LOG_H=row.consts["LOG_H"],
        COL_BLOCK=col.block,
        COL_LOG_H=col.consts["LOG_H"],
        num_warps=warps,
    )
    return partial.amax(1)


def _tensor_amax_pair16(
    t: torch.Tensor, row: _Plan, col: _Plan, starts: tuple[int, ...] | None = None
) -> torch.Tensor:
    """tensor_amax_pair's two amaxes of t through the 16-tensor layout: an unrotated row
    layout and a column layout of 1x16 blocks, RHT16 or none (amax_triton.py); with
    `starts`, per segment of rows ([2, segments], reduced in the kernel)."""
    A, B = t.shape
    bg, bb, warps, grid = _amax16_grid(t.shape, row.unit)
    if starts is None:
        partial = torch.empty((2, grid[0] * grid[1]), dtype=torch.float32, device=t.device)
        seg_args = (partial, 1, 0)  # the index table is not read
    else:  # the atomic maxima start from 0, every amax's least value
        partial = torch.zeros((2, len(starts)), dtype=torch.float32, device=t.device)
        segments = Segments(0, starts, (0,) * len(starts))
        idx16, n16, _ = _static_segment_tables(segments, A, t.device)
        seg_args = (idx16, n16, len(starts))
    launch(
        _tensor_amax_pair16_kernel,
        grid,
        t,
        t.stride(0),
        A,
        B,
        row.sign,
        row.scalars[0],
        col.scalars[0],
        partial,
        *seg_args,
        BG=bg,
        BB=bb,
        ROW_BLOCK=row.block,
        COL_RHT=col.consts16["RHT"],
        SEG=starts is not None,
        num_warps=warps,
    )
    return partial.amax(1) if starts is None else partial


def quantize_view(
    x: torch.Tensor, grid=None, *, tiles=None, strict: bool = True, **kw
) -> torch.Tensor | None:
    """Kernel twin of numerics.quantize.quantize_view: same arguments, same values (or the
    format as one fmt=OperandFormat in place of the grid and its keywords).

    A transposed view of a row-major tensor (x.t() with stride (1, n)) runs the column
    layout on the tensor itself, so column-wise quantization reads and writes coalesced; the
    result is then a transposed view too. 1x16 blocks with RHT16 (or none) take the
    16-tensor kernels, and 1x32 blocks do in the column layout; `tiles` overrides tile shapes
    per layout ("row", "col" force the generic kernel, "row16", "col16", "col32" shape the
    others; square unrotated RTNE tiles along columns run the row layout, `_tiles_transpose`).
    Arguments the kernels do not implement (`unsupported` says which) raise ValueError, or
    return None with strict=False.
    """
    lay = _layout(x, grid, strict=strict, **kw)
    if lay is None:
        return None
    return _quantize_laid_out(x, lay, tiles)


def _quantize_laid_out(x: torch.Tensor, lay: _Layout, tiles=None) -> torch.Tensor:
    """quantize_view once its layout is computed (quantize_pair reuses its two layouts: an
    e4m3 layout holds the tensor amax, a pass over the whole operand)."""
    if lay.transposed:
        return _quantize_laid_out(x.t(), lay._replace(transposed=False), tiles).t()
    t, along_rows = _orient(x)
    tiles = tiles or {}
    generic = "col" if along_rows else "row"
    if _takes16(lay, along_rows) and generic not in tiles:
        return _launch16(t, lay, along_rows, tiles.get(_tile16_name(lay.plan, along_rows)))
    return _launch(t, lay, along_rows, tiles.get(generic))


def quantize_pair(
    a: torch.Tensor, a_kw: dict, b: torch.Tensor, b_kw: dict, *, tiles=None, strict: bool = True
):
    """(quantize_view(a, **a_kw), quantize_view(b, **b_kw)), each operand's format in its kw
    dict (fmt=, or grid and its keywords).

    When both take the 16-tensor kernels (UFP4's and E2M1's operands: 1x16 blocks, RHT16 or
    none) the two jobs run in one launch (`_pair16_kernel`), bit for bit what two launches
    give; otherwise two launches. With strict=False, None when the kernels do not implement
    either operand's arguments (nothing was launched)."""
    la, lb = _layout(a, strict=strict, **a_kw), _layout(b, strict=strict, **b_kw)
    if la is None or lb is None:
        return None
    ta, a_rows = _orient(a)
    tb, b_rows = _orient(b)
    tiles = tiles or {}
    forced = "row" in tiles or "col" in tiles
    if not (_takes16(la, a_rows) and _takes16(lb, b_rows)) or forced:
        return _quantize_laid_out(a, la, tiles), _quantize_laid_out(b, lb, tiles)
    _, va, na, wa, args_a, (a0, a1) = _job16(
        ta, la, a_rows, tiles.get(_tile16_name(la.plan, a_rows))
    )
    _, vb, nb, wb, args_b, (b0, b1) = _job16(
        tb, lb, b_rows, tiles.get(_tile16_name(lb.plan, b_rows))
    )
    if wa != wb:  # one launch has one warp count
        return _quantize_laid_out(a, la, tiles), _quantize_laid_out(b, lb, tiles)
    programs_a = na[0] * na[1]
    launch(
        k16._pair16_kernel,
        (programs_a + nb[0] * nb[1],),
        *args_a,
        na[1],
        programs_a,
        *args_b,
        nb[1],
        A_COL=a_rows,
        A_T0=a0,
        A_T1=a1,
        A_SEG=la.seg,
        A_SEED_PTR=la.seed_ptr,
        **la.plan.prefixed["A_"],
        B_COL=b_rows,
        B_T0=b0,
        B_T1=b1,
        B_SEG=lb.seg,
        B_SEED_PTR=lb.seed_ptr,
        **lb.plan.prefixed["B_"],
        INTERP=INTERPRETED,
        num_warps=wa,
    )
    return va, vb


# ----------------------------------------------------------------------------- prepared launches
# The host path of a training step calls the same GEMMs with the same shapes every
# micro-batch: only the data and the SR keys change. A PreparedQDQ does once what every
# quantize_pair call above redoes (the layouts' checks and arguments, the program grid, the
# kernel's launch key) and then costs per call the outputs' allocation and one launcher call.


class PreparedQDQ:
    """One or two GEMM operands quantized by one launch of the 16-tensor kernels, for calls
    whose operands keep the shapes, strides, dtype, device and settings of the call it was
    built from (the caller keys it by them: quant/ops.py). Operand i is a row-major tensor t_i
    [A, B] quantized along B, or along A when along_rows[i] (then its output is [A', B],
    the transposed layout: a GEMM operand in natural orientation either way). Only the SR
    keys differ per call: a host int, or a device key given as (tensor, element offset)
    (SEED_PTR); each operand's kind is the building call's. Bit for bit what quantize_pair
    returns: the same kernels, arguments and tiles (tests/kernels/test_prepared.py)."""

    def __init__(self, tensors, along_rows, kws, seeds):
        self.along_rows = tuple(along_rows)
        jobs, self.kinds = [], []
        for t, rows, kw, seed in zip(tensors, along_rows, kws, seeds):
            if getattr(kw.get("fmt"), "scale", None) == "e4m3":  # before _layout's amax pass
                raise ValueError("e4m3 scales")
            view = t.t() if rows else t
            key = seed if isinstance(seed, int) else _key_view(*seed)
            lay = _layout(view, seed=key, **kw)
            if not _takes16(lay, rows) or lay.seg or lay.plan.e4m3:
                raise ValueError("not a 16-tensor job without segments or e4m3 scales")
            n, t0, t1, warps = _grid16(lay, rows, t.shape, None)
            A, B = t.shape
            shape = (lay.out_len, B) if rows else (A, lay.out_len)
            args = [None, t.stride(0), A, B, None, lay.out_len, *lay.args]
            args[13] = None  # the seed: per call
            jobs.append((lay, n, warps, t0, t1, shape, args))
            self.kinds.append(lay.seed_ptr)
        self.shapes = [j[5] for j in jobs]
        self.out_dtypes = [j[0].plan.out_dtype for j in jobs]
        self.device = tensors[0].device
        if len(jobs) == 1:
            lay, n, warps, t0, t1, _, args = jobs[0]
            self.kernel = k16._col16_kernel if along_rows[0] else k16._row16_kernel
            tiles = dict(BG=t0, BB=t1) if along_rows[0] else dict(BR=t0, BG=t1)
            self.grid = n
            self.kwargs = dict(
                tiles,
                num_warps=warps,
                INTERP=INTERPRETED,
                SEG=0,
                SEED_PTR=lay.seed_ptr,
                **lay.plan.consts16,
            )
            self.template = args
            self.slots = ((0, 4, 13),)
        else:
            (la, na, wa, a0, a1, _, args_a), (lb, nb, wb, b0, b1, _, args_b) = jobs
            if wa != wb:
                raise ValueError("the two jobs need different warp counts")
            programs_a = na[0] * na[1]
            self.kernel = k16._pair16_kernel
            self.grid = (programs_a + nb[0] * nb[1],)
            self.kwargs = dict(
                A_COL=along_rows[0],
                A_T0=a0,
                A_T1=a1,
                A_SEG=0,
                A_SEED_PTR=la.seed_ptr,
                **la.plan.prefixed["A_"],
                B_COL=along_rows[1],
                B_T0=b0,
                B_T1=b1,
                B_SEG=0,
                B_SEED_PTR=lb.seed_ptr,
                **lb.plan.prefixed["B_"],
                INTERP=INTERPRETED,
                num_warps=wa,
            )
            self.template = [*args_a, na[1], programs_a, *args_b, nb[1]]
            off = len(args_a) + 2
            self.slots = ((0, 4, 13), (off, off + 4, off + 13))
        self._launches: dict = {}

    def __call__(self, tensors, seeds) -> list[torch.Tensor]:
        """The quantized operands, in natural orientation (module docstring)."""
        aligned = tuple(t.data_ptr() % 16 == 0 for t in tensors)
        classes = tuple(
            _spec(s) if isinstance(s, int) else (s[0].data_ptr() + 8 * s[1]) % 16 for s in seeds
        )
        key = (aligned, classes)
        prepared = self._launches.get(key)
        if prepared is None:
            if len(self._launches) > 64:  # seed classes are few; never grow without bound
                self._launches.clear()
            prepared = self._launches[key] = Prepared(self.kernel, self.grid, self.kwargs)
        ready = prepared.ready
        args = self.template.copy()
        outs = []
        for (i_t, i_out, i_seed), t, seed, shape, dtype in zip(
            self.slots, tensors, seeds, self.shapes, self.out_dtypes
        ):
            out = torch.empty(shape, dtype=dtype, device=self.device)
            args[i_t], args[i_out] = t, out
            if isinstance(seed, int):
                args[i_seed] = seed
            else:  # a device key: its address once the launcher is direct, else a view
                args[i_seed] = seed[0].data_ptr() + 8 * seed[1] if ready else _key_view(*seed)
            outs.append(out)
        prepared(*args)
        return outs


def _key_view(table: torch.Tensor, offset: int) -> torch.Tensor:
    """The 1-element view of `table`'s element at storage offset `offset` from its own."""
    return torch.as_strided(table, (1,), (1,), table.storage_offset() + offset)


def prepare(tensors, along_rows, kws, seeds) -> PreparedQDQ | None:
    """A PreparedQDQ for these operands, or None where they need more than the prepared path
    does (other kernels, segments, e4m3 tensor scales, different warp counts, or arguments the
    kernels refuse): the caller then takes quantize_view / quantize_pair."""
    try:
        return PreparedQDQ(tensors, along_rows, kws, seeds)
    except ValueError:
        return None

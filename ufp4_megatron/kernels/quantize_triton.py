"""Triton twin of numerics/quantize.py: fused (RHT ->) amax -> scale -> round -> dequantize.

Entry points: supports, quantize_view, quantize_dual. 1x16 blocks with RHT16 or none (the
UFP4 and E2M1 operands) run the 16-tensor kernels of quantize16_triton.py; everything else
(blocks of 32, 2D tiles, RHT 32-128, both layouts at once) runs the generic kernel here.
The generic kernel reads a tile of a row-major [A, B] tensor once and writes one or both layouts:
  row  quantized along B (the last dim): output [A, B or Bp], row-major;
  col  quantized along A (dim 0; the wgrad operands): output stored [A or Ap, B] row-major
       and returned as its transpose, a [B, A or Ap] view, the reference's [R, C] layout.
Each layout has its own spec (grid, block, scale, rounding, RHT, seed, origin). In a layout's
own view coordinates (r, c) every step is the reference's (docs/architecture.md): a column
layout runs the same tile code on the transposed tile. Tiles align with blocks, 2D tiles and
RHT groups, so every reduction stays inside one program; padding is loaded as zeros.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..numerics.grids import get_grid
from ..numerics.hadamard import RHT
from ..numerics.quantize import padded_length
from ..numerics.rounding import midpoints
from ..numerics.scaling import E4M3_MAX
from .hadamard_triton import rht_rows
from .rounding_triton import round_rtne, round_sr, round_uniform_rtne, round_uniform_sr
from .scaling_triton import block_amax, block_negative_extreme, block_scale, expand

SCALES = {"fp32": 0, "e4m3": 1, "e8m0": 2}
BLOCKS = (16, 32)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# (rows, cols, warps) of a tile of the [A, B] input per mode; widened to the spec's unit.
TILES = {"row": (16, 128, 4), "col": (128, 16, 4), "dual": (64, 32, 4)}  # H200 sweep


@triton.jit
def _uniform(seed, r, c4, BR: tl.constexpr, BC: tl.constexpr):
    """u = (bits >> 8) * 2^-24 per element; element (r, c) uses Philox counter (c >> 2, r, 0, 0)
    and word c & 3. r: [BR, 1] global rows; c4: [1, BC // 4] global column groups."""
    c0 = tl.broadcast_to(c4, (BR, BC // 4)).to(tl.uint32)
    c1 = tl.broadcast_to(r, (BR, BC // 4)).to(tl.uint32)
    z = tl.zeros((BR, BC // 4), tl.uint32)
    w0, w1, w2, w3 = tl.philox(seed, c0, c1, z, z)
    bits = tl.reshape(tl.join(tl.join(w0, w2), tl.join(w1, w3)), (BR, BC))
    return (bits >> 8).to(tl.float32) * 5.9604644775390625e-08


@triton.jit
def _cast_out(y, ptr, INTERP: tl.constexpr):
    """fp32 -> the output dtype, RTNE. In the CPU interpreter (which truncates fp32 -> bf16)
    bf16 is rounded on the bit pattern first, so the cast after it is exact."""
    if INTERP and ptr.dtype.element_ty == tl.bfloat16:
        bits = y.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        y = tl.where(y != y, y, bits.to(tl.float32, bitcast=True))
    return y.to(ptr.dtype.element_ty)


@triton.jit
def _div_fast(a, b, y):
    """RN(a / b) given y = RN(1 / b): q = a * y is within an ulp, the residual a - b q is
    exact (fma), and q + r y rounds to RN(a / b) (Markstein's theorem) when no intermediate
    underflows; the second correction is idempotent and only adds margin."""
    q = a * y
    r = tl.fma(-b, q, a)
    q = tl.fma(r, y, q)
    r = tl.fma(-b, q, a)
    return tl.fma(r, y, q)


@triton.jit
def _qdq_tile(x, r, c_start, c_org, seed, lv_ptr, mid_ptr, st_ptr, sign_ptr, norm, gmax, gneg,
              BR: tl.constexpr, BC: tl.constexpr, B: tl.constexpr, BLOCK_2D: tl.constexpr,
              SCALE: tl.constexpr, SR: tl.constexpr, LOG_H: tl.constexpr,
              NLEV: tl.constexpr, ASYM: tl.constexpr, D: tl.constexpr, INV_D: tl.constexpr,
              EXACT_DIV: tl.constexpr):
    """Fake-quantize x [BR, BC] (fp32) along axis 1. r: [BR, 1] global view rows; the tile's
    first view column is c_start (local), c_org + c_start (global). D > 0: uniform grid of
    step D (rounding by rint/floor); EXACT_DIV: divide with div_rn everywhere."""
    if LOG_H > 0:
        signs = tl.load(sign_ptr + tl.arange(0, BC) % (1 << LOG_H))[None, :]
        x = rht_rows(x, signs, norm, BR, BC, LOG_H)
    amax = block_amax(x, BR, BC, B, BLOCK_2D)
    if ASYM:  # two's complement: a block led by a negative value may reach -gneg
        g = tl.where(block_negative_extreme(x, BR, BC, B, BLOCK_2D), gneg, gmax)
    else:
        g = gmax
    s_t = 0.0
    if SCALE == 1:
        s_t = tl.load(st_ptr)
    sb = block_scale(amax, g, s_t, SCALE)
    sb = tl.where(tl.abs(sb) < float("inf"), sb, float("nan"))  # NaN/Inf block -> all NaN
    s = expand(sb, BR, BC, B)
    a = tl.abs(x)
    if EXACT_DIV:
        v = tl.where(s > 0, tl.math.div_rn(a, tl.where(s > 0, s, 1.0)), 0.0)
    else:  # one exact reciprocal per block; s == 0 or NaN gives y = 0, so v = 0 (or NaN)
        yb = tl.where(sb > 0, tl.math.div_rn(tl.full(sb.shape, 1.0, tl.float32),
                                              tl.where(sb > 0, sb, 1.0)), 0.0)
        v = _div_fast(a, s, expand(yb, BR, BC, B))
        # outside the theorem's range (tiny or huge scales; for SR, where only v > 0 of a
        # tiny quotient decides, tiny quotients too) the whole tile divides with div_rn
        bad = expand((sb > 0) & ((sb < 8.673617379884035e-19) | (sb > 1.152921504606847e18)),
                     BR, BC, B)
        if SR:
            bad = bad | ((a > 0) & (v < 7.888609052210118e-31))
        if tl.max(bad.to(tl.int32)) > 0:
            v = tl.where(s > 0, tl.math.div_rn(a, tl.where(s > 0, s, 1.0)), 0.0)
    neg = x < 0
    if ASYM:
        v = tl.minimum(v, tl.where(neg, gneg, gmax))
    else:
        v = tl.minimum(v, gmax)
    if SR:
        c4 = (c_start + c_org) // 4 + tl.arange(0, BC // 4)[None, :]
        u = _uniform(seed, r, c4, BR, BC)
        if D > 0:
            q = round_uniform_sr(v, u, gneg, D, INV_D)
        else:
            q = round_sr(v, u, lv_ptr, NLEV)
    elif D > 0:
        q = round_uniform_rtne(v, D, INV_D)
    else:
        q = round_rtne(v, lv_ptr, mid_ptr, NLEV)
    mag = q * s
    return tl.where(neg, -mag, mag)


@triton.jit
def _qdq_kernel(x_ptr, stride_a, A, B,
                row_ptr, row_len, r_lv, r_mid, r_st, r_sign, r_norm, r_gmax, r_gneg, r_seed,
                r_org0, r_org1,
                col_ptr, col_len, c_lv, c_mid, c_st, c_sign, c_norm, c_gmax, c_gneg, c_seed,
                c_org0, c_org1,
                BA: tl.constexpr, BB: tl.constexpr, ROW: tl.constexpr, COL: tl.constexpr,
                R_B: tl.constexpr, R_2D: tl.constexpr, R_SCALE: tl.constexpr,
                R_SR: tl.constexpr, R_LOGH: tl.constexpr, R_NLEV: tl.constexpr,
                R_ASYM: tl.constexpr,
                C_B: tl.constexpr, C_2D: tl.constexpr, C_SCALE: tl.constexpr,
                C_SR: tl.constexpr, C_LOGH: tl.constexpr, C_NLEV: tl.constexpr,
                C_ASYM: tl.constexpr, R_D: tl.constexpr, R_INV_D: tl.constexpr,
                C_D: tl.constexpr, C_INV_D: tl.constexpr, R_EXACT_DIV: tl.constexpr,
                C_EXACT_DIV: tl.constexpr, INTERP: tl.constexpr):
    """row_len: columns of the row output (B or Bp); col_len: rows of the column output."""
    a0 = tl.program_id(0) * BA
    b0 = tl.program_id(1) * BB
    a = a0 + tl.arange(0, BA)[:, None]
    b = b0 + tl.arange(0, BB)[None, :]
    x = tl.load(x_ptr + a.to(tl.int64) * stride_a + b, mask=(a < A) & (b < B), other=0.0)
    x = x.to(tl.float32)
    if ROW:
        y = _qdq_tile(x, a + r_org0, b0, r_org1, r_seed, r_lv, r_mid, r_st, r_sign, r_norm,
                      r_gmax, r_gneg, BA, BB, R_B, R_2D, R_SCALE, R_SR, R_LOGH, R_NLEV, R_ASYM,
                      R_D, R_INV_D, R_EXACT_DIV)
        tl.store(row_ptr + a.to(tl.int64) * row_len + b, _cast_out(y, row_ptr, INTERP),
                 mask=(a < A) & (b < row_len))
    if COL:
        at = a0 + tl.arange(0, BA)[None, :]
        bt = b0 + tl.arange(0, BB)[:, None]
        y = _qdq_tile(tl.trans(x), bt + c_org0, a0, c_org1, c_seed, c_lv, c_mid, c_st, c_sign,
                      c_norm, c_gmax, c_gneg, BB, BA, C_B, C_2D, C_SCALE, C_SR, C_LOGH, C_NLEV,
                      C_ASYM, C_D, C_INV_D, C_EXACT_DIV)
        tl.store(col_ptr + at.to(tl.int64) * B + bt, _cast_out(y, col_ptr, INTERP),
                 mask=(bt < B) & (at < col_len))


# ------------------------------------------------------------------------------ host side


@dataclass
class _Layout:
    """One layout's kernel arguments. length: padded length along the quantized dim; other:
    padded length along the other dim (2D tiles); out_len: quantized-dim length written."""

    args: tuple
    consts: dict
    length: int
    other: int
    out_len: int
    unit: int
    dtype: torch.dtype


_TABLES: dict = {}


def _tables(g, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(levels + g_max repeated, midpoints) as device fp32 tables, cached per grid/device."""
    key = (g, str(device))
    if key not in _TABLES:
        lv = g.levels_tensor()
        if g.neg_extra is not None:
            lv = torch.cat([lv, lv.new_tensor([g.neg_extra])])
        _TABLES[key] = (torch.cat([lv, lv[-1:]]).to(device), midpoints(lv).to(device))
    return _TABLES[key]


def _uniform_step(g) -> float:
    """d when the levels are i * d (and the two's-complement extra is n * d) with d a power
    of two, so that v / d is exact; 0.0 otherwise."""
    d = g.levels[1]
    levels = g.levels + ((g.neg_extra,) if g.neg_extra is not None else ())
    ok = math.frexp(d)[0] == 0.5 and all(l == i * d for i, l in enumerate(levels))
    return d if ok and len(levels) < 2**20 else 0.0


def _signs(rht: RHT, device) -> torch.Tensor:
    key = (rht, str(device))
    if key not in _TABLES:
        _TABLES[key] = rht.signs.to(device)
    return _TABLES[key]


def supports(x: torch.Tensor, grid, *, block: int = 16, block_2d: bool = False,
             scale: str = "fp32", rounding: str = "rtne", rht: RHT | None = None,
             seed: int = 0, origin: tuple[int, int] = (0, 0), tensor_amax=None,
             keep_padding: bool = False, out_dtype: torch.dtype | None = None) -> bool:
    """True when the kernel reproduces the reference for these arguments; False sends the
    call to the reference. Not implemented: blocks other than 16/32, dtypes other than
    fp32/bf16/fp16, e4m3 scales on the two's-complement grid (its tensor scale depends on
    every block's sign), empty tensors, and arguments the reference itself rejects."""
    try:
        g = get_grid(grid)
    except ValueError:
        return False
    return (x.dim() == 2 and x.numel() > 0 and x.dtype in DTYPES
            and (out_dtype is None or out_dtype in DTYPES) and block in BLOCKS
            and scale in SCALES and rounding in ("rtne", "sr")
            and not (scale == "e4m3" and g.neg_extra is not None)
            and (rht is None or isinstance(rht, RHT))
            and 0 <= seed < 2**63 and origin[0] >= 0 and origin[1] >= 0
            and (rounding != "sr" or origin[1] % 4 == 0))


def _layout(view: torch.Tensor, grid, *, block=16, block_2d=False, scale="fp32",
            rounding="rtne", rht=None, seed=0, origin=(0, 0), tensor_amax=None,
            keep_padding=False, out_dtype=None) -> _Layout:
    g = get_grid(grid)
    R, C = view.shape
    dev = view.device
    Cp = padded_length(C, block, rht)
    lv, mid = _tables(g, dev)
    st = lv
    if scale == "e4m3":  # the tensor-level scale, by the reference's own torch ops
        if tensor_amax is None:
            xf = torch.nn.functional.pad(view.to(torch.float32), (0, Cp - C))
            tensor_amax = (rht.rotate_fp32_lastdim(xf) if rht is not None else xf).abs().amax()
        g_top = torch.tensor(g.g_max, dtype=torch.float32, device=dev)
        st = (tensor_amax.to(torch.float32) / (E4M3_MAX * g_top)).reshape(1)
    sign = _signs(rht, dev) if rht is not None else lv
    norm = rht.norm if rht is not None else 1.0
    gneg = g.neg_extra if g.neg_extra is not None else g.g_max
    args = (lv, mid, st, sign, norm, g.g_max, gneg, seed, origin[0], origin[1])
    nlev = len(g.levels) + (g.neg_extra is not None)
    d = _uniform_step(g)
    consts = dict(B=block, _2D=block_2d, SCALE=SCALES[scale], SR=rounding == "sr",
                  LOGH=int(math.log2(rht.size)) if rht is not None else 0, NLEV=nlev,
                  ASYM=g.neg_extra is not None, D=d, INV_D=1.0 / d if d else 0.0,
                  EXACT_DIV=triton.knobs.runtime.interpret or g.levels[1] < 2.0**-30)
    other = -(-R // block) * block if block_2d else R
    return _Layout(args, consts, Cp, other, Cp if keep_padding else C,
                   padded_length(1, block, rht), out_dtype or view.dtype)


def _launch(t: torch.Tensor, row: _Layout | None, col: _Layout | None, tiles=None):
    """Run the kernel on row-major t [A, B]; returns (row output, column output view)."""
    A, B = t.shape
    mode = "dual" if row and col else ("row" if row else "col")
    ba, bb, warps = {**TILES, **(tiles or {})}[mode]
    if row:
        bb = max(bb, row.unit)
        ba = max(ba, row.consts["B"] if row.consts["_2D"] else 1)
    if col:
        ba = max(ba, col.unit)
        bb = max(bb, col.consts["B"] if col.consts["_2D"] else 1)
    a_len = max(row.other if row else A, col.length if col else A)
    b_len = max(row.length if row else B, col.other if col else B)
    dummy = t
    row_out = (torch.empty(A, row.out_len, dtype=row.dtype, device=t.device) if row else dummy)
    col_out = (torch.empty(col.out_len, B, dtype=col.dtype, device=t.device) if col else dummy)
    filler = (dummy, dummy, dummy, dummy, 1.0, 1.0, 1.0, 0, 0, 0)
    off = dict(B=16, _2D=False, SCALE=0, SR=False, LOGH=0, NLEV=2, ASYM=False, D=0.0,
               INV_D=0.0, EXACT_DIV=True)
    rc = row.consts if row else off
    cc = col.consts if col else off
    grid = (triton.cdiv(a_len, ba), triton.cdiv(b_len, bb))
    _qdq_kernel[grid](
        t, t.stride(0), A, B,
        row_out, row.out_len if row else 0, *(row.args if row else filler),
        col_out, col.out_len if col else 0, *(col.args if col else filler),
        BA=ba, BB=bb, ROW=row is not None, COL=col is not None,
        INTERP=triton.knobs.runtime.interpret,
        **{"R_" + k.lstrip("_"): v for k, v in rc.items()},
        **{"C_" + k.lstrip("_"): v for k, v in cc.items()},
        num_warps=warps)
    return (row_out if row else None), (col_out.t() if col else None)


# per program: col16 (groups of 16 rows, columns, warps), row16 (rows, blocks, warps)
TILES16 = {"col16": (2, 128, 4), "row16": (8, 16, 4)}


def _launch16(t: torch.Tensor, lay: _Layout, along_rows: bool, tile=None) -> torch.Tensor:
    """One layout of row-major t [A, B] through the 16-tensor kernels (quantize16_triton):
    along_rows=False quantizes along B ([A, B'] out), True along A ([B, A'] view out)."""
    from . import quantize16_triton as k16  # imports this module

    A, B = t.shape
    c = lay.consts
    consts = dict(SCALE=c["SCALE"], SR=c["SR"], RHT=c["LOGH"] == 4, NLEV=c["NLEV"],
                  ASYM=c["ASYM"], D=c["D"], INV_D=c["INV_D"], EXACT_DIV=c["EXACT_DIV"],
                  INTERP=triton.knobs.runtime.interpret)
    if along_rows:
        bg, bb, warps = tile or TILES16["col16"]
        out = torch.empty(lay.out_len, B, dtype=lay.dtype, device=t.device)
        grid = (triton.cdiv(lay.length // 16, bg), triton.cdiv(B, bb))
        k16._col16_kernel[grid](t, t.stride(0), A, B, out, lay.out_len, *lay.args, BG=bg,
                                BB=bb, num_warps=warps, **consts)
        return out.t()
    br, bg, warps = tile or TILES16["row16"]
    out = torch.empty(A, lay.out_len, dtype=lay.dtype, device=t.device)
    grid = (triton.cdiv(A, br), triton.cdiv(lay.length // 16, bg))
    k16._row16_kernel[grid](t, t.stride(0), A, B, out, lay.out_len, *lay.args, BR=br, BG=bg,
                            num_warps=warps, **consts)
    return out


def _blocks16(layout: _Layout) -> bool:
    """1x16 blocks with RHT16 or none: the 16-tensor kernels apply."""
    c = layout.consts
    return c["B"] == 16 and not c["_2D"] and c["LOGH"] in (0, 4)


def quantize_view(x: torch.Tensor, grid, *, tiles=None, **kw) -> torch.Tensor:
    """Kernel twin of numerics.quantize.quantize_view: same arguments, same values.

    A transposed view of a row-major tensor (x.t() with stride (1, n)) runs the column
    layout on the tensor itself, so column-wise quantization reads and writes coalesced; the
    result is then a transposed view too. 1x16 blocks with RHT16 (or none) take the
    16-tensor kernels; `tiles` overrides tile shapes per mode ("row", "col", "dual" force
    the generic kernel, "row16", "col16" shape the others).
    """
    tiles = tiles or {}
    if x.stride(0) == 1 and x.stride(1) != 1 and x.shape[0] > 1:
        col = _layout(x, grid, **kw)
        if _blocks16(col) and "col" not in tiles:
            return _launch16(x.t(), col, True, tiles.get("col16"))
        return _launch(x.t(), None, col, tiles)[1]
    t = x if x.stride(1) == 1 or x.shape[1] == 1 else x.contiguous()
    row = _layout(t, grid, **kw)
    if _blocks16(row) and "row" not in tiles:
        return _launch16(t, row, False, tiles.get("row16"))
    return _launch(t, row, None, tiles)[0]


def quantize_dual(t: torch.Tensor, row: dict, col: dict, *, tiles=None):
    """Both layouts of a row-major t [A, B] from one read.

    row, col: keyword arguments of quantize_view (grid included) for the quantization along
    B (view t) and along A (view t.t()). Returns (row [A, B'], col [B, A'] view) equal to
    quantize_view(t, **row) and quantize_view(t.t(), **col).
    """
    if t.stride(1) != 1:
        t = t.contiguous()
    return _launch(t, _layout(t, **row), _layout(t.t(), **col), tiles)

"""Triton twin of numerics/quantize.py: fused (RHT ->) amax -> scale -> round -> dequantize.

The generic tile kernel (device code; its host side, shared with the 16-tensor kernels of
quantize16_triton.py, is launch.py). 1x16 blocks with RHT16 or none (the UFP4 and E2M1
operands) run the 16-tensor kernels; everything else (blocks of 32, 2D tiles, RHT 32-128,
both layouts at once) runs the generic kernel here.
The generic kernel reads a tile of a row-major [A, B] tensor once and writes one or both layouts:
  row  quantized along B (the last dim): output [A, B or Bp], row-major;
  col  quantized along A (dim 0; the wgrad operands): output stored [A or Ap, B] row-major
       and returned as its transpose, a [B, A or Ap] view, the reference's [R, C] layout.
Each layout has its own spec (grid, block, scale, rounding, RHT, seed, origin). In a layout's
own view coordinates (r, c) every step is the reference's (docs/architecture.md): a column
layout runs the same tile code on the transposed tile. Tiles align with blocks, 2D tiles and
RHT groups, so every reduction stays inside one program; padding is loaded as zeros.
"""
import triton
import triton.language as tl

from .hadamard_triton import rht_rows
from .rounding_triton import round_rtne, round_sr, round_uniform_rtne, round_uniform_sr
from .scaling_triton import block_amax, block_negative_extreme, block_scale, expand
from .segments_triton import segment_keys


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
def _qdq_tile(x, r, c_start, r_org, c_org, seed, lv_ptr, mid_ptr, st_ptr, sign_ptr, norm, gmax,
              gneg, sg_idx, sg_n16, sg_seed, sg_start,
              BR: tl.constexpr, BC: tl.constexpr, B: tl.constexpr, BLOCK_2D: tl.constexpr,
              SCALE: tl.constexpr, SR: tl.constexpr, LOG_H: tl.constexpr,
              NLEV: tl.constexpr, ASYM: tl.constexpr, D: tl.constexpr, INV_D: tl.constexpr,
              EXACT_DIV: tl.constexpr, SEG: tl.constexpr):
    """Fake-quantize x [BR, BC] (fp32) along axis 1. r: [BR, 1] local view rows (global:
    r_org + r); the tile's first view column is c_start (local), c_org + c_start (global).
    D > 0: uniform grid of step D (rounding by rint/floor); EXACT_DIV: divide with div_rn
    everywhere; SEG: SR keys per segment (segments_triton.py)."""
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
        c = c_start + 4 * tl.arange(0, BC // 4)[None, :]  # local view column of each word
        sd, vr, vc = segment_keys(seed, r, c, sg_idx, sg_n16, sg_seed, sg_start, SEG)
        u = _uniform(sd, vr + r_org, (vc + c_org) // 4, BR, BC)
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
                r_org0, r_org1, r_sg_idx, r_sg_n16, r_sg_seed, r_sg_start,
                col_ptr, col_len, c_lv, c_mid, c_st, c_sign, c_norm, c_gmax, c_gneg, c_seed,
                c_org0, c_org1, c_sg_idx, c_sg_n16, c_sg_seed, c_sg_start,
                BA: tl.constexpr, BB: tl.constexpr, ROW: tl.constexpr, COL: tl.constexpr,
                R_B: tl.constexpr, R_2D: tl.constexpr, R_SCALE: tl.constexpr,
                R_SR: tl.constexpr, R_LOGH: tl.constexpr, R_NLEV: tl.constexpr,
                R_ASYM: tl.constexpr,
                C_B: tl.constexpr, C_2D: tl.constexpr, C_SCALE: tl.constexpr,
                C_SR: tl.constexpr, C_LOGH: tl.constexpr, C_NLEV: tl.constexpr,
                C_ASYM: tl.constexpr, R_D: tl.constexpr, R_INV_D: tl.constexpr,
                C_D: tl.constexpr, C_INV_D: tl.constexpr, R_EXACT_DIV: tl.constexpr,
                C_EXACT_DIV: tl.constexpr, INTERP: tl.constexpr, R_SEG: tl.constexpr = 0,
                C_SEG: tl.constexpr = 0):
    """row_len: columns of the row output (B or Bp); col_len: rows of the column output."""
    a0 = tl.program_id(0) * BA
    b0 = tl.program_id(1) * BB
    a = a0 + tl.arange(0, BA)[:, None]
    b = b0 + tl.arange(0, BB)[None, :]
    x = tl.load(x_ptr + a.to(tl.int64) * stride_a + b, mask=(a < A) & (b < B), other=0.0)
    x = x.to(tl.float32)
    if ROW:
        y = _qdq_tile(x, a, b0, r_org0, r_org1, r_seed, r_lv, r_mid, r_st, r_sign, r_norm,
                      r_gmax, r_gneg, r_sg_idx, r_sg_n16, r_sg_seed, r_sg_start, BA, BB, R_B,
                      R_2D, R_SCALE, R_SR, R_LOGH, R_NLEV, R_ASYM, R_D, R_INV_D, R_EXACT_DIV,
                      R_SEG)
        tl.store(row_ptr + a.to(tl.int64) * row_len + b, _cast_out(y, row_ptr, INTERP),
                 mask=(a < A) & (b < row_len))
    if COL:
        at = a0 + tl.arange(0, BA)[None, :]
        bt = b0 + tl.arange(0, BB)[:, None]
        y = _qdq_tile(tl.trans(x), bt, a0, c_org0, c_org1, c_seed, c_lv, c_mid, c_st, c_sign,
                      c_norm, c_gmax, c_gneg, c_sg_idx, c_sg_n16, c_sg_seed, c_sg_start, BB, BA,
                      C_B, C_2D, C_SCALE, C_SR, C_LOGH, C_NLEV, C_ASYM, C_D, C_INV_D,
                      C_EXACT_DIV, C_SEG)
        tl.store(col_ptr + at.to(tl.int64) * B + bt, _cast_out(y, col_ptr, INTERP),
                 mask=(bt < B) & (at < col_len))

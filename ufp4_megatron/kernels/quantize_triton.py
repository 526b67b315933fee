"""Triton twin of numerics/quantize.py on a register tile: the generic QDQ kernel.

1x16 blocks with RHT16 or none (the UFP4 and E2M1 operands) run the 16-tensor kernels
(quantize16_triton.py); everything else (blocks of 32, 2D tiles, RHT 32-128) runs this one.
It reads a tile of a row-major [A, B] tensor and writes one layout:
  row  quantized along B (the last dim): output [A, B or Bp], row-major;
  col  quantized along A (dim 0; the wgrad operands): output stored [A or Ap, B] row-major
       and returned as its transpose, a [B, A or Ap] view, the reference's [R, C] layout.
In the layout's own view coordinates (r, c) every step is the reference's
(pipeline_triton.py): a column layout runs the same tile code on the transposed tile. Tiles
align with blocks, 2D tiles and RHT groups, so every reduction stays inside one program;
padding is loaded as zeros. Host side: dispatch.py.
"""

import triton
import triton.language as tl

from .fp32_triton import (
    cast_out,
    div_exact,
    div_fast,
    fast_div_unsafe_quotient,
    fast_div_unsafe_scale,
    load_tile,
    reciprocal,
)
from .hadamard_triton import rht_rows
from .philox_triton import tile_uniforms
from .pipeline_triton import block_scales, clip_round_dequantize
from .scaling_triton import block_amax, block_negative_extreme, expand
from .segments_triton import segment_index, segment_keys


@triton.jit
def _qdq_tile(
    x,
    r,
    c_start,
    r_org,
    c_org,
    seed,
    lv_ptr,
    mid_ptr,
    st_ptr,
    sign_ptr,
    norm,
    gmax,
    gneg,
    sg_idx,
    sg_n16,
    sg_seed,
    sg_start,
    BR: tl.constexpr,
    BC: tl.constexpr,
    B: tl.constexpr,
    BLOCK_2D: tl.constexpr,
    SCALE: tl.constexpr,
    SR: tl.constexpr,
    LOG_H: tl.constexpr,
    NLEV: tl.constexpr,
    ASYM: tl.constexpr,
    D: tl.constexpr,
    INV_D: tl.constexpr,
    FP_M: tl.constexpr,
    EXACT_DIV: tl.constexpr,
    SEG: tl.constexpr,
    SEED_PTR: tl.constexpr,
):
    """Fake-quantize x [BR, BC] (fp32) along axis 1. r: [BR, 1] local view rows (global:
    r_org + r); the tile's first view column is c_start (local), c_org + c_start (global).
    D > 0: uniform grid of step D (rounding by rint/floor); EXACT_DIV: divide with div_rn
    everywhere; SEG: SR keys per segment (segments_triton.py)."""
    if LOG_H > 0:
        signs = tl.load(sign_ptr + tl.arange(0, BC) % (1 << LOG_H))[None, :]
        x = rht_rows(x, signs, norm, BR, BC, LOG_H)
    amax = block_amax(x, BR, BC, B, BLOCK_2D)
    g = gmax
    if ASYM:  # two's complement: a block led by a negative value may reach -gneg
        g = tl.where(block_negative_extreme(x, BR, BC, B, BLOCK_2D), gneg, gmax)
    st = st_ptr
    if SCALE == 1 and SEG > 0:  # e4m3: the tensor scale of each block's segment
        st = st_ptr + segment_index(
            r, c_start + B * tl.arange(0, BC // B)[None, :], sg_idx, sg_n16, SEG
        )
    sb = block_scales(amax, g, gmax, st, SCALE)
    s = expand(sb, BR, BC, B)
    a = tl.abs(x)
    if EXACT_DIV:
        v = div_exact(a, s)
    else:  # one exact reciprocal per block
        v = div_fast(a, s, expand(reciprocal(sb), BR, BC, B))
        # any unsafe block scale, read on the per-block values (expanded, the mask took a
        # layout replicated over threads in 2D column tiles), or (SR) any unsafe quotient
        bad = tl.max(fast_div_unsafe_scale(sb).to(tl.int32))
        if SR:
            bad = tl.maximum(bad, tl.max(fast_div_unsafe_quotient(a, v).to(tl.int32)))
        if bad > 0:  # the whole tile, so the branch is uniform
            v = div_exact(a, s)
    u = v  # SR only
    if SR:
        c = c_start + 4 * tl.arange(0, BC // 4)[None, :]  # local view column of each word
        sd, vr, vc, _ = segment_keys(seed, r, c, sg_idx, sg_n16, sg_seed, sg_start, SEG, SEED_PTR)
        u = tile_uniforms(sd, vr + r_org, (vc + c_org) // 4, BR, BC)
    return clip_round_dequantize(
        x, v, u, s, lv_ptr, mid_ptr, gmax, gneg, SR, NLEV, ASYM, D, INV_D, FP_M
    )


@triton.jit
def _qdq_kernel(
    x_ptr,
    stride_a,
    A,
    B,
    out_ptr,
    out_len,
    lv_ptr,
    mid_ptr,
    st_ptr,
    sign_ptr,
    norm,
    gmax,
    gneg,
    seed,
    org0,
    org1,
    sg_idx,
    sg_n16,
    sg_seed,
    sg_start,
    BA: tl.constexpr,
    BB: tl.constexpr,
    COL: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_2D: tl.constexpr,
    SCALE: tl.constexpr,
    SR: tl.constexpr,
    LOG_H: tl.constexpr,
    NLEV: tl.constexpr,
    ASYM: tl.constexpr,
    D: tl.constexpr,
    INV_D: tl.constexpr,
    FP_M: tl.constexpr,
    EXACT_DIV: tl.constexpr,
    INTERP: tl.constexpr,
    SEG: tl.constexpr = 0,
    SEED_PTR: tl.constexpr = 0,
):
    """Program (BA x BB tile) of one layout: row (COL false, out [A, out_len]) or col (out
    [out_len, B]); the runtime arguments are those of the 16-tensor kernels."""
    x, a0, b0, a, b = load_tile(x_ptr, stride_a, A, B, BA, BB)
    if COL:
        at = a0 + tl.arange(0, BA)[None, :]
        bt = b0 + tl.arange(0, BB)[:, None]
        y = _qdq_tile(
            tl.trans(x),
            bt,
            a0,
            org0,
            org1,
            seed,
            lv_ptr,
            mid_ptr,
            st_ptr,
            sign_ptr,
            norm,
            gmax,
            gneg,
            sg_idx,
            sg_n16,
            sg_seed,
            sg_start,
            BB,
            BA,
            BLOCK,
            BLOCK_2D,
            SCALE,
            SR,
            LOG_H,
            NLEV,
            ASYM,
            D,
            INV_D,
            FP_M,
            EXACT_DIV,
            SEG,
            SEED_PTR,
        )
        tl.store(
            out_ptr + at.to(tl.int64) * B + bt,
            cast_out(y, out_ptr, INTERP),
            mask=(bt < B) & (at < out_len),
        )
    else:
        y = _qdq_tile(
            x,
            a,
            b0,
            org0,
            org1,
            seed,
            lv_ptr,
            mid_ptr,
            st_ptr,
            sign_ptr,
            norm,
            gmax,
            gneg,
            sg_idx,
            sg_n16,
            sg_seed,
            sg_start,
            BA,
            BB,
            BLOCK,
            BLOCK_2D,
            SCALE,
            SR,
            LOG_H,
            NLEV,
            ASYM,
            D,
            INV_D,
            FP_M,
            EXACT_DIV,
            SEG,
            SEED_PTR,
        )
        tl.store(
            out_ptr + a.to(tl.int64) * out_len + b,
            cast_out(y, out_ptr, INTERP),
            mask=(a < A) & (b < out_len),
        )

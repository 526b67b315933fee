"""QDQ of 1x16 blocks (RHT16 or none) kept as 16 register tensors: no data movement.

For the wgrad operands (quantized along dim 0 of a row-major [A, B] tensor) with 1x16
blocks and RHT16 (or none): element j of a group is row 16 g + j, held in its own [BG, BB]
tensor with every tensor in the same layout, so the butterfly, the block amax and the
rounding are elementwise across the 16 tensors and every load and store is coalesced along
B. Same pipeline, same operations as the tile kernel (pipeline_triton.py) and numerics/ (the
view is t.t(): view row = b, column = a). 1x32 column blocks (MXFP4's) are two such groups
of 16 rows (GROUPS = 2): 32 tensors, an RHT16 on each half, one amax over both. Row-wise
(along B, 1x16 blocks only), each block is loaded as two 16-byte halves and split in
registers into the same 16-tensor form. `_pair16_kernel` runs
two such jobs (row or column each) in one launch: the two operands of one GEMM. Host side:
dispatch.py. The RHT16 signs are compile-time constants here (the RHT constexpr), so the
kernels leave the sign pointer of the launch arguments they share with the tile kernel unused.
"""

import triton
import triton.language as tl

from .fp32_triton import (
    cast_out,
    div_exact,
    div_fast,
    fast_div_unsafe_quotient,
    fast_div_unsafe_scale,
    load_groups16,
    reciprocal,
)
from .hadamard_triton import rht16
from .philox_triton import uniforms4
from .pipeline_triton import block_scales, clip_round_dequantize
from .scaling_triton import block_amax16
from .segments_triton import segment_keys


@triton.jit
def _row_counter_like(x, r):
    """SR's Philox row counter r made to depend on x, the block's first element, so that the
    Philox chain takes the data's layout (the other counter words broadcast into it). Left
    alone, Triton gives that chain its default layout and converts its 16 uniforms to the
    data's layout through shared memory, two barriers each (32 per program). Where x is NaN
    the block's output is NaN whatever its uniforms, so the zero there changes nothing."""
    return tl.where(x == x, r, 0)


@triton.jit
def _qdq16(
    xs,
    c4,
    r,
    seed,
    lv_ptr,
    mid_ptr,
    st_ptr,
    norm,
    gmax,
    gneg,
    SCALE: tl.constexpr,
    SR: tl.constexpr,
    RHT: tl.constexpr,
    NLEV: tl.constexpr,
    ASYM: tl.constexpr,
    D: tl.constexpr,
    INV_D: tl.constexpr,
    FP_M: tl.constexpr,
    EXACT_DIV: tl.constexpr,
    GROUPS: tl.constexpr,
):
    """QDQ of one block of 16 GROUPS elements held as a tuple of same-shaped fp32 tensors
    (element j of every block in xs[j]; GROUPS 2: the 1x32 blocks of MXFP4, an RHT16 rotating
    each half). c4: global view column of element 0, over 4 (Philox counter 0 of elements
    0..3); r: global view row; st_ptr: the e4m3 tensor scale, a pointer per block where
    segments have their own; RHT: 0 (none), or 2^16 plus the RHT16 sign mask
    (dispatch.rht16_constexpr). Returns the 16 GROUPS dequantized fp32 tensors."""
    if SR:
        r = _row_counter_like(xs[0], r)
    if RHT:
        rotated = ()
        for k in tl.static_range(GROUPS):
            group = ()
            for j in tl.static_range(16):
                group = group + (xs[16 * k + j],)
            rotated = rotated + rht16(group, RHT, norm)
        xs = rotated
    amax, negative_led = block_amax16(xs, ASYM, 16 * GROUPS)
    g = gmax
    if ASYM:  # two's complement: a block led by a negative value may reach -gneg
        g = tl.where(negative_led, gneg, gmax)
    s = block_scales(amax, g, gmax, st_ptr, SCALE)
    vs = ()
    if EXACT_DIV:
        for j in tl.static_range(16 * GROUPS):
            vs = vs + (div_exact(tl.abs(xs[j]), s),)
    else:  # one exact reciprocal per block
        y = reciprocal(s)
        bad = fast_div_unsafe_scale(s)
        for j in tl.static_range(16 * GROUPS):
            a_j = tl.abs(xs[j])
            v = div_fast(a_j, s, y)
            if SR:
                bad = bad | fast_div_unsafe_quotient(a_j, v)
            vs = vs + (v,)
        if tl.max(bad.to(tl.int32)) > 0:  # the whole program, so the branch is uniform
            vs = ()
            for j in tl.static_range(16 * GROUPS):
                vs = vs + (div_exact(tl.abs(xs[j]), s),)
    out = ()
    for j in tl.static_range(16 * GROUPS):
        u = s  # SR only
        if SR:
            if j % 4 == 0:  # one Philox call serves 4 consecutive view columns
                us = uniforms4(seed, c4 + j // 4, r)
            u = us[j % 4]
        out = out + (
            clip_round_dequantize(
                xs[j], vs[j], u, s, lv_ptr, mid_ptr, gmax, gneg, SR, NLEV, ASYM, D, INV_D, FP_M
            ),
        )
    return out


@triton.jit
def _col16_job(
    p0,
    p1,
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
    BG: tl.constexpr,
    BB: tl.constexpr,
    SCALE: tl.constexpr,
    SR: tl.constexpr,
    RHT: tl.constexpr,
    NLEV: tl.constexpr,
    ASYM: tl.constexpr,
    D: tl.constexpr,
    INV_D: tl.constexpr,
    FP_M: tl.constexpr,
    EXACT_DIV: tl.constexpr,
    SEG: tl.constexpr,
    INTERP: tl.constexpr,
    SEED_PTR: tl.constexpr,
    GROUPS: tl.constexpr,
):
    """Program (p0, p1) of a column job: out [out_len, B] row-major, rows n g .. n g + n - 1
    of x quantized as one block (n = 16 GROUPS; BG blocks by BB columns a program). The view
    is x.t(): view row b, view column n g + j; SEG keys SR per segment (segments_triton.py),
    a block by its first element's: the host passes column segments (SEG 2) that start at
    multiples of n only."""
    g = p0 * BG + tl.arange(0, BG)[:, None]
    b = p1 * BB + tl.arange(0, BB)[None, :]
    xs = ()
    for k in tl.static_range(GROUPS):
        xs = xs + load_groups16(x_ptr, stride_a, A, B, g * GROUPS + k, b)
    sd, vr, vc, i = segment_keys(
        seed, b, g * 16 * GROUPS, sg_idx, sg_n16, sg_seed, sg_start, SEG, SEED_PTR
    )
    ys = _qdq16(
        xs,
        (vc + org1) >> 2,
        vr + org0,
        sd,
        lv_ptr,
        mid_ptr,
        st_ptr + i,
        norm,
        gmax,
        gneg,
        SCALE,
        SR,
        RHT,
        NLEV,
        ASYM,
        D,
        INV_D,
        FP_M,
        EXACT_DIV,
        GROUPS,
    )
    a = g * 16 * GROUPS
    out = out_ptr + a.to(tl.int64) * B + b
    in_b = b < B
    for j in tl.static_range(16 * GROUPS):
        tl.store(out, cast_out(ys[j], out_ptr, INTERP), mask=(a + j < out_len) & in_b)
        out += B


@triton.jit
def _col16_kernel(
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
    BG: tl.constexpr,
    BB: tl.constexpr,
    SCALE: tl.constexpr,
    SR: tl.constexpr,
    RHT: tl.constexpr,
    NLEV: tl.constexpr,
    ASYM: tl.constexpr,
    D: tl.constexpr,
    INV_D: tl.constexpr,
    FP_M: tl.constexpr,
    EXACT_DIV: tl.constexpr,
    INTERP: tl.constexpr,
    SEG: tl.constexpr = 0,
    SEED_PTR: tl.constexpr = 0,
    GROUPS: tl.constexpr = 1,
):
    """One column job on a 2D grid of programs."""
    _col16_job(
        tl.program_id(0),
        tl.program_id(1),
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
        BG,
        BB,
        SCALE,
        SR,
        RHT,
        NLEV,
        ASYM,
        D,
        INV_D,
        FP_M,
        EXACT_DIV,
        SEG,
        INTERP,
        SEED_PTR,
        GROUPS,
    )


@triton.jit
def _split8(t, BR: tl.constexpr, BG: tl.constexpr):
    """[BR, BG, 8] -> its 8 elements along the last axis as a tuple of [BR, BG] (in-thread)."""
    e0, e1 = tl.split(tl.reshape(t, (BR, BG, 4, 2)))
    f00, f01 = tl.split(tl.reshape(e0, (BR, BG, 2, 2)))
    f10, f11 = tl.split(tl.reshape(e1, (BR, BG, 2, 2)))
    a0, a4 = tl.split(f00)
    a2, a6 = tl.split(f01)
    a1, a5 = tl.split(f10)
    a3, a7 = tl.split(f11)
    return (a0, a1, a2, a3, a4, a5, a6, a7)


@triton.jit
def _join8(ys, o: tl.constexpr, BR: tl.constexpr, BG: tl.constexpr):
    """Inverse of _split8 on ys[o .. o + 7]."""
    f00 = tl.join(ys[o + 0], ys[o + 4])
    f01 = tl.join(ys[o + 2], ys[o + 6])
    f10 = tl.join(ys[o + 1], ys[o + 5])
    f11 = tl.join(ys[o + 3], ys[o + 7])
    e0 = tl.reshape(tl.join(f00, f01), (BR, BG, 4))
    e1 = tl.reshape(tl.join(f10, f11), (BR, BG, 4))
    return tl.reshape(tl.join(e0, e1), (BR, BG, 8))


@triton.jit
def _row16_job(
    p0,
    p1,
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
    BR: tl.constexpr,
    BG: tl.constexpr,
    SCALE: tl.constexpr,
    SR: tl.constexpr,
    RHT: tl.constexpr,
    NLEV: tl.constexpr,
    ASYM: tl.constexpr,
    D: tl.constexpr,
    INV_D: tl.constexpr,
    FP_M: tl.constexpr,
    EXACT_DIV: tl.constexpr,
    SEG: tl.constexpr,
    INTERP: tl.constexpr,
    SEED_PTR: tl.constexpr,
    GROUPS: tl.constexpr,
):
    """Program (p0, p1) of a row job: out [A, out_len] row-major, quantized along B in blocks
    of 16. Each block is loaded as two 16-byte halves and split in registers into 16
    tensors, then as in _col16_job."""
    tl.static_assert(GROUPS == 1, "the row kernel takes 1x16 blocks")
    r = p0 * BR + tl.arange(0, BR)[:, None, None]
    g = p1 * BG + tl.arange(0, BG)[None, :, None]
    j8 = tl.arange(0, 8)[None, None, :]
    c_lo = g * 16 + j8
    row = x_ptr + r.to(tl.int64) * stride_a
    lo = tl.load(row + c_lo, mask=(r < A) & (c_lo < B), other=0.0).to(tl.float32)
    hi = tl.load(row + c_lo + 8, mask=(r < A) & (c_lo + 8 < B), other=0.0).to(tl.float32)
    xs = _split8(lo, BR, BG) + _split8(hi, BR, BG)
    g2 = tl.reshape(g, (1, BG))
    r2 = tl.reshape(r, (BR, 1))
    sd, vr, vc, i = segment_keys(
        seed, r2, g2 * 16, sg_idx, sg_n16, sg_seed, sg_start, SEG, SEED_PTR
    )
    ys = _qdq16(
        xs,
        (vc + org1) >> 2,
        vr + org0,
        sd,
        lv_ptr,
        mid_ptr,
        st_ptr + i,
        norm,
        gmax,
        gneg,
        SCALE,
        SR,
        RHT,
        NLEV,
        ASYM,
        D,
        INV_D,
        FP_M,
        EXACT_DIV,
        GROUPS,
    )
    out = out_ptr + r.to(tl.int64) * out_len
    tl.store(
        out + c_lo,
        cast_out(_join8(ys, 0, BR, BG), out_ptr, INTERP),
        mask=(r < A) & (c_lo < out_len),
    )
    tl.store(
        out + c_lo + 8,
        cast_out(_join8(ys, 8, BR, BG), out_ptr, INTERP),
        mask=(r < A) & (c_lo + 8 < out_len),
    )


@triton.jit
def _row16_kernel(
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
    BR: tl.constexpr,
    BG: tl.constexpr,
    SCALE: tl.constexpr,
    SR: tl.constexpr,
    RHT: tl.constexpr,
    NLEV: tl.constexpr,
    ASYM: tl.constexpr,
    D: tl.constexpr,
    INV_D: tl.constexpr,
    FP_M: tl.constexpr,
    EXACT_DIV: tl.constexpr,
    INTERP: tl.constexpr,
    SEG: tl.constexpr = 0,
    SEED_PTR: tl.constexpr = 0,
    GROUPS: tl.constexpr = 1,
):
    """One row job on a 2D grid of programs."""
    _row16_job(
        tl.program_id(0),
        tl.program_id(1),
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
        BR,
        BG,
        SCALE,
        SR,
        RHT,
        NLEV,
        ASYM,
        D,
        INV_D,
        FP_M,
        EXACT_DIV,
        SEG,
        INTERP,
        SEED_PTR,
        GROUPS,
    )


@triton.jit(noinline=True)
def _job(
    p,
    n1,
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
    COL: tl.constexpr,
    T0: tl.constexpr,
    T1: tl.constexpr,
    SCALE: tl.constexpr,
    SR: tl.constexpr,
    RHT: tl.constexpr,
    NLEV: tl.constexpr,
    ASYM: tl.constexpr,
    D: tl.constexpr,
    INV_D: tl.constexpr,
    FP_M: tl.constexpr,
    EXACT_DIV: tl.constexpr,
    SEG: tl.constexpr,
    INTERP: tl.constexpr,
    SEED_PTR: tl.constexpr,
    GROUPS: tl.constexpr,
):
    """Program p of a job whose 2D program grid has n1 columns, on a 1D launch. Not inlined:
    inlined, both jobs of a pair share one register allocation that exceeds either's (sm_90,
    ptxas: fprop pair 96 registers vs 63 for one row job; noinline: 64)."""
    if COL:
        _col16_job(
            p // n1,
            p % n1,
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
            T0,
            T1,
            SCALE,
            SR,
            RHT,
            NLEV,
            ASYM,
            D,
            INV_D,
            FP_M,
            EXACT_DIV,
            SEG,
            INTERP,
            SEED_PTR,
            GROUPS,
        )
    else:
        _row16_job(
            p // n1,
            p % n1,
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
            T0,
            T1,
            SCALE,
            SR,
            RHT,
            NLEV,
            ASYM,
            D,
            INV_D,
            FP_M,
            EXACT_DIV,
            SEG,
            INTERP,
            SEED_PTR,
            GROUPS,
        )


@triton.jit
def _pair16_kernel(
    a_x,
    a_stride,
    a_A,
    a_B,
    a_out,
    a_out_len,
    a_lv,
    a_mid,
    a_st,
    a_sign,
    a_norm,
    a_gmax,
    a_gneg,
    a_seed,
    a_org0,
    a_org1,
    a_sg_idx,
    a_sg_n16,
    a_sg_seed,
    a_sg_start,
    a_n1,
    a_programs,
    b_x,
    b_stride,
    b_A,
    b_B,
    b_out,
    b_out_len,
    b_lv,
    b_mid,
    b_st,
    b_sign,
    b_norm,
    b_gmax,
    b_gneg,
    b_seed,
    b_org0,
    b_org1,
    b_sg_idx,
    b_sg_n16,
    b_sg_seed,
    b_sg_start,
    b_n1,
    A_COL: tl.constexpr,
    A_T0: tl.constexpr,
    A_T1: tl.constexpr,
    A_SCALE: tl.constexpr,
    A_SR: tl.constexpr,
    A_RHT: tl.constexpr,
    A_NLEV: tl.constexpr,
    A_ASYM: tl.constexpr,
    A_D: tl.constexpr,
    A_INV_D: tl.constexpr,
    A_FP_M: tl.constexpr,
    A_EXACT_DIV: tl.constexpr,
    B_COL: tl.constexpr,
    B_T0: tl.constexpr,
    B_T1: tl.constexpr,
    B_SCALE: tl.constexpr,
    B_SR: tl.constexpr,
    B_RHT: tl.constexpr,
    B_NLEV: tl.constexpr,
    B_ASYM: tl.constexpr,
    B_D: tl.constexpr,
    B_INV_D: tl.constexpr,
    B_FP_M: tl.constexpr,
    B_EXACT_DIV: tl.constexpr,
    INTERP: tl.constexpr,
    A_SEG: tl.constexpr = 0,
    B_SEG: tl.constexpr = 0,
    A_SEED_PTR: tl.constexpr = 0,
    B_SEED_PTR: tl.constexpr = 0,
    A_GROUPS: tl.constexpr = 1,
    B_GROUPS: tl.constexpr = 1,
):
    """Two jobs (the two operands of one GEMM) in one launch: programs [0, a_programs) run
    job a, the rest job b. Each program runs exactly the code of its single-job kernel, so
    the outputs are those of two launches, bit for bit; one launch saves one launch's host
    cost (docs/kernel-notes.md)."""
    pid = tl.program_id(0)
    if pid < a_programs:
        _job(
            pid,
            a_n1,
            a_x,
            a_stride,
            a_A,
            a_B,
            a_out,
            a_out_len,
            a_lv,
            a_mid,
            a_st,
            a_sign,
            a_norm,
            a_gmax,
            a_gneg,
            a_seed,
            a_org0,
            a_org1,
            a_sg_idx,
            a_sg_n16,
            a_sg_seed,
            a_sg_start,
            A_COL,
            A_T0,
            A_T1,
            A_SCALE,
            A_SR,
            A_RHT,
            A_NLEV,
            A_ASYM,
            A_D,
            A_INV_D,
            A_FP_M,
            A_EXACT_DIV,
            A_SEG,
            INTERP,
            A_SEED_PTR,
            A_GROUPS,
        )
    else:
        _job(
            pid - a_programs,
            b_n1,
            b_x,
            b_stride,
            b_A,
            b_B,
            b_out,
            b_out_len,
            b_lv,
            b_mid,
            b_st,
            b_sign,
            b_norm,
            b_gmax,
            b_gneg,
            b_seed,
            b_org0,
            b_org1,
            b_sg_idx,
            b_sg_n16,
            b_sg_seed,
            b_sg_start,
            B_COL,
            B_T0,
            B_T1,
            B_SCALE,
            B_SR,
            B_RHT,
            B_NLEV,
            B_ASYM,
            B_D,
            B_INV_D,
            B_FP_M,
            B_EXACT_DIV,
            B_SEG,
            INTERP,
            B_SEED_PTR,
            B_GROUPS,
        )

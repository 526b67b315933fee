"""Triton twin of numerics.quantize.e4m3_tensor_amax: the per-tensor amax of e4m3 scales.

NVFP4's block scales are e4m3 values under one fp32 tensor scale, so every e4m3 operand
needs its tensor amax before its QDQ: the largest finite block amax of the padded, rotated
source. The reference computes it with about a dozen torch ops and several full passes
(an fp32 copy, the RHT, abs, NaN masks, two reductions); this kernel reads the tensor once,
in the generic QDQ kernel's tiles and layouts (quantize_triton.py), with the same RHT and
block amax (hadamard_triton.rht_rows, scaling_triton.block_amax), and writes one maximum per
program; the host takes the max of those. Max is exact in any order, so the result is the
reference's bit for bit. With segments (numerics/segments.py: the experts of a grouped GEMM,
each with its own tensor scale) segments of view rows are reduced in the kernel, by an
atomic max per group of 16 rows into its segment's amax (a stacked expert weight, x and
dY's pair kernel); segments of block columns take one maximum per block column, which the
host reduces per segment (dispatch.py). A block holding NaN or Inf has a
non-finite amax and is left out, as in the reference's finite_tensor_amax; none finite
gives 0. Layouts of 1x16 column blocks (RHT16 or none) are read as 16 register tensors
instead, as the col16 QDQ kernel reads them (quantize16_triton.py): alone
(_tensor_amax16_kernel) or with an unrotated row layout (_tensor_amax_pair16_kernel).
"""

import triton
import triton.language as tl

from .fp32_triton import load_groups16, load_tile
from .hadamard_triton import rht16, rht_rows
from .scaling_triton import block_amax, block_amax16


@triton.jit
def _tile_finite_amax(
    x,
    sign_ptr,
    norm,
    BR: tl.constexpr,
    BC: tl.constexpr,
    B: tl.constexpr,
    BLOCK_2D: tl.constexpr,
    LOG_H: tl.constexpr,
):
    """The finite block amax of the [BR, BC] fp32 tile x, blocks along axis 1:
    [BR, BC // B], 0 for a block holding NaN or Inf."""
    if LOG_H > 0:
        signs = tl.load(sign_ptr + tl.arange(0, BC) % (1 << LOG_H))[None, :]
        x = rht_rows(x, signs, norm, BR, BC, LOG_H)
    amax = block_amax(x, BR, BC, B, BLOCK_2D)
    finite = tl.abs(amax) < float("inf")  # false for NaN too
    return tl.where(finite, amax, 0.0)


@triton.jit
def _store_max(
    out_ptr,
    m,
    v0,
    vc0,
    BR: tl.constexpr,
    NB: tl.constexpr,
    n_rows,
    n_bcols,
    idx_ptr,
    n16,
    KEEP: tl.constexpr,
):
    """Stores the maxima of the [BR, NB] finite block amax m of the tile whose first view row
    is v0 and first block column vc0: one (KEEP 0, at the program's index), one per view row
    (KEEP 1: out[vc0 // NB, v0 + i], n_rows a row), one per block column (KEEP 2:
    out[v0 // BR, vc0 + j], n_bcols a row), or into the segments of view rows (KEEP 3: each
    group of 16 rows, all in one segment as segments start at multiples of 16, by an atomic
    max into out[idx_ptr[group]]; the segment of every 16 rows, n16 of them, rows past them
    padding; out zeroed beforehand, every maximum >= 0; BR a multiple of 16)."""
    if KEEP == 0:
        tl.store(out_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), tl.max(m))
    elif KEEP == 1:
        rows = v0 + tl.arange(0, BR)
        tl.store(out_ptr + (vc0 // NB) * n_rows + rows, tl.max(m, axis=1))
    elif KEEP == 3:
        groups = tl.max(tl.reshape(tl.max(m, axis=1), (BR // 16, 16)), axis=1)
        seg = tl.load(idx_ptr + tl.minimum(v0 // 16 + tl.arange(0, BR // 16), n16 - 1))
        tl.atomic_max(out_ptr + seg, groups, sem="relaxed")
    else:
        bcols = vc0 + tl.arange(0, NB)
        tl.store(out_ptr + (v0 // BR) * n_bcols + bcols, tl.max(m, axis=0))


@triton.jit
def _tensor_amax_kernel(
    x_ptr,
    stride_a,
    A,
    B,
    sign_ptr,
    norm,
    out_ptr,
    idx_ptr,
    n16,
    BA: tl.constexpr,
    BB: tl.constexpr,
    COL: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_2D: tl.constexpr,
    LOG_H: tl.constexpr,
    KEEP: tl.constexpr = 0,
):
    """One BA x BB tile of a row-major [A, B] tensor, quantized along B (COL false) or A:
    the tile's largest finite block amax (padding loads as zeros), per program (KEEP 0), per
    view row (KEEP 1), per view block column (KEEP 2) or per segment of view rows (KEEP 3,
    idx_ptr and n16 its segment table; _store_max). The view is the tensor (COL false: view
    rows along A) or its transpose (COL: view rows along B)."""
    x = load_tile(x_ptr, stride_a, A, B, BA, BB)[0]
    p0, p1 = tl.program_id(0), tl.program_id(1)
    if COL:
        m = _tile_finite_amax(tl.trans(x), sign_ptr, norm, BB, BA, BLOCK, BLOCK_2D, LOG_H)
        _store_max(
            out_ptr,
            m,
            p1 * BB,
            p0 * (BA // BLOCK),
            BB,
            BA // BLOCK,
            tl.num_programs(1) * BB,
            tl.num_programs(0) * (BA // BLOCK),
            idx_ptr,
            n16,
            KEEP,
        )
    else:
        m = _tile_finite_amax(x, sign_ptr, norm, BA, BB, BLOCK, BLOCK_2D, LOG_H)
        _store_max(
            out_ptr,
            m,
            p0 * BA,
            p1 * (BB // BLOCK),
            BA,
            BB // BLOCK,
            tl.num_programs(0) * BA,
            tl.num_programs(1) * (BB // BLOCK),
            idx_ptr,
            n16,
            KEEP,
        )


@triton.jit
def _tensor_amax_pair_kernel(
    x_ptr,
    stride_a,
    A,
    B,
    row_sign_ptr,
    row_norm,
    col_sign_ptr,
    col_norm,
    out_ptr,
    BA: tl.constexpr,
    BB: tl.constexpr,
    ROW_BLOCK: tl.constexpr,
    ROW_LOG_H: tl.constexpr,
    COL_BLOCK: tl.constexpr,
    COL_LOG_H: tl.constexpr,
):
    """Both layouts' tensor amax of a row-major [A, B] tensor from one read of each BA x BB
    tile: quantized along B (the row layout: out[program]) and along A (the column layout:
    out[programs + program]), each with its own 1D blocks and RHT, the same steps as
    _tensor_amax_kernel's for that layout. A GEMM operand quantized for two GEMMs (x for
    fprop and wgrad, dY for dgrad and wgrad) then pays one pass for its two tensor scales."""
    x = load_tile(x_ptr, stride_a, A, B, BA, BB)[0]
    p = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    n = tl.num_programs(0) * tl.num_programs(1)
    m_row = _tile_finite_amax(x, row_sign_ptr, row_norm, BA, BB, ROW_BLOCK, False, ROW_LOG_H)
    tl.store(out_ptr + p, tl.max(m_row))
    x_t = tl.trans(x)
    m_col = _tile_finite_amax(x_t, col_sign_ptr, col_norm, BB, BA, COL_BLOCK, False, COL_LOG_H)
    tl.store(out_ptr + n + p, tl.max(m_col))


@triton.jit
def _tensor_amax_pair16_kernel(
    x_ptr,
    stride_a,
    A,
    B,
    row_sign_ptr,
    row_norm,
    col_norm,
    out_ptr,
    idx_ptr,
    n16,
    n_seg,
    BG: tl.constexpr,
    BB: tl.constexpr,
    ROW_BLOCK: tl.constexpr,
    COL_RHT: tl.constexpr,
    SEG: tl.constexpr = False,
):
    """_tensor_amax_pair_kernel's two amaxes where the row layout is unrotated 1D blocks and
    the column layout 1x16 blocks, RHT16 or none (NVFP4's x and dY), from the tile held as 16
    register tensors as the col16 QDQ kernel holds it (quantize16_triton.py): xs[j] holds rows
    16 g + j of the BG groups of 16 rows, so a column block is element j of each tensor, its
    RHT16 and its amax elementwise (no data moves between threads). A row block is 16 or 32
    consecutive columns of one tensor: where the whole tile is finite every row block is, and
    the row layout's amax is the tile's max |x|; a tile holding NaN or Inf reloads it as the
    generic kernel's tile and leaves those blocks out as that kernel does. out[program] is the
    row layout's maximum, out[programs + program] the column layout's.

    SEG: one amax per segment of rows (the experts' tokens of a grouped GEMM, each with its
    own tensor scale; segments start at multiples of 16, so a group of 16 rows lies in one):
    each group's maxima go to its segment idx_ptr[g] (the segment of every 16 rows, n16 of
    them; rows past them are padding, zeros) by an atomic max into out[segment] (row layout)
    and out[n_seg + segment] (column layout), zeroed beforehand. The maxima are >= 0, and
    max is exact in any order: the same bits as the per-segment reduction of the reference."""
    p0, p1 = tl.program_id(0), tl.program_id(1)
    p = p0 * tl.num_programs(1) + p1
    n = tl.num_programs(0) * tl.num_programs(1)
    g = p0 * BG + tl.arange(0, BG)[:, None]
    b = p1 * BB + tl.arange(0, BB)[None, :]
    xs = load_groups16(x_ptr, stride_a, A, B, g, b)
    amax = block_amax16(xs, False)[0]  # NaN-propagating: not < inf where a block is not finite
    if tl.min((amax < float("inf")).to(tl.int32)) == 1:
        m_row = _max_per_group(amax, BG, 1, SEG)
    else:  # rare: the generic tile, blocks holding NaN or Inf left out
        t = load_tile(x_ptr, stride_a, A, B, BG * 16, BB)[0]
        m_row = _tile_finite_amax(t, row_sign_ptr, row_norm, BG * 16, BB, ROW_BLOCK, False, 0)
        m_row = _max_per_group(m_row, BG, 16, SEG)
    m_col = _max_per_group(_col_finite_amax16(xs, COL_RHT, col_norm), BG, 1, SEG)
    if SEG:
        seg = tl.load(idx_ptr + tl.minimum(p0 * BG + tl.arange(0, BG), n16 - 1))
        tl.atomic_max(out_ptr + seg, m_row, sem="relaxed")
        tl.atomic_max(out_ptr + n_seg + seg, m_col, sem="relaxed")
    else:
        tl.store(out_ptr + p, m_row)
        tl.store(out_ptr + n + p, m_col)


@triton.jit
def _max_per_group(m, BG: tl.constexpr, ROWS: tl.constexpr, SEG: tl.constexpr):
    """The maximum of m, whose ROWS rows per group of 16 rows of x make BG groups: [BG], one
    per group, with SEG; else over all of m (a scalar)."""
    if SEG:
        if ROWS > 1:
            m = tl.reshape(tl.max(m, axis=1), (BG, ROWS))
        out = tl.max(m, axis=1)
    else:
        out = tl.max(m)
    return out


@triton.jit
def _col_finite_amax16(xs, COL_RHT: tl.constexpr, col_norm):
    """The finite amax of the column layout's 1x16 blocks (RHT16 or none) of a tile held as
    16 register tensors (load_groups16): [BG, BB], block (g, b) at [g, b], 0 where a block
    holds NaN or Inf."""
    if COL_RHT:
        xs = rht16(xs, COL_RHT, col_norm)
    amax = block_amax16(xs, False)[0]
    return tl.where(amax < float("inf"), amax, 0.0)


@triton.jit
def _tensor_amax16_kernel(
    x_ptr,
    stride_a,
    A,
    B,
    col_norm,
    out_ptr,
    BG: tl.constexpr,
    BB: tl.constexpr,
    COL_RHT: tl.constexpr,
    KEEP: tl.constexpr = 0,
):
    """_tensor_amax_kernel's column layout (COL) for 1x16 blocks, RHT16 or none, from the
    tile held as 16 register tensors, as _tensor_amax_pair16_kernel's column half: the
    rotation and the block amax elementwise, where the generic tile goes through transposes.
    Its maxima as _store_max keeps them: per program (KEEP 0), per view row, which is a
    column b of x (KEEP 1: out[p0, b]), or per view block column, which is a group g of 16
    rows of x (KEEP 2: out[p1, g])."""
    p0, p1 = tl.program_id(0), tl.program_id(1)
    g = p0 * BG + tl.arange(0, BG)[:, None]
    b = p1 * BB + tl.arange(0, BB)[None, :]
    m = _col_finite_amax16(load_groups16(x_ptr, stride_a, A, B, g, b), COL_RHT, col_norm)
    if KEEP == 0:
        tl.store(out_ptr + p0 * tl.num_programs(1) + p1, tl.max(m))
    elif KEEP == 1:
        rows = p1 * BB + tl.arange(0, BB)
        tl.store(out_ptr + p0 * (tl.num_programs(1) * BB) + rows, tl.max(m, axis=0))
    else:
        bcols = p0 * BG + tl.arange(0, BG)
        tl.store(out_ptr + p1 * (tl.num_programs(0) * BG) + bcols, tl.max(m, axis=1))

"""Triton twin of numerics/rounding.py: v (scaled magnitude) -> grid level, RTNE or SR.

Uniform grids with a power-of-two step d (e1m2, int4, int4_asym: levels i * d) take a short
path: v / d is exact, so RTNE is rint(v / d) * d (ties to the even integer = the even code)
and SR's lo is floor(v / d) * d, hi = lo + d; the same values the loops find.
Minifloat grids (e2m1) take the same path with d the spacing of v's binade (a power of two
read from v's exponent): within a binade the grid is uniform, every binade starts at an even
code and an even multiple of its d (mantissa bits >= 1), so ties and neighbours agree with
the tables (numerics.rounding.minifloat_mantissa says when a table is such a grid).

Levels (with g_max repeated at the end) and midpoints are small fp32 tables built by the
reference's own code; the loops unroll over at most 17 levels. Returns the level value, not
the code: the midpoints (levels) passed form a prefix, so the last one passed names the code.
`round_to_grid` picks the path from the constexprs of a plan (dispatch.py).
"""

import triton
import triton.language as tl


@triton.jit
def round_rtne(v, lv_ptr, mid_ptr, NLEV: tl.constexpr):
    """Nearest level; v == m_i goes up iff code i+1 is even (ties to the even code)."""
    q = tl.zeros_like(v)
    for i in tl.static_range(NLEV - 1):
        m = tl.load(mid_ptr + i)
        if (i + 1) % 2 == 0:
            passed = v >= m
        else:
            passed = v > m
        q = tl.where(passed, tl.load(lv_ptr + i + 1), q)
    return q


@triton.jit
def round_sr(v, u, lv_ptr, NLEV: tl.constexpr):
    """lo <= v < hi (hi = lo at the top level): round up iff u * (hi - lo) < v - lo."""
    lo = tl.zeros_like(v)
    hi = tl.zeros_like(v) + tl.load(lv_ptr + 1)
    for i in tl.static_range(1, NLEV):
        li = tl.load(lv_ptr + i)
        nxt = tl.load(lv_ptr + i + 1)  # the table repeats g_max at index NLEV
        ge = v >= li
        lo = tl.where(ge, li, lo)
        hi = tl.where(ge, nxt, hi)
    return tl.where(u * (hi - lo) < v - lo, hi, lo)


@triton.jit
def round_to_grid(
    v,
    u,
    lv_ptr,
    mid_ptr,
    SR: tl.constexpr,
    NLEV: tl.constexpr,
    D: tl.constexpr,
    INV_D: tl.constexpr,
    FP_M: tl.constexpr,
):
    """v (clipped to the sign's top level) -> its grid level: SR against u (unused for
    RTNE), else RTNE. D > 0: a uniform grid of power-of-two step D
    (numerics.rounding.uniform_step); FP_M > 0: a minifloat grid with FP_M mantissa bits
    (numerics.rounding.minifloat_mantissa); else the tables."""
    if D > 0 or FP_M > 0:  # a power-of-two step: the grid's own, or v's binade's
        if D > 0:
            d, inv_d = D, INV_D
        else:
            d, inv_d = _minifloat_step(v, FP_M)
        if SR:
            q = _round_stepped_sr(v, u, d, inv_d)
        else:
            q = _rint(v * inv_d) * d
    elif SR:
        q = round_sr(v, u, lv_ptr, NLEV)
    else:
        q = round_rtne(v, lv_ptr, mid_ptr, NLEV)
    return q


@triton.jit
def _minifloat_step(v, M: tl.constexpr):
    """(d, 1/d) at v >= 0 on a minifloat grid whose smallest normal level is 1 (E2M1:
    0, 0.5, 1, 1.5, 2, 3, 4, 6): d = 2^(max(floor(log2 v), 0) - M), read from v's exponent
    field (subnormal and zero v have field 0: d = 2^-M, the subnormal step). Powers of two,
    so v / d = v * (1/d) is exact and the uniform grid's rint/floor give the table's levels."""
    e = tl.maximum(((v.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, 0)
    d = ((e - M + 127) << 23).to(tl.float32, bitcast=True)
    inv_d = ((M - e + 127) << 23).to(tl.float32, bitcast=True)
    return d, inv_d


@triton.jit
def _round_stepped_sr(v, u, d, inv_d):
    """SR where the levels around v are lo = floor(v / d) * d and hi = lo + d: up iff
    u < frac(v / d), the reference's `u * (hi - lo) < v - lo` divided by d.

    Bit for bit the reference's decision, with fewer instructions: q = v / d is exact (d a
    power of two, v in normal range or scaled up), so is frac = q - floor(q) (Sterbenz), and
    u * d and v - lo = frac * d are the exact products of the same comparison by d. hi needs
    no min(., top): v is clipped to a level of the grid, so lo + d exceeds the top only when
    v is the top itself, where frac = 0 and nothing rounds up (hi - lo = 0 in the
    reference). u = k 2^-24 and d >= 2^-M (binades) or the grid's step (dispatch.py takes
    this path for steps >= 2^-60 only), so u * d never underflows."""
    q = v * inv_d
    f = tl.floor(q)
    return tl.where(u < q - f, f + 1.0, f) * d


@triton.jit
def _rint(x):
    """Round to the nearest integer, ties to even (exact for |x| < 2^22: the add rounds)."""
    return (x + 12582912.0) - 12582912.0  # 1.5 * 2^23

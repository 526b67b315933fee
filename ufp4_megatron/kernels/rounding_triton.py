"""Triton twin of numerics/rounding.py: v (scaled magnitude) -> grid level, RTNE or SR.

Uniform grids with a power-of-two step d (e1m2, int4, int4_asym: levels i * d) take a short
path: v / d is exact, so RTNE is rint(v / d) * d (ties to the even integer = the even code)
and SR's lo is floor(v / d) * d, hi = min(lo + d, top); the same values the loops find.

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
def round_to_grid(v, u, lv_ptr, mid_ptr, top, SR: tl.constexpr, NLEV: tl.constexpr,
                  D: tl.constexpr, INV_D: tl.constexpr):
    """v (clipped to the sign's top level) -> its grid level: SR against u (unused for
    RTNE), else RTNE. top: the largest level (g_max, or the two's-complement extra); D > 0: a
    uniform grid of power-of-two step D (numerics.rounding.uniform_step), else the tables."""
    if SR:
        if D > 0:
            q = round_uniform_sr(v, u, top, D, INV_D)
        else:
            q = round_sr(v, u, lv_ptr, NLEV)
    elif D > 0:
        q = round_uniform_rtne(v, D, INV_D)
    else:
        q = round_rtne(v, lv_ptr, mid_ptr, NLEV)
    return q


@triton.jit
def round_uniform_rtne(v, D: tl.constexpr, INV_D: tl.constexpr):
    return _rint(v * INV_D) * D


@triton.jit
def round_uniform_sr(v, u, top, D: tl.constexpr, INV_D: tl.constexpr):
    lo = tl.floor(v * INV_D) * D
    hi = tl.minimum(lo + D, top)
    return tl.where(u * (hi - lo) < v - lo, hi, lo)


@triton.jit
def _rint(x):
    """Round to the nearest integer, ties to even (exact for |x| < 2^22: the add rounds)."""
    return (x + 12582912.0) - 12582912.0  # 1.5 * 2^23

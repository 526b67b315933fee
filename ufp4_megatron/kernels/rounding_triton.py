"""Triton twin of numerics/rounding.py: v (scaled magnitude) -> grid level, RTNE or SR.

Levels (with g_max repeated at the end) and midpoints are small fp32 tables built by the
reference's own code; the loops unroll over at most 17 levels. Returns the level value, not
the code: the midpoints (levels) passed form a prefix, so the last one passed names the code.
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

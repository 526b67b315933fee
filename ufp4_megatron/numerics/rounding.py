"""Rounding of non-negative scaled magnitudes v (in grid units) onto a grid's levels.

rtne: the nearest level; a tie goes to the even code (the level with the even index).
sr:   stochastic, unbiased: between lo <= v < hi it rounds up with probability (v-lo)/(hi-lo),
      decided as `u * (hi - lo) < v - lo` with u from 24 random bits. Every step is an exact
      or correctly rounded fp32 operation, so a kernel reproduces it bit for bit.
Both return the integer code (index into the levels), from which levels are gathered.
"""

from __future__ import annotations

import torch


def midpoints(levels: torch.Tensor) -> torch.Tensor:
    return (levels[:-1] + levels[1:]) * 0.5


def uniform_step(levels: torch.Tensor) -> float | None:
    """The spacing of a uniform grid whose spacing is a power of two (E1M2, INT4), else None.

    levels: every magnitude a code can take, in order, the two's-complement extra included
    (quantize_view's table). On such grids v / step is exact, so the rounding below reduces
    to rint/floor and gives the same codes as the generic comparisons (a test checks both
    paths bit for bit). The kernels take their short path from this same function on the
    same table (kernels/dispatch.py), so both sides always agree on which path runs.
    """
    step = float(levels[1])
    uniform = torch.equal(
        levels, torch.arange(len(levels), dtype=levels.dtype, device=levels.device) * step
    )
    mantissa = torch.frexp(torch.tensor(step))[0].item()
    return step if uniform and mantissa == 0.5 else None


def minifloat_mantissa(levels: torch.Tensor) -> int | None:
    """M when the levels are those of a minifloat with M >= 1 mantissa bits whose smallest
    normal level is 1 (E2M1: M = 1), up to any top level (clipping and SR's min(lo + step,
    top) hold the top); else None.

    Such a grid is uniform within each binade [2^e, 2^(e+1)) (step 2^(e-M); below 1 the
    subnormal step 2^-M), every binade starts at an even code and at an even multiple of its
    step, so rounding v / step (exact: a power of two) to an integer with rint or floor gives
    the nearest level with ties to the even code, or SR's lower level, as the comparisons
    below do. The kernels take that path from this function on the same table
    (kernels/dispatch.py); M = 0 (E3M0: ties across a binade would go to the odd code) and
    other tables keep the comparisons.
    """
    values = levels.tolist()  # one transfer; a handful of levels
    for m in range(1, 4):
        grid = [k * 2.0**-m for k in range(2**m)]
        e = 0
        while len(grid) < len(values):
            grid += [2.0**e * (1 + k * 2.0**-m) for k in range(2**m)]
            e += 1
        if grid[: len(values)] == values:
            return m
    return None


def binade_step(v: torch.Tensor, m: int) -> torch.Tensor:
    """The level spacing at v >= 0 on minifloat_mantissa's grid: 2^(max(floor(log2 v), 0) - m)
    (below 1, and at 0, the subnormal step 2^-m). A power of two, so v / step is exact."""
    _, e = torch.frexp(v)  # v = f * 2^e, f in [0.5, 1): floor(log2 v) = e - 1
    return torch.ldexp(torch.ones_like(v), (e - 1).clamp(min=0) - m)


def _codes(values: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """The code of each value that is one of the levels (NaN: any code)."""
    return torch.searchsorted(levels, values.contiguous()).clamp(max=len(levels) - 1)


def round_rtne(v: torch.Tensor, levels: torch.Tensor, *, generic: bool = False) -> torch.Tensor:
    """Code of the nearest level (int64), ties to the even code (NaN: any code; the
    caller masks non-finite blocks)."""
    step = None if generic else uniform_step(levels)
    if step is not None:  # torch.round is round-half-to-even
        return torch.round(v / step).to(torch.int64).clamp(0, len(levels) - 1)
    m = None if generic else minifloat_mantissa(levels)
    if m is not None:  # the uniform path within v's binade; the level found is exact
        d = binade_step(v, m)
        return _codes(torch.round(v / d) * d, levels)
    mids = midpoints(levels)
    up_on_tie = torch.arange(1, len(levels), device=v.device) % 2 == 0
    code = torch.zeros(v.shape, dtype=torch.int64, device=v.device)
    for i in range(len(mids)):  # n-1 <= 15 comparisons; a kernel unrolls the same loop
        m = mids[i]
        passed = (v > m) | ((v == m) & up_on_tie[i])
        code += passed.to(torch.int64)
    return code


def round_stochastic(
    v: torch.Tensor, levels: torch.Tensor, u: torch.Tensor, *, generic: bool = False
) -> torch.Tensor:
    """Code after unbiased stochastic rounding; u uniform in [0, 1), same shape as v."""
    step = None if generic else uniform_step(levels)
    m = None if generic or step is not None else minifloat_mantissa(levels)
    if step is not None:
        code_lo = torch.floor(v / step).to(torch.int64).clamp(0, len(levels) - 1)
    elif m is not None:
        d = binade_step(v, m)
        code_lo = _codes(torch.floor(v / d) * d, levels)
    else:
        code_lo = torch.zeros(v.shape, dtype=torch.int64, device=v.device)
        for i in range(1, len(levels)):
            code_lo += (v >= levels[i]).to(torch.int64)
    code_hi = (code_lo + 1).clamp(max=len(levels) - 1)
    lo, hi = levels[code_lo], levels[code_hi]
    up = u * (hi - lo) < (v - lo)
    return torch.where(up, code_hi, code_lo)

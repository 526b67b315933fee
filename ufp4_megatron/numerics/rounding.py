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
    uniform = torch.equal(levels, torch.arange(len(levels), dtype=levels.dtype,
                                               device=levels.device) * step)
    mantissa = torch.frexp(torch.tensor(step))[0].item()
    return step if uniform and mantissa == 0.5 else None


def round_rtne(v: torch.Tensor, levels: torch.Tensor, *, generic: bool = False) -> torch.Tensor:
    """Code of the nearest level (int64), ties to the even code (NaN: any code; the
    caller masks non-finite blocks)."""
    step = None if generic else uniform_step(levels)
    if step is not None:  # torch.round is round-half-to-even
        return torch.round(v / step).to(torch.int64).clamp(0, len(levels) - 1)
    mids = midpoints(levels)
    up_on_tie = (torch.arange(1, len(levels), device=v.device) % 2 == 0)
    code = torch.zeros(v.shape, dtype=torch.int64, device=v.device)
    for i in range(len(mids)):  # n-1 <= 15 comparisons; a kernel unrolls the same loop
        m = mids[i]
        passed = (v > m) | ((v == m) & up_on_tie[i])
        code += passed.to(torch.int64)
    return code


def round_stochastic(v: torch.Tensor, levels: torch.Tensor, u: torch.Tensor, *,
                     generic: bool = False) -> torch.Tensor:
    """Code after unbiased stochastic rounding; u uniform in [0, 1), same shape as v."""
    step = None if generic else uniform_step(levels)
    if step is not None:
        code_lo = torch.floor(v / step).to(torch.int64).clamp(0, len(levels) - 1)
    else:
        code_lo = torch.zeros(v.shape, dtype=torch.int64, device=v.device)
        for i in range(1, len(levels)):
            code_lo += (v >= levels[i]).to(torch.int64)
    code_hi = (code_lo + 1).clamp(max=len(levels) - 1)
    lo, hi = levels[code_lo], levels[code_hi]
    up = u * (hi - lo) < (v - lo)
    return torch.where(up, code_hi, code_lo)

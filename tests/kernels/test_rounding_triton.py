"""rounding_triton.round_to_grid against numerics.rounding, value by value.

The kernels' rounding runs on the constexprs and tables of dispatch.py's own plan (short path
for power-of-two steps, binade path for E2M1, level tables otherwise) and is compared bit for
bit with the reference's level for the same v and u. The SR cases include the uniforms that
sit exactly at, just below and just above each v's fraction of its step (where the kernel's
`u < frac(v / d)` and the reference's `u * (hi - lo) < v - lo` could part), every level, the
top, midpoints and their fp32 neighbours, and tiny and subnormal v.
"""

import pytest
import torch
import triton
import triton.language as tl

from ufp4_megatron.kernels import dispatch
from ufp4_megatron.kernels.rounding_triton import round_to_grid
from ufp4_megatron.numerics.grids import get_grid
from ufp4_megatron.numerics.quantize import OperandFormat
from ufp4_megatron.numerics.rounding import (
    binade_step,
    minifloat_mantissa,
    round_rtne,
    round_stochastic,
    uniform_step,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BLOCK = 1024


@triton.jit
def _round_kernel(
    v_ptr,
    u_ptr,
    out_ptr,
    lv_ptr,
    mid_ptr,
    n,
    SR: tl.constexpr,
    NLEV: tl.constexpr,
    D: tl.constexpr,
    INV_D: tl.constexpr,
    FP_M: tl.constexpr,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    v = tl.load(v_ptr + i, mask=m, other=0.0)
    u = tl.load(u_ptr + i, mask=m, other=0.0)
    q = round_to_grid(v, u, lv_ptr, mid_ptr, SR, NLEV, D, INV_D, FP_M)
    tl.store(out_ptr + i, q, mask=m)


def _levels(grid) -> torch.Tensor:
    """quantize_view's level table: the grid's levels and its two's-complement extra."""
    g = get_grid(grid)
    lv = g.levels_tensor()
    return torch.cat([lv, lv.new_tensor([g.neg_extra])]) if g.neg_extra is not None else lv


def _values(levels: torch.Tensor) -> torch.Tensor:
    """Every level, the midpoints, 1/16 fractions of each interval, the fp32 neighbours of
    all of them within [0, top], and tiny and subnormal values."""
    lo, hi = levels[:-1], levels[1:]
    fractions = torch.arange(1, 16) / 16.0
    inner = (lo[:, None] + (hi - lo)[:, None] * fractions[None, :]).reshape(-1)
    pts = torch.cat([levels, (lo + hi) / 2, inner])
    top = levels[-1]
    pts = torch.cat(
        [pts, torch.nextafter(pts, torch.zeros(())), torch.nextafter(pts, top.expand_as(pts))]
    )
    tiny = torch.tensor([1e-30, 1e-38, 1e-40, 1e-45, 2.0**-100])
    return torch.unique(torch.cat([pts.clamp(0, float(top)), tiny]))


def _steps(v: torch.Tensor, levels: torch.Tensor) -> torch.Tensor | None:
    """The power-of-two step d at each v of the grid's short path, None for level tables."""
    step = uniform_step(levels)
    if step is not None:
        return torch.full_like(v, step)
    m = minifloat_mantissa(levels)
    return None if m is None else binade_step(v, m)


def _uniforms(v: torch.Tensor, levels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(v, u) pairs: each v with fixed uniforms and with the 24-bit uniforms at, below and
    above its fraction of the step (where a step applies)."""
    ulp = 2.0**-24
    fixed = torch.tensor([0.0, ulp, 0.25, 0.5, 0.75, 1 - ulp])
    vs, us = [v.repeat_interleave(len(fixed))], [fixed.repeat(len(v))]
    d = _steps(v, levels)
    if d is not None:
        q = v.double() / d.double()
        k = torch.floor((q - torch.floor(q)) * 2**24)  # u = k 2^-24 <= frac < u + 2^-24
        for dk in (-1, 0, 1):
            u = ((k + dk).clamp(0, 2**24 - 1) * ulp).float()
            vs.append(v)
            us.append(u)
    return torch.cat(vs), torch.cat(us)


def _kernel_round(v, u, grid, rounding):
    plan = dispatch._plan(torch.float32, torch.device(DEVICE), OperandFormat(grid), None)
    assert not isinstance(plan, str), plan
    c = plan.consts
    out = torch.empty_like(v)
    _round_kernel[(triton.cdiv(len(v), BLOCK),)](
        v,
        u,
        out,
        plan.lv,
        plan.mid,
        len(v),
        SR=rounding == "sr",
        NLEV=c["NLEV"],
        D=c["D"],
        INV_D=c["INV_D"],
        FP_M=c["FP_M"],
        BLOCK=BLOCK,
    )
    return out, c


GRIDS = ["e1m2", "int4", "int4_asym", "e2m1", (0.0, 0.5, 1.0, 1.5, 2.0), (0.0, 0.5, 1.0, 3.0)]


@pytest.mark.parametrize("rounding", ["rtne", "sr"])
@pytest.mark.parametrize("grid", GRIDS, ids=str)
def test_round_to_grid_is_the_reference_level(grid, rounding):
    levels = _levels(grid)
    v = _values(levels)
    u = torch.zeros_like(v)
    if rounding == "sr":
        v, u = _uniforms(v, levels)
    got, consts = _kernel_round(v.to(DEVICE), u.to(DEVICE), grid, rounding)
    if rounding == "sr":
        code = round_stochastic(v, levels, u)
    else:
        code = round_rtne(v, levels)
    want = levels[code]
    assert torch.equal(got.cpu(), want), (
        f"{grid} {rounding}: {int((got.cpu() != want).sum())} of {len(v)} differ, first at "
        f"v={v[(got.cpu() != want)][0].item()!r}"
    )
    # the path each grid takes: its step, its binade, or the tables
    step, m = uniform_step(levels), minifloat_mantissa(levels)
    assert consts["D"] == (step or 0.0)
    assert consts["FP_M"] == (0 if step else m or 0)


def test_sr_round_up_rate_is_the_fraction():
    # the decision itself, over 4096 evenly spaced uniforms: the share of them that rounds up
    # is frac(v / d) to within 1/4096
    v = torch.tensor([0.3, 1.0 + 2.0**-20, 1.74])
    u = (torch.arange(4096) * 4096 + 7).float() * 2.0**-24
    vv, uu = v.repeat_interleave(len(u)), u.repeat(len(v))
    got, _ = _kernel_round(vv.to(DEVICE), uu.to(DEVICE), "e1m2", "sr")
    up = (got.cpu() > torch.floor(vv / 0.25) * 0.25).reshape(len(v), -1).float().mean(1)
    frac = (v.double() / 0.25) - torch.floor(v.double() / 0.25)
    assert torch.allclose(up.double(), frac, atol=1 / 4096 + 1e-12), (up, frac)

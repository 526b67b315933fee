"""Grid values and exact rounding.

Contracts:
- each named grid has exactly the paper's magnitudes; E1M2 and INT4 are the same grid x4;
- a value already on the grid is returned unchanged (RTNE and SR);
- RTNE ties go to the even code; everything else to the nearest level;
- invalid codebooks and names fail with a message listing the valid choices.
"""

import pytest
import torch

from ufp4_megatron import get_grid, quantize
from ufp4_megatron.numerics.rounding import round_rtne, round_stochastic


def test_named_grids_have_the_paper_levels():
    assert get_grid("e2m1").levels == (0, 0.5, 1, 1.5, 2, 3, 4, 6)
    assert get_grid("e1m2").levels == tuple(i / 4 for i in range(8))
    assert get_grid("int4").levels == tuple(range(8))
    assert get_grid("int4_asym").neg_extra == 8.0


def test_e1m2_equals_int4_after_scaling():
    e1m2 = torch.tensor(get_grid("e1m2").levels)
    assert torch.equal(e1m2 * 4, torch.tensor(get_grid("int4").levels))
    x = torch.randn(64, 256, dtype=torch.float32)
    assert torch.equal(quantize(x, "e1m2"), quantize(x, "int4"))
    assert torch.equal(
        quantize(x, "e1m2", rht=16, rounding="sr", seed=3),
        quantize(x, "int4", rht=16, rounding="sr", seed=3),
    )


@pytest.mark.parametrize("fmt", ["e2m1", "e1m2", "int4"])
def test_values_on_the_grid_are_fixed_points(fmt):
    levels = torch.tensor(get_grid(fmt).levels)
    block = torch.cat([levels, -levels.flip(0)])  # 16 values, amax = g_max, so s = 1
    x = block.repeat(4, 1)
    assert torch.equal(quantize(x, fmt), x)
    assert torch.equal(quantize(x, fmt, rounding="sr", seed=7), x)


def test_rtne_ties_go_to_the_even_code_e2m1():
    lv = torch.tensor(get_grid("e2m1").levels)
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    # code i+1 even -> tie up; odd -> tie down
    expected = torch.tensor([0, 2, 2, 4, 4, 6, 6])
    assert torch.equal(round_rtne(mids, lv), expected)
    eps = 1e-6
    assert torch.equal(round_rtne(mids + eps, lv), torch.arange(1, 8))
    assert torch.equal(round_rtne(mids - eps, lv), torch.arange(0, 7))


def test_rtne_ties_uniform_grid_match_round_half_even():
    lv = torch.arange(8, dtype=torch.float32)
    v = torch.arange(0, 7, dtype=torch.float32) + 0.5
    assert torch.equal(round_rtne(v, lv), torch.round(v).long())


def test_stochastic_rounding_picks_only_the_two_neighbours():
    lv = torch.tensor(get_grid("e2m1").levels)
    v = torch.rand(10000) * 6
    u = torch.rand(10000)
    code = round_stochastic(v, lv, u)
    q = lv[code]
    lo = lv[(v[:, None] >= lv[None, 1:]).sum(1)]
    assert torch.all((q == lo) | (q > v))
    assert torch.all(q >= lo)


def test_codebook_grid_roundtrip_and_errors():
    x = torch.tensor([[0.0, 1.0, 2.0, 4.0, -4.0, 2.9, 3.1, -0.4] * 2])
    q = quantize(x, (0, 1, 2, 4))
    assert torch.equal(q[0, :8], torch.tensor([0.0, 1, 2, 4, -4, 2, 4, 0]))
    with pytest.raises(ValueError, match="start at 0"):
        get_grid((0.5, 1.0))
    with pytest.raises(ValueError, match="strictly increasing"):
        get_grid((0, 2, 1))
    with pytest.raises(ValueError, match="valid: e2m1, e1m2, int4, int4_asym"):
        get_grid("fp4")


def test_int4_asym_reaches_minus_eight_only_for_negative_amax():
    x = torch.zeros(1, 16)
    x[0, 0], x[0, 1] = -8.0, 7.0
    q = quantize(x, "int4_asym")
    assert q[0, 0] == -8.0 and q[0, 1] == 7.0  # s = 1: -8 and 7 are both exact
    y = -x
    qy = quantize(y, "int4_asym")  # amax positive: s = 8/7; -7 -> -6.125 s -> -6 s
    assert torch.isclose(qy[0, 0], torch.tensor(8.0))
    assert torch.isclose(qy[0, 1], torch.tensor(-6.0 * 8 / 7))


@pytest.mark.parametrize("fmt", ["e1m2", "int4"])
def test_uniform_fast_path_equals_generic_comparisons_bitwise(fmt):
    from ufp4_megatron.numerics.rounding import uniform_step

    lv = get_grid(fmt).levels_tensor()
    assert uniform_step(lv) is not None and uniform_step(get_grid("e2m1").levels_tensor()) is None
    g = lv[-1]
    v = torch.cat(
        [
            torch.rand(20000) * g,
            lv,
            (lv[:-1] + lv[1:]) / 2,  # levels and ties
            torch.nextafter((lv[:-1] + lv[1:]) / 2, torch.tensor(0.0)),
            g.reshape(1),
        ]
    )
    u = torch.rand(v.shape)
    assert torch.equal(round_rtne(v, lv), round_rtne(v, lv, generic=True))
    assert torch.equal(round_stochastic(v, lv, u), round_stochastic(v, lv, u, generic=True))


def _ties_and_neighbours(lv: torch.Tensor) -> torch.Tensor:
    mids = (lv[:-1] + lv[1:]) / 2
    lo, hi = torch.tensor(0.0), lv[-1]
    return torch.cat(
        [
            lv,
            mids,
            torch.nextafter(mids, lo),
            torch.nextafter(mids, hi),
            torch.nextafter(lv, lo).clamp(min=0),
            torch.nextafter(lv, hi).clamp(max=hi),
            torch.tensor([0.0, 1e-45, 1e-40, 1e-30]),
        ]
    )


@pytest.mark.parametrize(
    "levels",
    [get_grid("e2m1").levels, (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0), (0.0, 0.5, 1.0, 1.5, 2.0, 3.0)],
    ids=str,
)
def test_minifloat_fast_path_equals_generic_comparisons_bitwise(levels):
    """E2M1 (and codebooks that are its prefixes) round within v's binade: the same codes as
    the comparisons, at every level, tie, neighbour of either and subnormal v."""
    from ufp4_megatron.numerics.rounding import minifloat_mantissa

    lv = torch.tensor(levels)
    assert minifloat_mantissa(lv) == 1
    v = torch.cat([torch.rand(50000) * lv[-1], _ties_and_neighbours(lv)])
    u = torch.cat([torch.rand(v.shape), torch.zeros(v.shape), torch.full(v.shape, 1 - 2**-24)])
    v3 = v.repeat(3)
    assert torch.equal(round_rtne(v, lv), round_rtne(v, lv, generic=True))
    assert torch.equal(round_stochastic(v3, lv, u), round_stochastic(v3, lv, u, generic=True))


@pytest.mark.parametrize(
    "levels,m",
    [
        (get_grid("e2m1").levels, 1),
        (get_grid("e1m2").levels, 2),
        (get_grid("int4").levels, None),  # uniform, step 1: not a minifloat with min normal 1
        ((0.0, 1.0, 2.0, 4.0), None),  # E3M0: ties across a binade would go to the odd code
        ((0.0, 0.5, 1.0, 2.0), None),
        ((0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0), None),
    ],
    ids=str,
)
def test_minifloat_mantissa_names_only_minifloat_grids(levels, m):
    from ufp4_megatron.numerics.rounding import minifloat_mantissa

    assert minifloat_mantissa(torch.tensor(levels)) == m

"""SR keys per segment (numerics/segments.py), the reference of the grouped experts' launches.

Contracts:
- test_segment_bits_are_each_segments_own_position_bits: the bits of segment i are
  position_bits of a tensor of its own (seed i, origin at its first row/column), rows and
  columns, empty segments included;
- test_quantize_view_with_segments_equals_quantizing_each_segment: one quantize_view over all
  segments equals the concatenation of one call per segment (SR, RHT16/32, blocks 16/32,
  keep_padding), and differs from one seed for the whole view (segments matter);
- test_segments_change_nothing_under_rtne (fp32 scales);
- test_e4m3_segments_take_each_segments_tensor_scale: under e4m3 scales (NVFP4) each segment
  takes its own tensor amax, so one call equals one call per segment, RTNE and SR, rows and
  columns, 1x16 blocks and 16x16 tiles, RHT16, a padded last tile, an empty segment, and a
  NaN block that stays in its own block; and differs from one tensor amax for the view;
- test_e4m3_segments_that_straddle_a_block_are_refused (one line naming the unit);
- test_bad_segments_say_what_to_pass.
"""

import pytest
import torch

from ufp4_megatron.numerics.hadamard import RHT
from ufp4_megatron.numerics.philox import position_bits
from ufp4_megatron.numerics.quantize import quantize_view
from ufp4_megatron.numerics.segments import Segments, segment_bits

STARTS, SEEDS = (0, 16, 16, 48), (11, 2**62 + 5, 33, 7)  # segment 1 is empty


def _split(t: torch.Tensor, starts, axis):
    ends = (*starts[1:], t.shape[axis])
    return [t.narrow(axis, s, e - s) for s, e in zip(starts, ends)]


@pytest.mark.parametrize("axis", (0, 1))
def test_segment_bits_are_each_segments_own_position_bits(axis):
    rows, cols = (60, 24) if axis == 0 else (24, 60)
    got = segment_bits(rows, cols, Segments(axis, STARTS, SEEDS), origin=(3, 8))
    parts = _split(got, STARTS, axis)
    for part, seed in zip(parts, SEEDS):
        want = position_bits(part.shape[0], part.shape[1], seed, origin=(3, 8))
        assert torch.equal(part, want)


@pytest.mark.parametrize("axis", (0, 1))
@pytest.mark.parametrize(
    "kw",
    [
        dict(rht=RHT(16, 1)),
        dict(rht=RHT(32, 2)),
        dict(block=32),
        dict(rht=RHT(16, 1), keep_padding=True),
    ],
)
def test_quantize_view_with_segments_equals_quantizing_each_segment(axis, kw):
    # column segments are blocks along the quantized dim: they start at multiples of the
    # block/RHT unit (the precondition of the equality)
    unit = 32 if kw.get("block") == 32 or kw.get("rht", RHT(16, 0)).size == 32 else 16
    starts = STARTS if axis == 0 else tuple(s * unit // 16 for s in STARTS)
    g = torch.Generator().manual_seed(axis)
    x = torch.randn(64, 64 if axis == 0 else 4 * unit, generator=g).bfloat16()
    x = x[:, :56] if axis == 0 and not kw.get("rht") else x  # a padded last block (rows)
    args = dict(rounding="sr", origin=(5, 4), **kw)
    got = quantize_view(x, "e1m2", segments=Segments(axis, starts, SEEDS), **args)
    parts = [
        quantize_view(p, "e1m2", seed=s, **args) for p, s in zip(_split(x, starts, axis), SEEDS)
    ]
    assert torch.equal(got, torch.cat(parts, dim=axis))
    assert not torch.equal(got, quantize_view(x, "e1m2", seed=SEEDS[0], **args))


def test_segments_change_nothing_under_rtne():
    x = torch.randn(48, 32)
    assert torch.equal(
        quantize_view(x, "e2m1", segments=Segments(0, STARTS[:3], SEEDS[:3])),
        quantize_view(x, "e2m1"),
    )


@pytest.mark.parametrize(
    "args,match",
    [
        ((2, (0,), (1,)), "axis must be 0"),
        ((True, (0,), (1,)), "axis must be 0"),
        ((0, (), ()), "one seed per start"),
        ((0, (0, 16), (1,)), "one seed per start"),
        ((0, (4, 16), (1, 2)), "begin at 0 and never decrease"),
        ((0, (0, 32, 16), (1, 2, 3)), "begin at 0 and never decrease"),
        ((1, (0, 6), (1, 2)), "multiples of 4"),
        ((0, (0, -16), (1, 2)), "segment start must be an int >= 0"),
        ((0, (0, 1.5), (1, 2)), "segment start must be an int"),
        ((0, (0,), (2**63,)), r"segment seed must be an int in \[0, 2\^63\)"),
    ],
)
def test_bad_segments_say_what_to_pass(args, match):
    with pytest.raises(ValueError, match=match):
        Segments(*args)


E4M3_CASES = [  # (axis, options): NVFP4's operands (1x16 activations, 16x16 weight tiles)
    (0, dict()),
    (0, dict(block_2d=True)),
    (0, dict(rounding="sr", origin=(5, 4))),
    (1, dict(rht=RHT(16, 1))),
    (1, dict(rht=RHT(16, 1), rounding="sr", origin=(0, 8))),
    (1, dict(block_2d=True)),
    (0, dict(rht=RHT(16, 1), keep_padding=True)),
]


@pytest.mark.parametrize("axis,kw", E4M3_CASES)
def test_e4m3_segments_take_each_segments_tensor_scale(axis, kw):
    g = torch.Generator().manual_seed(7 + axis)
    x = torch.randn(64, 64, generator=g).bfloat16()
    x[16:] *= 40  # segments of different ranges: one tensor amax would shrink the small one
    if axis == 1:
        x = x.t().contiguous()
    if kw.get("block_2d") and axis == 0:
        x = x[:56]  # the last 16-row tile padded
    x[20, 3 if axis == 0 else 20] = float("nan")  # one NaN block, in segment 2
    args = dict(grid="e1m2", scale="e4m3", **kw)
    segments = Segments(axis, STARTS, SEEDS)
    got = quantize_view(x, segments=segments, **args)
    parts = [quantize_view(p, seed=s, **args) for p, s in zip(_split(x, STARTS, axis), SEEDS)]
    assert torch.equal(got.isnan(), torch.cat(parts, dim=axis).isnan())
    assert torch.equal(got.nan_to_num(), torch.cat(parts, dim=axis).nan_to_num())
    assert got.isnan().sum() in (16, 256)  # the NaN's block (or tile) alone
    whole = quantize_view(x, seed=SEEDS[0], **args)
    assert not torch.equal(got.nan_to_num(), whole.nan_to_num())


@pytest.mark.parametrize(
    "axis,starts,kw,unit",
    [
        (0, (0, 8), dict(block_2d=True), 16),  # a 16x16 tile over two experts' rows
        (1, (0, 8), dict(), 16),  # a block along the quantized dim over two segments
        (1, (0, 16), dict(rht=RHT(32, 0)), 32),
    ],
)  # an RHT32 group over two segments
def test_e4m3_segments_that_straddle_a_block_are_refused(axis, starts, kw, unit):
    x = torch.randn(64, 64)
    with pytest.raises(ValueError, match=f"e4m3 tensor scales .* multiples of {unit}"):
        quantize_view(x, "e1m2", scale="e4m3", segments=Segments(axis, starts, (1, 2)), **kw)
    # one tensor amax for the whole view, or fp32 scales: nothing to straddle
    quantize_view(
        x,
        "e1m2",
        scale="e4m3",
        tensor_amax=torch.tensor(3.0),
        segments=Segments(axis, starts, (1, 2)),
        **kw,
    )

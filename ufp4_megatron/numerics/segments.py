"""Stochastic-rounding keys per segment: one 2D view holding several tensors' rows or columns.

A grouped GEMM quantizes all experts' operands in one call: expert e owns a segment of the
view's rows (the padded token matrix, the stacked weights) or columns (their transposes).
Without segments an element's SR bits are keyed by its position in the whole view (philox.py:
counter (C >> 2, R), one seed), so an expert's bits would depend on how many rows the experts
before it own. With `Segments`, element (r, c) of segment i is keyed as if segment i were a
tensor of its own: seed `seeds[i]`, and along the segmented axis its position counted from
`starts[i]`:

    axis 0 (rows):    R = r - starts[i] + origin[0],  C = c + origin[1]
    axis 1 (columns): R = r + origin[0],              C = c - starts[i] + origin[1]

Segment i covers [starts[i], starts[i + 1]) (the last one runs to the end); equal starts make
empty segments (experts without tokens). Quantizing a view with segments therefore equals
quantizing each segment on its own with its seed and the same origin, when blocks along the
quantized dim do not cross segments (a test checks it). Column starts must be multiples of 4
(one Philox call serves 4 neighbouring columns).

E4M3 scales (NVFP4) carry a tensor-level amax; with segments each segment takes its own
(`segment_tensor_amax`: the largest finite block amax of its blocks), as a tensor of its own
would, whatever the rounding. That needs blocks (and 2D tiles, and RHT groups) that never
straddle two segments: `tensor_scale_segments_problem` says when they would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .checks import SEED_LIMIT, check_int, check_seed
from .philox import philox_rounds

_MASK32 = 0xFFFFFFFF


@dataclass(frozen=True)
class Segments:
    """Per-segment SR keys along one axis of a 2D view (see the module docstring).

    axis:   0 when segments are row ranges, 1 when they are column ranges.
    starts: first position of each segment; starts[0] == 0, non-decreasing.
    seeds:  one SR seed per segment, ints in [0, 2^63); or a 1-D int64 tensor of them (a row
            of a key table drawn on the device, philox.py: the kernels read it in place,
            the reference reads its values).
    """

    axis: int
    starts: tuple[int, ...]
    seeds: tuple[int, ...] | torch.Tensor

    def __post_init__(self):
        if self.axis not in (0, 1) or isinstance(self.axis, bool):
            raise ValueError(
                f"Segments.axis must be 0 (row ranges) or 1 (column ranges), got {self.axis!r}"
            )
        starts = tuple(self.starts)
        if isinstance(self.seeds, torch.Tensor):
            if self.seeds.dtype != torch.int64 or self.seeds.dim() != 1:
                raise ValueError(
                    f"Segments.seeds as a tensor must be 1-D int64 (a key table's "
                    f"row), got {self.seeds.dtype} of shape "
                    f"{tuple(self.seeds.shape)}"
                )
            seeds = self.seeds
        else:
            seeds = tuple(self.seeds)
        plain = (
            all(type(v) is int for v in starts)
            and min(starts, default=0) >= 0
            and (
                isinstance(seeds, torch.Tensor)
                or (
                    all(type(v) is int for v in seeds)
                    and min(seeds, default=0) >= 0
                    and max(seeds, default=0) < SEED_LIMIT
                )
            )
        )
        if not plain:  # one value at a time, for a message naming it (a grouped GEMM builds
            #            Segments per call: plain ints skip this)
            starts = tuple(check_int(s, "a segment start", 0) for s in starts)
            if not isinstance(seeds, torch.Tensor):
                seeds = tuple(check_seed(s, "a segment seed") for s in seeds)
        if not starts or len(starts) != len(seeds):
            raise ValueError(
                f"Segments need one seed per start and at least one segment, got "
                f"{len(starts)} starts and {len(seeds)} seeds"
            )
        if starts[0] != 0 or any(b < a for a, b in zip(starts, starts[1:])):
            raise ValueError(f"segment starts must begin at 0 and never decrease, got {starts}")
        if self.axis == 1 and any(s % 4 for s in starts):
            raise ValueError(
                f"column segments must start at multiples of 4 (one Philox call "
                f"serves 4 neighbouring columns), got {starts}"
            )
        object.__setattr__(self, "starts", starts)
        object.__setattr__(self, "seeds", seeds)

    def index(self, positions: torch.Tensor) -> torch.Tensor:
        """The segment of each position along the axis (int64, same shape)."""
        starts = torch.tensor(self.starts, dtype=torch.int64, device=positions.device)
        return torch.searchsorted(starts, positions, right=True) - 1


def segment_bits(
    rows: int, cols: int, segments: Segments, origin: tuple[int, int] = (0, 0), device=None
) -> torch.Tensor:
    """uint32 bits (int64 tensor [rows, cols]) keyed per segment; philox.position_bits with
    each segment's seed and its position counted from the segment's start."""
    r0, c0 = origin
    if c0 % 4:
        raise ValueError(f"column origin must be a multiple of 4, got {c0}")
    groups = (cols + 3) // 4
    R = torch.arange(rows, device=device, dtype=torch.int64)[:, None]
    C = 4 * torch.arange(groups, device=device, dtype=torch.int64)[None, :]  # first column
    pos = R if segments.axis == 0 else C
    seg = segments.index(pos)
    start = torch.tensor(segments.starts, dtype=torch.int64, device=device)[seg]
    seed = torch.as_tensor(segments.seeds, dtype=torch.int64, device=device)[seg]
    if segments.axis == 0:
        R = R - start
    else:
        C = C - start
    words = philox_rounds((C + c0) >> 2, R + r0, 0, 0, seed & _MASK32, (seed >> 32) & _MASK32)
    return torch.stack(torch.broadcast_tensors(*words), dim=-1).reshape(rows, groups * 4)[:, :cols]


def tensor_scale_segments_problem(
    segments: Segments, *, block: int, block_2d: bool, rht_size: int | None
) -> str | None:
    """Why per-segment e4m3 tensor scales cannot equal quantizing each segment on its own
    (a block, 2D tile or RHT group would hold two segments' values), or None. Row segments
    need starts at multiples of the block with 2D tiles; column segments (along the quantized
    dim) at multiples of the block and RHT size."""
    if segments.axis == 0:
        unit = block if block_2d else 1
    else:
        unit = math.lcm(block, rht_size or 1)
    if any(s % unit for s in segments.starts):
        kind = "row" if segments.axis == 0 else "column"
        return (
            f"{kind} segments starting at {segments.starts} with e4m3 tensor scales (a "
            f"{'2D tile' if segments.axis == 0 else 'block or RHT group'} would span two "
            f"segments: starts must be multiples of {unit})"
        )
    return None


def segment_tensor_amax(amax: torch.Tensor, segments: Segments, block: int) -> torch.Tensor:
    """E4M3's tensor amax per segment from the block amax [R, C // B] of a padded view:
    the largest finite block amax of each segment (0 when it has none, as
    scaling.finite_tensor_amax for a whole tensor), broadcastable to the block amax: [R, 1]
    for row segments, [1, C // B] for column segments (block k starts at column k B)."""
    R, nb = amax.shape
    finite = torch.where(torch.isfinite(amax), amax, torch.zeros_like(amax))
    if segments.axis == 0:
        per = finite.amax(dim=1) if nb else finite.new_zeros(R)
        pos = torch.arange(R, device=amax.device)
    else:
        per = finite.amax(dim=0) if R else finite.new_zeros(nb)
        pos = torch.arange(nb, device=amax.device) * block
    idx = segments.index(pos)
    seg = finite.new_zeros(len(segments.starts)).scatter_reduce(0, idx, per, "amax")
    out = seg[idx]
    return out[:, None] if segments.axis == 0 else out[None, :]

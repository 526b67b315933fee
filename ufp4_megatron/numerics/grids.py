"""Element grids: the non-negative magnitudes a 4-bit code can take (sign handled apart).

E2M1 {0, .5, 1, 1.5, 2, 3, 4, 6} is what FP4 hardware implements; its spacing doubles at 2
and 4, so the bins there are asymmetric and round-to-nearest shrinks values on average
(Shrinkage Bias). E1M2 {0, .25, ..., 1.75} and symmetric INT4 {0..7} are uniform and the
same grid up to scale. `int4_asym` is two's-complement INT4 (-8..7): its magnitudes are
0..7 for positives and 0..8 for negatives, so it is represented by `neg_max`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from functools import lru_cache

import torch


@dataclass(frozen=True)
class Grid:
    """Sorted non-negative levels l_0 = 0 < ... < l_{n-1} = g_max, sign-symmetric.

    neg_extra: an extra magnitude available to negative values only (two's-complement
    INT4's -8); None for symmetric grids.
    """

    name: str
    levels: tuple[float, ...]
    neg_extra: float | None = None

    @property
    def g_max(self) -> float:
        return self.levels[-1]

    @property
    def num_codes(self) -> int:
        """Distinct signed values: 2n - 1 (one zero), plus the extra negative level."""
        return 2 * len(self.levels) - 1 + (self.neg_extra is not None)

    def levels_tensor(self, device=None) -> torch.Tensor:
        return torch.tensor(self.levels, dtype=torch.float32, device=device)


GRIDS: dict[str, Grid] = {
    "e2m1": Grid("e2m1", (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)),
    "e1m2": Grid("e1m2", tuple(i * 0.25 for i in range(8))),
    "int4": Grid("int4", tuple(float(i) for i in range(8))),
    "int4_asym": Grid("int4_asym", tuple(float(i) for i in range(8)), neg_extra=8.0),
}


def get_grid(grid: str | Grid | tuple | list) -> Grid:
    """A grid by name, or a custom codebook of non-negative sorted levels starting at 0."""
    if isinstance(grid, Grid):
        return grid
    if isinstance(grid, str):
        if grid not in GRIDS:
            raise ValueError(
                f"unknown grid {grid!r}; valid: {', '.join(GRIDS)}, or a "
                "codebook tuple of non-negative sorted levels such as (0, 1, 2, 4)"
            )
        return GRIDS[grid]
    return _codebook(codebook_levels(grid))


def codebook_levels(grid) -> tuple[float, ...]:
    """A codebook given as any sequence of numbers -> a tuple of floats (hashable, so a
    recipe holding it stays a hashable value)."""
    try:
        values = tuple(grid)
    except TypeError:
        raise ValueError(
            f"grid must be a grid name ({', '.join(GRIDS)}) or a codebook tuple "
            f"of levels such as (0, 1, 2, 4), got {grid!r}"
        ) from None
    if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values):
        raise ValueError(f"codebook levels must be numbers, got {grid!r}")
    return tuple(float(v) for v in values)


@lru_cache(maxsize=64)
def _codebook(levels: tuple[float, ...]) -> Grid:
    if not all(math.isfinite(v) for v in levels):
        raise ValueError(
            f"codebook levels must be finite numbers, got {levels}: an inf or nan "
            "level would turn every block into zeros or NaN"
        )
    if len(levels) < 2 or len(levels) > 16:
        raise ValueError(f"a codebook needs 2 to 16 magnitudes, got {len(levels)}")
    if levels[0] != 0.0:
        raise ValueError(
            f"a codebook must start at 0 (got {levels[0]}): the grid is "
            "sign-symmetric and zero must be exact"
        )
    if any(b <= a for a, b in zip(levels, levels[1:])):
        raise ValueError(f"codebook levels must be strictly increasing, got {levels}")
    for v in levels:
        if torch.tensor(v, dtype=torch.float32).item() != v:
            raise ValueError(f"codebook level {v} is not exactly representable in float32")
    return Grid("codebook", levels)

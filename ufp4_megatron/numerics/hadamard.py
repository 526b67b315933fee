"""Random Hadamard Transform (RHT): a signed Sylvester Hadamard matrix, applied blockwise.

rotate(x) = x . D . H / sqrt(n) on each aligned block of n elements along a dim, with D a
diagonal of random signs. D H / sqrt(n) is orthonormal, so applying the same RHT to both
operands of a GEMM along its reduction dim cancels inside the product: (A R)(B R)^T = A B^T.

The reference computes H with the fast Walsh-Hadamard butterfly in fp32 in a fixed order
(h = 1, 2, 4, ...: pairs (i, i+h) -> (a+b, a-b)); every step is one IEEE operation, so a
kernel doing the same butterfly matches bit for bit.

Scaling: the butterfly sums n values, so it runs on x / n (exact: a power of two) and its
result is multiplied by fp32(1/sqrt(n)) * n (exact too: fp32(sqrt(n))). No intermediate then
exceeds max|x|, and the result is the same bits as butterfly(x) * fp32(1/sqrt(n)) wherever
that did not overflow: a block of finite values up to fp32's max / sqrt(n) (8.5e37 for
RHT16) rotates to finite values, where the unscaled butterfly reached inf near 2.1e37 (and
inf - inf = NaN). Only blocks holding values below 2^-126 * n (2^-122, about 1.9e-37, for
RHT16) may round differently: x / n is subnormal there. A rotated value beyond fp32's range
(a block near fp32's max) is inf, and its block quantizes to NaN as an input inf would.
"""

from __future__ import annotations

import functools
import math
import numbers

import torch

from .checks import check_dim, check_float_tensor, check_seed

SIZES = (16, 32, 64, 128)


def rotated_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype rotated values are returned in: float16 becomes float32 (a rotation grows a
    block's values by up to sqrt(n): |x| >= 16400 in fp16 would overflow to inf), others stay."""
    return torch.float32 if dtype == torch.float16 else dtype


class RHT:
    """A random Hadamard transform of `size` (16, 32, 64, 128) with signs drawn from `seed`.

    The sign vector is a pure function of (size, seed): every rank builds the same one.
    `get_rht(size, seed)` returns a cached one (construction costs ~20 us of host time).
    """

    def __init__(self, size: int = 16, seed: int = 0):
        if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size not in SIZES:
            raise ValueError(f"RHT size must be one of {SIZES}, got {size!r}")
        seed = check_seed(seed, "RHT seed")
        self.size = int(size)
        self.seed = seed
        gen = torch.Generator().manual_seed(seed)
        self.signs = torch.randint(0, 2, (size,), generator=gen).to(torch.float32) * 2 - 1
        self.norm = float(torch.tensor(1.0 / math.sqrt(size), dtype=torch.float32))
        # x / n before the butterfly and norm * n after it (both exact): see the module doc
        self.prescale = 1.0 / size
        self.postscale = float(torch.tensor(self.norm, dtype=torch.float32) * size)

    def __repr__(self) -> str:
        return f"RHT(size={self.size}, seed={self.seed})"

    def __eq__(self, other) -> bool:
        return isinstance(other, RHT) and (other.size, other.seed) == (self.size, self.seed)

    def __hash__(self) -> int:
        return hash((self.size, self.seed))

    def matrix(self, dtype=torch.float64) -> torch.Tensor:
        """The dense orthonormal matrix D H / sqrt(n) (for tests and analysis)."""
        h = torch.ones(1, 1, dtype=dtype)
        while h.shape[0] < self.size:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        return self.signs.to(dtype)[:, None] * h / math.sqrt(self.size)

    def rotate(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """x . D H / sqrt(n) on each block of `size` along `dim`, computed in fp32; returned
        in x's dtype, except float16 -> float32 (`rotated_dtype`: rotated fp16 overflows)."""
        return self._apply(x, dim, inverse=False)

    def inverse(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Undo rotate: x . H D / sqrt(n) (H is symmetric); dtype as rotate."""
        return self._apply(x, dim, inverse=True)

    def rotate_fp32_lastdim(self, x: torch.Tensor) -> torch.Tensor:
        """The exact fp32 rotation along the last dim (size a multiple of self.size)."""
        signs = self.signs.to(x.device)
        y = x.to(torch.float32).unflatten(-1, (-1, self.size)) * signs
        return (_butterfly(y * self.prescale) * self.postscale).flatten(-2)

    def _apply(self, x: torch.Tensor, dim: int, inverse: bool) -> torch.Tensor:
        check_float_tensor(x, "x", "RHT.rotate/inverse")
        dim = check_dim(dim, x.dim())
        n = x.shape[dim]
        if n % self.size:
            raise ValueError(
                f"RHT{self.size} needs the size along dim {dim} to be a multiple "
                f"of {self.size}, got {n}: pad the tensor or choose rht=None"
            )
        moved = x.movedim(dim, -1)
        if inverse:
            y = moved.to(torch.float32).unflatten(-1, (-1, self.size)) * self.prescale
            y = _butterfly(y) * self.postscale
            y = (y * self.signs.to(x.device)).flatten(-2)
        else:
            y = self.rotate_fp32_lastdim(moved)
        return y.to(rotated_dtype(x.dtype)).movedim(-1, dim)


def _butterfly(y: torch.Tensor) -> torch.Tensor:
    """Unnormalized Sylvester Hadamard along the last dim, fixed fp32 operation order."""
    n = y.shape[-1]
    h = 1
    while h < n:
        g = y.unflatten(-1, (n // (2 * h), 2, h))
        a, b = g[..., 0, :], g[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2).flatten(-3)
        h *= 2
    return y


@functools.lru_cache(maxsize=64, typed=True)  # typed: seed 1.0 must not hit seed 1
def get_rht(size: int, seed: int) -> RHT:
    """The RHT of (size, seed), built once: it is a pure function of them."""
    return RHT(size, seed)


def as_rht(rht, seed: int = 0) -> RHT | None:
    """None, a size, or an RHT -> RHT | None."""
    if rht is None or rht is False:
        return None
    if isinstance(rht, RHT):
        return rht
    if rht is True:
        return get_rht(16, seed)
    if isinstance(rht, bool) or not isinstance(rht, int) or rht not in SIZES:
        raise ValueError(f"rht must be None, a size in {SIZES} or an RHT, got {rht!r}")
    return get_rht(rht, seed)

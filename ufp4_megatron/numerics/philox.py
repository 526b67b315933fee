"""Philox4x32-10 counter-based random bits, in plain PyTorch.

Counter-based: the bits of an element depend only on (seed, its position), never on how the
tensor is tiled or split across ranks, so a Triton kernel (`tl.philox`, same rounds and
constants) and this reference produce the same bits. uint32 arithmetic is emulated in int64:
a 32x32-bit product fits in 64 bits modulo 2^64, so its bit pattern is exact.
"""

from __future__ import annotations

import numpy as np
import torch

_MASK32 = 0xFFFFFFFF
_M0, _M1 = 0xD2511F53, 0xCD9E8D57  # round multipliers (Random123)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85  # key bumps (Weyl sequence)


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    prod = b * a  # int64, wraps modulo 2^64: bit pattern of the full 64-bit product
    return (prod >> 32) & _MASK32, prod & _MASK32


def philox4x32(c0, c1, c2, c3, seed: int, rounds: int = 10):
    """Four uint32 words (as int64 tensors) for counters (c0, c1, c2, c3) and a 64-bit seed.

    key = (seed & 0xffffffff, seed >> 32), as in Triton's `tl.philox`.
    """
    if not 0 <= seed < 2**63:
        raise ValueError(f"seed must be in [0, 2^63) (a kernel argument is int64), got {seed}")
    return philox_rounds(c0, c1, c2, c3, seed & _MASK32, (seed >> 32) & _MASK32, rounds)


def philox_rounds(c0, c1, c2, c3, k0: int, k1: int, rounds: int = 10):
    """Philox4x32 on counters (c0..c3) with key words (k0, k1) (Random123's definition)."""
    # python ints join the tensors' device: CPU 0-dim counters broadcast against CUDA ones
    # would otherwise leave CPU tensors in the rounds (a device mismatch on GPU).
    dev = next((c.device for c in (c0, c1, c2, c3) if isinstance(c, torch.Tensor)), None)
    c0, c1, c2, c3 = (
        torch.as_tensor(c, device=dev).to(torch.int64) & _MASK32 for c in (c0, c1, c2, c3)
    )
    c0, c1, c2, c3 = torch.broadcast_tensors(c0, c1, c2, c3)
    for _ in range(rounds):
        hi0, lo0 = _mulhilo(_M0, c0)
        hi1, lo1 = _mulhilo(_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + _W0) & _MASK32, (k1 + _W1) & _MASK32
    return c0, c1, c2, c3


def position_bits(
    rows: int, cols: int, seed: int, origin: tuple[int, int] = (0, 0), device=None
) -> torch.Tensor:
    """uint32 bits (int64 tensor [rows, cols]) for the elements of a 2D view.

    Element (r, c) at global position (R, C) = (r + origin[0], c + origin[1]) uses counter
    (C >> 2, R, 0, 0) and takes output word C & 3: one Philox call serves four neighbours.
    """
    r0, c0 = origin
    if c0 % 4:
        raise ValueError(f"column origin must be a multiple of 4, got {c0}")
    R = torch.arange(r0, r0 + rows, device=device, dtype=torch.int64)[:, None]
    groups = (cols + 3) // 4
    G = torch.arange(c0 // 4, c0 // 4 + groups, device=device, dtype=torch.int64)[None, :]
    words = torch.stack(philox4x32(G, R, 0, 0, seed), dim=-1)  # [rows, groups, 4]
    return words.reshape(rows, groups * 4)[:, :cols]


def uniform24(bits: torch.Tensor) -> torch.Tensor:
    """Uniform float32 in [0, 1) from the top 24 bits: exact, so kernels agree bit for bit."""
    return (bits >> 8).to(torch.float32) * (2.0**-24)


def mix_seed(seed: int, *salt: int) -> int:
    """A 63-bit seed derived from `seed` and integer salts (splitmix64), e.g. per GEMM/operand."""
    z = seed & 0xFFFFFFFFFFFFFFFF
    for s in salt:
        z = (z + 0x9E3779B97F4A7C15 + (s & 0xFFFFFFFFFFFFFFFF)) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        z ^= z >> 31
    return z >> 1


def mix_seeds(seeds, *salt) -> list[int]:
    """[mix_seed(s, *salt) for s in seeds] in a few vector ops (numpy uint64 arithmetic wraps
    modulo 2^64, as the reference's masks do). Seeds and salts are ints in [0, 2^64) (a salt:
    one int, or one per seed). Grouped experts derive a seed per expert and call with it: one
    Python mix per expert would cost a layer ~1 us per expert and operand of host time."""
    z = np.asarray(seeds, dtype=np.uint64)
    for s in salt:
        z = z + np.uint64(0x9E3779B97F4A7C15) + np.asarray(s, dtype=np.uint64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(1)).tolist()


# ----------------------------------------------------------------------------- SR key tables
# One quantized linear call keys its stochastic rounding with one call seed; each GEMM operand
# then takes mix_seed(call seed, gemm, operand) (gemm: 0 fprop, 1 dgrad, 2 wgrad; operand: its
# index in the GEMM, recipe.OPERANDS order), and expert e of a grouped call
# mix_seed(mix_seed(call seed, e), gemm, operand). A key table holds all six of a call,
# row 2 gemm + operand, one column per expert (one column for a plain linear): what a kernel
# reads from device memory when the seed is not a host integer (kernels/keys_triton.py
# computes the same table on the device, from a draw counter kept there).
KEY_ROWS = 6


def key_row(gemm: int, operand: int) -> int:
    """The row of GEMM `gemm`'s operand `operand` in a key table."""
    return 2 * gemm + operand


def operand_keys(call_seed: int, experts=None) -> list[list[int]]:
    """The key table [KEY_ROWS][E] of a call: E = 1 column without experts, else one per
    global expert index in `experts`."""
    if experts is None:
        return [[mix_seed(call_seed, g, o)] for g in range(3) for o in range(2)]
    per_expert = mix_seeds([call_seed] * len(experts), list(experts))
    return [mix_seeds(per_expert, g, o) for g in range(3) for o in range(2)]


def stream_seed(run_seed: int, draw: int, *salt: int) -> int:
    """The call seed of draw number `draw` (0, 1, ...) of a run's SR stream, salted with
    the caller's identity (megatron/seeds.py: layer, role, expert, data-parallel rank).
    Counter-based: any draw is computable from (run_seed, draw) alone, on the host or in a
    kernel, so a device-side counter can advance it inside a replayed CUDA graph."""
    return mix_seed(run_seed, draw, *salt)

"""Triton twin of numerics/philox.py: the uniforms that stochastic rounding compares against.

`philox4x32_10` is the reference's `philox4x32` (Philox4x32-10, key = (seed & 0xffffffff,
seed >> 32)), and so `tl.philox`'s words, with each round's products taken from one widening
multiply (one IMAD.WIDE where tl.philox issues a high and a low half). Element (r, c) of a
view takes word c & 3 of counter (c >> 2, r, 0, 0) (`position_bits`), so one call serves
four neighbouring columns; each word becomes u = (bits >> 8) * 2^-24 (`uniform24`), exact in
fp32, so kernels and reference agree bit for bit. Two layouts of the same uniforms: four
tensors (the 16-tensor kernels hold a block's elements in separate tensors) or one
[rows, cols] tile (the generic kernel).
"""

import triton
import triton.language as tl

# 2^-24: one unit of the top 24 bits of a word, so u = (bits >> 8) * 2^-24 is in [0, 1)
UNIFORM24_ULP = tl.constexpr(2.0**-24)


@triton.jit
def uniform24(bits):
    return (bits >> 8).to(tl.float32) * UNIFORM24_ULP


# Philox4x32's round constants (Random123; tl.philox's for 32-bit counters)
_ROUND_A = tl.constexpr(0xD2511F53)
_ROUND_B = tl.constexpr(0xCD9E8D57)
_KEY_A = tl.constexpr(0x9E3779B9)
_KEY_B = tl.constexpr(0xBB67AE85)


@triton.jit
def _mulhilo(m: tl.constexpr, x):
    """(hi, lo) words of the 64-bit product m * x, from one widening multiply."""
    p = x.to(tl.uint64) * m
    return (p >> 32).to(tl.uint32), p.to(tl.uint32)


@triton.jit
def philox4x32_10(seed, c0, c1, c2, c3):
    """tl.philox(seed, c0, c1, c2, c3) for uint32 counters, each round's products taken whole."""
    # the zero makes a tensor of a constexpr seed: Triton specializes an argument equal to 1
    seed = seed + tl.zeros((), tl.uint64)
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    for _ in tl.static_range(10):
        hi_a, lo_a = _mulhilo(_ROUND_A, c0)
        hi_b, lo_b = _mulhilo(_ROUND_B, c2)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = k0 + _KEY_A
        k1 = k1 + _KEY_B
    return c0, c1, c2, c3


@triton.jit
def uniforms4(seed, c0, c1):
    """The four uniforms of counter (c0, c1, 0, 0): those of view columns 4 c0 .. 4 c0 + 3 in
    view row c1 (int tensors; the zero words take c0's shape)."""
    z = tl.zeros(c0.shape, tl.uint32)
    w0, w1, w2, w3 = philox4x32_10(seed, c0.to(tl.uint32), c1.to(tl.uint32), z, z)
    return uniform24(w0), uniform24(w1), uniform24(w2), uniform24(w3)


@triton.jit
def tile_uniforms(seed, r, c4, BR: tl.constexpr, BC: tl.constexpr):
    """The uniforms of a [BR, BC] tile. r: [BR, 1] global view rows; c4: [1, BC // 4] global
    view columns over 4 (one counter per 4 columns: its words fill columns 4 c4 .. 4 c4 + 3)."""
    u0, u1, u2, u3 = uniforms4(
        seed, tl.broadcast_to(c4, (BR, BC // 4)), tl.broadcast_to(r, (BR, BC // 4))
    )
    return tl.reshape(tl.join(tl.join(u0, u2), tl.join(u1, u3)), (BR, BC))

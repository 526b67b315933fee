"""Triton twin of numerics/philox.py: the uniforms that stochastic rounding compares against.

`tl.philox` is the reference's `philox4x32` (Philox4x32-10, key = (seed & 0xffffffff,
seed >> 32)). Element (r, c) of a view takes word c & 3 of counter (c >> 2, r, 0, 0)
(`position_bits`), so one call serves four neighbouring columns; each word becomes
u = (bits >> 8) * 2^-24 (`uniform24`), exact in fp32, so kernels and reference agree bit for
bit. Two layouts of the same uniforms: four tensors (the 16-tensor kernels hold a block's
elements in separate tensors) or one [rows, cols] tile (the generic kernel).
"""

import triton
import triton.language as tl

# 2^-24: one unit of the top 24 bits of a word, so u = (bits >> 8) * 2^-24 is in [0, 1)
UNIFORM24_ULP = tl.constexpr(2.0**-24)


@triton.jit
def uniform24(bits):
    return (bits >> 8).to(tl.float32) * UNIFORM24_ULP


@triton.jit
def uniforms4(seed, c0, c1):
    """The four uniforms of counter (c0, c1, 0, 0): those of view columns 4 c0 .. 4 c0 + 3 in
    view row c1 (int tensors; the zero words take c0's shape)."""
    z = tl.zeros(c0.shape, tl.uint32)
    w0, w1, w2, w3 = tl.philox(seed, c0.to(tl.uint32), c1.to(tl.uint32), z, z)
    return uniform24(w0), uniform24(w1), uniform24(w2), uniform24(w3)


@triton.jit
def tile_uniforms(seed, r, c4, BR: tl.constexpr, BC: tl.constexpr):
    """The uniforms of a [BR, BC] tile. r: [BR, 1] global view rows; c4: [1, BC // 4] global
    view columns over 4 (one counter per 4 columns: its words fill columns 4 c4 .. 4 c4 + 3)."""
    u0, u1, u2, u3 = uniforms4(
        seed, tl.broadcast_to(c4, (BR, BC // 4)), tl.broadcast_to(r, (BR, BC // 4))
    )
    return tl.reshape(tl.join(tl.join(u0, u2), tl.join(u1, u3)), (BR, BC))

"""Triton twin of numerics/hadamard.py: the RHT butterfly on a register tile.

Same fp32 operations in the same order as `RHT.rotate_fp32_lastdim`: signs (exact), a
multiply by 1/H (exact except on subnormal inputs, where it rounds as the reference's does:
the kernels compile without fusing it into the first add, kernels/launch.py OPTIONS), then
for h = 1, 2, 4, ..., H/2 the pairs (i, i+h) of each aligned group of 2h become
(a + b, a - b), then one multiply by norm * H = fp32(sqrt(H)) (the scaling that keeps every
sum within the input's range: numerics/hadamard.py). Each step is one IEEE operation per
element, so the result is bit-identical to the reference. Two layouts of the same butterfly:
`rht_rows` on a [rows, cols] tile (groups of H along axis 1), `rht16` on a block held as 16
same-shaped tensors (element j of every block in the j-th; quantize16_triton.py), where
every stage is elementwise.
"""

import triton
import triton.language as tl


@triton.jit
def _stage(x, BR: tl.constexpr, BC: tl.constexpr, h: tl.constexpr):
    """One butterfly stage along axis 1: (x[i], x[i+h]) -> (a + b, a - b) in groups of 2h."""
    y = tl.permute(tl.reshape(x, (BR, BC // (2 * h), 2, h)), (0, 1, 3, 2))
    a, b = tl.split(y)
    y = tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2))
    return tl.reshape(y, (BR, BC))


@triton.jit
def rht_rows(x, signs, norm, BR: tl.constexpr, BC: tl.constexpr, LOG_H: tl.constexpr):
    """x [BR, BC] fp32, groups of H = 2^LOG_H along axis 1 (aligned); signs [1, BC] of +-1;
    norm: fp32(1/sqrt(H))."""
    x = x * signs * (1.0 / (1 << LOG_H))
    for i in tl.static_range(LOG_H):
        x = _stage(x, BR, BC, 1 << i)
    return x * (norm * (1 << LOG_H))


@triton.jit
def _stage16(xs, h: tl.constexpr):
    """One butterfly stage over a 16-tuple: pairs (j, j + h) -> (a + b, a - b)."""
    out = ()
    for j in tl.static_range(16):
        if (j // h) % 2 == 0:
            out = out + (xs[j] + xs[j + h],)
        else:
            out = out + (xs[j - h] - xs[j],)
    return out


@triton.jit
def rht16(xs, SIGNS: tl.constexpr, norm):
    """RHT16 of blocks held as a 16-tuple of fp32 tensors; SIGNS: the sign vector as a mask
    (bit j set: sign j is -1; dispatch.rht16_constexpr), so each sign and the 1/H fold into
    one multiply by the constant +-1/16: (x * s) * (1/16) is x * (s/16) bit for bit, since
    x * s is exact and rounding is symmetric. Loaded signs took a load and a multiply more
    per element. norm: fp32(1/4)."""
    sx = ()
    for j in tl.static_range(16):
        if (SIGNS >> j) & 1:
            sx = sx + (xs[j] * -0.0625,)
        else:
            sx = sx + (xs[j] * 0.0625,)
    for i in tl.static_range(4):
        sx = _stage16(sx, 1 << i)
    post = norm * 16.0
    out = ()
    for j in tl.static_range(16):
        out = out + (sx[j] * post,)
    return out

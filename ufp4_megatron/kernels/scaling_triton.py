"""Triton twin of numerics/scaling.py: block amax and block scales on a register tile.

A tile is [BR, BC] fp32 with blocks of B along axis 1 (or B x B tiles), aligned to the
tile. Scale arithmetic follows the reference op for op; divisions are `div_rn` (correctly
rounded), as torch's are. Per-block results have shape [BR, BC // B]. `block_amax16` is the
same reduction for a block held as 16 same-shaped tensors (quantize16_triton.py).
"""

import triton
import triton.language as tl

SCALE_FP32: tl.constexpr = 0
SCALE_E4M3: tl.constexpr = 1
SCALE_E8M0: tl.constexpr = 2


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _tile_reduce(
    t,
    BR: tl.constexpr,
    BC: tl.constexpr,
    B: tl.constexpr,
    BLOCK_2D: tl.constexpr,
    IS_MAX: tl.constexpr,
):
    """max (IS_MAX, NaN-propagating) or min of each block, [BR, BC // B]. A 2D block spans
    all BR == B rows of its tile (dispatch.py sizes the tile so), so its value repeats over
    them: reduced along axis 0 and broadcast back. The earlier 4D reshape and reshape of a
    broadcast gave the whole tile layouts replicated in every thread (2048 values each in the
    column layout): the same result, but 18 s to over 13 minutes to compile per kernel."""
    t3 = tl.reshape(t, (BR, BC // B, B))
    if IS_MAX:
        m = tl.reduce(t3, 2, _max_nan)
    else:
        m = tl.min(t3, axis=2)
    if BLOCK_2D:
        tl.static_assert(BR == B, "a 2D-block tile spans one block of rows")
        if IS_MAX:
            m = tl.reduce(m, 0, _max_nan, keep_dims=True)
        else:
            m = tl.min(m, axis=0, keep_dims=True)
        m = tl.broadcast_to(m, (BR, BC // B))
    return m


@triton.jit
def block_amax(x, BR: tl.constexpr, BC: tl.constexpr, B: tl.constexpr, BLOCK_2D: tl.constexpr):
    """amax of |x| per block; NaN if the block holds a NaN (as the reference's _nan_max)."""
    return _tile_reduce(tl.abs(x), BR, BC, B, BLOCK_2D, True)


@triton.jit
def block_negative_extreme(
    x, BR: tl.constexpr, BC: tl.constexpr, B: tl.constexpr, BLOCK_2D: tl.constexpr
):
    """True where the block's largest-magnitude element is negative (ties: negative)."""
    mx = _tile_reduce(x, BR, BC, B, BLOCK_2D, True)
    mn = _tile_reduce(x, BR, BC, B, BLOCK_2D, False)
    return -mn >= mx


@triton.jit
def block_amax16(xs, ASYM: tl.constexpr, N: tl.constexpr = 16):
    """(amax, negative-led) of blocks held as an N-tuple (16, or 32: two groups of 16): amax
    NaN-propagating as in block_amax; negative-led as block_negative_extreme, meaningful only
    with ASYM (the max/min it compares are taken only then)."""
    amax = tl.abs(xs[0])
    mx = xs[0]
    mn = xs[0]
    for j in tl.static_range(1, N):
        amax = tl.maximum(amax, tl.abs(xs[j]), propagate_nan=tl.PropagateNan.ALL)
        if ASYM:
            mx = tl.maximum(mx, xs[j])
            mn = tl.minimum(mn, xs[j])
    return amax, -mn >= mx


@triton.jit
def e4m3_rtne(v):
    """Non-negative fp32 -> nearest E4M3 value (ties to even), saturating at 448; NaN stays."""
    c = tl.minimum(v, 448.0)
    # subnormal range (< 2^-6, step 2^-9): adding 2^14 leaves an ulp of 2^-9, so the IEEE
    # add rounds to that step, ties to even; the subtraction is exact.
    sub = (c + 16384.0) - 16384.0
    # normal range: round the fp32 mantissa to 3 bits, ties to even, on the bit pattern.
    bits = c.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576
    nrm = bits.to(tl.float32, bitcast=True)
    out = tl.where(c < 0.015625, sub, nrm)
    return tl.where(v != v, v, out)


@triton.jit
def _floor_log2(a):
    """floor(log2(a)) for finite a > 0 (subnormals included), as int32."""
    tiny = a < 1.1754943508222875e-38
    a2 = tl.where(tiny, a * 18446744073709551616.0, a)  # * 2^64: exact, makes it normal
    e = ((a2.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    return tl.where(tiny, e - 64, e)


@triton.jit
def block_scale(amax, g_max, s_t, SCALE: tl.constexpr):
    """Dequantization scale per block (fp32), non-finite for a non-finite amax in every mode.
    g_max: per block or scalar; s_t: the e4m3 tensor-level scale (ignored otherwise)."""
    if SCALE == 0:
        return tl.math.div_rn(amax, g_max + tl.zeros_like(amax))
    elif SCALE == 1:
        ratio = tl.math.div_rn(
            tl.math.div_rn(amax, g_max + tl.zeros_like(amax)), s_t + tl.zeros_like(amax)
        )
        ratio = tl.where(s_t > 0, ratio, 0.0)
        # an Inf amax saturates at 448 in e4m3_rtne: keep its scale non-finite (NaN block)
        return tl.where(tl.abs(amax) < float("inf"), e4m3_rtne(ratio) * s_t, amax)
    else:
        finite = tl.abs(amax) < float("inf")
        safe = tl.where(finite & (amax > 0), amax, 1.0)
        e = _floor_log2(safe) - _floor_log2(g_max + tl.zeros_like(amax))
        e = tl.minimum(tl.maximum(e, -127), 127)
        # 2^e: a normal exponent field, or 2^-127 (the only subnormal reachable)
        s = tl.where(
            e >= -126,
            ((e + 127) << 23).to(tl.float32, bitcast=True),
            tl.full(e.shape, 0x00400000, tl.int32).to(tl.float32, bitcast=True),
        )
        s = tl.where(amax > 0, s, 0.0)
        return tl.where(finite, s, amax)


@triton.jit
def expand(s, BR: tl.constexpr, BC: tl.constexpr, B: tl.constexpr):
    """Per-block [BR, BC // B] -> per-element [BR, BC]."""
    s3 = tl.broadcast_to(tl.reshape(s, (BR, BC // B, 1)), (BR, BC // B, B))
    return tl.reshape(s3, (BR, BC))

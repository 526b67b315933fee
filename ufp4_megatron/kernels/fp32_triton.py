"""fp32 arithmetic the QDQ kernels share: the tile load, the division |x| / s, the output cast.

The reference divides with torch's correctly rounded `/`. `div_exact` is that division on a
GPU (`div_rn`, a slow multi-instruction sequence); `div_fast` reaches the same result from one
exact reciprocal per block and a few fma's, but is proven only where no intermediate
underflows, so a kernel that takes it checks `fast_div_unsafe_*` and redoes the program's tile
with `div_exact` when any element falls outside (docs/kernel-notes.md). The CPU interpreter
emulates fma with two roundings: there the kernels always take `div_exact` (dispatch.py).
"""

import triton
import triton.language as tl

# div_fast is proven where no intermediate underflows: block scales in [2^-60, 2^60] keep
# 1 / s and the products of a block's quotients far from fp32's subnormal range; a tile
# holding a scale outside takes div_exact.
FAST_DIV_MIN_SCALE = tl.constexpr(2.0**-60)
FAST_DIV_MAX_SCALE = tl.constexpr(2.0**60)
# A quotient below 2^-100 may come out of div_fast off by an ulp. RTNE never looks at one
# (far below the first midpoint of any grid whose first level is >= 2^-30; smaller grids take
# div_exact throughout), but SR does: whether v > 0 decides a possible round-up.
FAST_DIV_MIN_QUOTIENT = tl.constexpr(2.0**-100)


@triton.jit
def div_exact(a, s):
    """RN(a / s) where s > 0, else 0 (the reference's masked division; s is a block scale)."""
    return tl.where(s > 0, tl.math.div_rn(a, tl.where(s > 0, s, 1.0)), 0.0)


@triton.jit
def reciprocal(s):
    """RN(1 / s) where s > 0, else 0: div_fast then gives 0 for s == 0 and NaN for a NaN s."""
    return tl.where(
        s > 0, tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), tl.where(s > 0, s, 1.0)), 0.0
    )


@triton.jit
def div_fast(a, b, y):
    """RN(a / b) given y = RN(1 / b): q = a * y is within an ulp, the residual a - b q is
    exact (fma), and q + r y rounds to RN(a / b) (Markstein's theorem) when no intermediate
    underflows; the second correction is idempotent and only adds margin."""
    q = a * y
    r = tl.fma(-b, q, a)
    q = tl.fma(r, y, q)
    r = tl.fma(-b, q, a)
    return tl.fma(r, y, q)


@triton.jit
def fast_div_unsafe_scale(s):
    """True for a positive block scale outside div_fast's proven range."""
    return (s > 0) & ((s < FAST_DIV_MIN_SCALE) | (s > FAST_DIV_MAX_SCALE))


@triton.jit
def fast_div_unsafe_quotient(a, v):
    """True for a nonzero |x| whose div_fast quotient v is too small to trust (SR only)."""
    return (a > 0) & (v < FAST_DIV_MIN_QUOTIENT)


@triton.jit
def cast_out(y, ptr, INTERP: tl.constexpr):
    """fp32 -> the element type of ptr, RTNE. The CPU interpreter truncates fp32 -> bf16, so
    there bf16 is rounded on the bit pattern first (ties to even on the 16 dropped bits) and
    the cast after it is exact."""
    if INTERP and ptr.dtype.element_ty == tl.bfloat16:
        bits = y.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        y = tl.where(y != y, y, bits.to(tl.float32, bitcast=True))
    return y.to(ptr.dtype.element_ty)


@triton.jit
def load_tile(x_ptr, stride_a, A, B, BA: tl.constexpr, BB: tl.constexpr):
    """This program's BA x BB tile of a row-major [A, B] tensor, in fp32, padding as zeros;
    with its first row a0, first column b0 and the [BA, 1], [1, BB] index grids a, b (the
    generic tile kernels: quantize_triton, amax_triton)."""
    a0 = tl.program_id(0) * BA
    b0 = tl.program_id(1) * BB
    a = a0 + tl.arange(0, BA)[:, None]
    b = b0 + tl.arange(0, BB)[None, :]
    x = tl.load(x_ptr + a.to(tl.int64) * stride_a + b, mask=(a < A) & (b < B), other=0.0)
    return x.to(tl.float32), a0, b0, a, b


@triton.jit
def load_groups16(x_ptr, stride_a, A, B, g, b):
    """Rows 16 g + j of a row-major [A, B] tensor at columns b ([BG, 1] and [1, BB] index
    grids) as a 16-tuple of fp32 tensors, element j of every 16-row column block in the j-th,
    padding as zeros: the tile of the col16 kernels (quantize16_triton, amax_triton)."""
    a = g * 16  # the first row's pointers once, then a stride per row: no 64-bit multiply per
    p = x_ptr + a.to(tl.int64) * stride_a + b  # row and value (sm_90: 6-15% fewer instructions)
    in_b = b < B
    xs = ()
    for j in tl.static_range(16):
        x = tl.load(p, mask=(a + j < A) & in_b, other=0.0)
        xs = xs + (x.to(tl.float32),)
        p += stride_a
    return xs

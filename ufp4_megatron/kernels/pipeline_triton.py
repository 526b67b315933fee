"""The QDQ pipeline of numerics/quantize.py, as both kernel families run it.

  step          numerics/       kernels/ (tile form | 16-tensor form)
  RHT           hadamard.py     hadamard_triton.rht_rows | rht16
  block amax    scaling.py      scaling_triton.block_amax (+ block_negative_extreme) | block_amax16
  scale         scaling.py      block_scales (here, on scaling_triton.block_scale)
  |x| / s       quantize.py     fp32_triton: div_fast with its guard, or div_exact
  SR uniforms   philox.py       philox_triton.tile_uniforms | uniforms4
  clip, round,  rounding.py,    clip_round_dequantize (here, on rounding_triton.round_to_grid)
  dequantize    quantize.py
The steps from the scale on are elementwise on same-shaped fp32 tensors: the tile kernel
(quantize_triton.py) applies each once to a [rows, cols] tile, per-block values expanded to
their elements; the 16-tensor kernels (quantize16_triton.py) apply each to the 16 tensors of
a block. Only the RHT, the amax and where the uniforms come from depend on the layout.
"""

import triton
import triton.language as tl

from .rounding_triton import round_to_grid
from .scaling_triton import block_scale

E4M3_MAX = tl.constexpr(448.0)  # numerics.scaling.E4M3_MAX: e4m3's largest finite value


@triton.jit
def block_scales(amax, g, gmax, st_ptr, SCALE: tl.constexpr):
    """Per block: the dequantization scale for grid top g (per block or scalar), NaN for a
    block whose scale is not finite (a NaN or Inf element: the whole block comes out NaN).
    st_ptr: the e4m3 tensor amax (read for SCALE == 1 only): one pointer, or one per block
    (broadcastable to amax) where segments carry their own. The tensor-level scale is that
    amax over 448 gmax, divided here as the reference divides it (RN, the divisor's fp32
    product), so no launch of its own precedes each quantization."""
    s_t = 0.0
    if SCALE == 1:
        t_amax = tl.load(st_ptr)
        s_t = tl.math.div_rn(t_amax, E4M3_MAX * gmax + tl.zeros_like(t_amax))
    s = block_scale(amax, g, s_t, SCALE)
    return tl.where(tl.abs(s) < float("inf"), s, float("nan"))


@triton.jit
def clip_round_dequantize(
    x,
    v,
    u,
    s,
    lv_ptr,
    mid_ptr,
    gmax,
    gneg,
    SR: tl.constexpr,
    NLEV: tl.constexpr,
    ASYM: tl.constexpr,
    D: tl.constexpr,
    INV_D: tl.constexpr,
    FP_M: tl.constexpr,
):
    """x's dequantized value from v = |x| / s: clipped to its sign's top level (two's
    complement, ASYM: gneg for negatives), rounded (SR against u), scaled back by s, signed."""
    neg = x < 0
    if ASYM:
        v = tl.minimum(v, tl.where(neg, gneg, gmax))
    else:
        v = tl.minimum(v, gmax)
    mag = round_to_grid(v, u, lv_ptr, mid_ptr, SR, NLEV, D, INV_D, FP_M) * s
    return tl.where(neg, -mag, mag)

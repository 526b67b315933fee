"""Block layout and block scales.

A 2D view [R, C] is quantized along C in 1 x B blocks (or B x B tiles for weights). The
scale s of a block maps its amax onto the grid's largest magnitude g_max:

  fp32  s = amax / g_max                                   (the paper: one FP32 per block)
  e4m3  s = e4m3(amax / g_max / s_t) * s_t,  s_t = amax_tensor / (448 g_max)   (NVFP4)
  e8m0  s = 2^(floor(log2 amax) - floor(log2 g_max))                          (OCP MX)

A block whose amax is not finite (NaN or Inf in it) gets a non-finite scale in every mode, and
dequantizes to NaN. amax_tensor is the largest *finite* block amax (`finite_tensor_amax`), so such a
block stays in itself: one NaN does not make every block of an e4m3 tensor NaN (or zero).
"""

from __future__ import annotations

import math

import torch

SCALE_MODES = ("fp32", "e4m3", "e8m0")
E4M3_MAX = 448.0


def block_amax(x: torch.Tensor, block: int, block_2d: bool) -> torch.Tensor:
    """amax of each block of a padded [R, C] fp32 view -> [R, C // B] (tiles repeat per row).

    NaN propagates (amax of a block holding NaN is NaN).
    """
    R, C = x.shape
    a = x.abs()
    if not block_2d:
        return _nan_max(a.view(R, C // block, block), dim=-1)
    tiles = _nan_max(_nan_max(a.view(R // block, block, C // block, block), dim=3), dim=1)
    return tiles.repeat_interleave(block, dim=0)


def _nan_max(t: torch.Tensor, dim: int) -> torch.Tensor:
    m = t.amax(dim=dim)
    return torch.where(torch.isnan(t).any(dim=dim), torch.full_like(m, float("nan")), m)


def finite_tensor_amax(amax: torch.Tensor) -> torch.Tensor:
    """The e4m3 per-tensor amax: the largest finite block amax (0 when there is none)."""
    if not amax.numel():
        return amax.new_zeros(())
    return torch.where(torch.isfinite(amax), amax, torch.zeros_like(amax)).amax()


def block_scale(
    amax: torch.Tensor,
    g_max: torch.Tensor | float,
    mode: str,
    tensor_amax: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-block dequantization scale s (fp32). g_max may vary per block (int4_asym)."""
    g_max = torch.as_tensor(g_max, dtype=torch.float32, device=amax.device)
    if mode == "fp32":
        return amax / g_max
    if mode == "e4m3":
        if tensor_amax is None:
            tensor_amax = finite_tensor_amax(amax)
        g_top = g_max.max() if g_max.dim() else g_max
        s_t = tensor_amax.to(torch.float32) / (E4M3_MAX * g_top)
        ratio = torch.where(s_t > 0, amax / g_max / s_t, torch.zeros_like(amax))
        s_b = e4m3_rtne(ratio)  # an Inf amax saturates at 448 here: keep it non-finite
        return torch.where(torch.isfinite(amax), s_b * s_t, amax)
    if mode == "e8m0":
        _, e = torch.frexp(amax)  # amax = m 2^e, m in [0.5, 1): floor(log2 amax) = e - 1
        emax = torch.floor(torch.log2(g_max)).to(torch.int32)
        exp = (e - 1 - emax).clamp(-127, 127)
        s = torch.ldexp(torch.ones_like(amax), exp)
        s = torch.where(amax > 0, s, torch.zeros_like(amax))
        return torch.where(torch.isfinite(amax), s, amax)
    raise ValueError(f"unknown scale mode {mode!r}; valid: {', '.join(SCALE_MODES)}")


def e4m3_rtne(v: torch.Tensor) -> torch.Tensor:
    """Round non-negative fp32 to the nearest E4M3 value (ties to even), saturating at 448."""
    clamped = torch.where(v > E4M3_MAX, torch.full_like(v, E4M3_MAX), v)
    return clamped.to(torch.float8_e4m3fn).to(torch.float32)


def lcm_length(*sizes: int) -> int:
    out = 1
    for s in sizes:
        out = out * s // math.gcd(out, s)
    return out

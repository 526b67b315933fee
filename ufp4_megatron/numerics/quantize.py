"""Fake quantization (quantize -> dequantize) of a 2D view along its last dim: the spec.

`quantize_view` is the reference every kernel is tested against. Steps (docs/numerics.md):
pad -> optional RHT -> block amax -> scale -> |x| / s -> round onto the grid -> dequantize.
`OperandFormat` holds the arguments of a call that belong to the operand's format rather than
to the call (grid, block, scale, rounding, RHT, padding): the one value the recipe's operands,
the dispatch and the kernels' plan cache pass around and key on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from .grids import Grid, get_grid
from .hadamard import RHT, rotated_dtype
from .philox import position_bits, uniform24
from .rounding import round_rtne, round_stochastic
from .scaling import block_amax, block_scale, finite_tensor_amax, lcm_length
from .segments import Segments, segment_bits, segment_tensor_amax, tensor_scale_segments_problem


@dataclass
class QuantizedView:
    """Everything a quantization produced, on the padded [R, Cp] (fp32) layout."""

    values: torch.Tensor  # dequantized, fp32, padded
    codes: torch.Tensor  # signed level index (int64): -i for -l_i
    scales: torch.Tensor  # [R, Cp // B] fp32
    source: torch.Tensor  # the (rotated) fp32 input that was quantized, padded
    grid: Grid


@dataclass(frozen=True)
class OperandFormat:
    """How a view is quantized, apart from the call's own arguments (seed, origin, segments,
    tensor_amax, out_dtype): quantize_view's format keywords in one frozen, hashable value
    (hashable as long as grid is: a name, a Grid or a tuple of levels).

    The fields are quantize_view's keywords of the same names, unchecked here: the reference
    raises its own errors for values it does not take, and the kernels' plan
    (kernels/dispatch.py) names what they do not cover. keep_padding: the result keeps the
    zero padding along the quantized dim (a GEMM operand: zeros add nothing to the product).
    """

    grid: Any
    block: int = 16
    block_2d: bool = False
    scale: str = "fp32"
    rounding: str = "rtne"
    rht: RHT | None = None
    keep_padding: bool = False

    def options(self) -> dict:
        """quantize_view's keywords for this format, grid left out (its positional)."""
        return {f: getattr(self, f) for f in FORMAT_OPTIONS}

    def same_tiles(self, other: OperandFormat) -> bool:
        """Whether this format's blocks and `other`'s, each along its own view of one tensor
        (the tensor and its transpose), hold the same elements: square 2D tiles of one size,
        unrotated (a rotation mixes a tile's elements along one layout's rows only). Their
        e4m3 tensor amaxes are then the same value."""
        return (
            self.block_2d
            and other.block_2d
            and self.block == other.block
            and self.rht is None
            and other.rht is None
        )


FORMAT_OPTIONS = tuple(f.name for f in dataclasses.fields(OperandFormat) if f.name != "grid")


def format_of(grid, fmt: OperandFormat | None, kw: dict) -> tuple[OperandFormat, dict]:
    """(format, the call's own keywords) of a call given either `fmt` or, as quantize_view
    takes them, a grid and format keywords among kw. Both at once is a TypeError."""
    options = {k: kw[k] for k in FORMAT_OPTIONS if k in kw}
    if fmt is None:
        if grid is None:
            raise TypeError("give the grid (or fmt=OperandFormat(...))")
        call = {k: v for k, v in kw.items() if k not in options}
        return OperandFormat(grid, **options), call
    if grid is not None or options:
        raise TypeError(
            f"pass fmt=OperandFormat(...) or a grid with its keywords, not both (got fmt={fmt!r}"
            f", grid={grid!r}, {', '.join(options) or 'no keywords'})"
        )
    return fmt, kw


def padded_length(n: int, block: int, rht: RHT | None) -> int:
    unit = lcm_length(block, rht.size if rht is not None else 1)
    return -(-n // unit) * unit


def output_dtype(dtype: torch.dtype, rht: RHT | None, out_dtype: torch.dtype | None = None):
    """The dtype of the dequantized values: out_dtype if given, else the input's, except that
    rotated float16 is returned in float32 (a rotated block can exceed fp16's range)."""
    if out_dtype is not None:
        return out_dtype
    return rotated_dtype(dtype) if rht is not None else dtype


def source(x: torch.Tensor, *, block: int, block_2d: bool, rht: RHT | None) -> torch.Tensor:
    """x in fp32, zero-padded to whole blocks (rows too for 2D tiles), then rotated."""
    R, C = x.shape
    Cp = padded_length(C, block, rht)
    Rp = -(-R // block) * block if block_2d else R
    xf = x.to(torch.float32)
    if (Rp, Cp) != (R, C):
        xf = torch.nn.functional.pad(xf, (0, Cp - C, 0, Rp - R))
    if rht is not None:
        xf = rht.rotate_fp32_lastdim(xf)
    return xf


def e4m3_tensor_amax(
    x: torch.Tensor, *, block: int, block_2d: bool, rht: RHT | None
) -> torch.Tensor:
    """The per-tensor amax the e4m3 scale mode uses: the largest finite block amax of the
    padded, rotated source (kernels/amax_triton.py is its one-pass twin, tested bit for bit)."""
    return finite_tensor_amax(
        block_amax(source(x, block=block, block_2d=block_2d, rht=rht), block, block_2d)
    )


def quantize_view(
    x: torch.Tensor,
    grid,
    *,
    block: int = 16,
    block_2d: bool = False,
    scale: str = "fp32",
    rounding: str = "rtne",
    rht: RHT | None = None,
    seed: int = 0,
    origin: tuple[int, int] = (0, 0),
    tensor_amax: torch.Tensor | None = None,
    keep_padding: bool = False,
    out_dtype: torch.dtype | None = None,
    segments: Segments | None = None,
) -> torch.Tensor:
    """Dequantized [R, C] (or [R, Cp] with keep_padding), in `output_dtype(x.dtype, rht,
    out_dtype)`: out_dtype, else x.dtype (float32 for rotated float16). segments: row or
    column ranges quantized as tensors of their own (segments.py): SR keys per range instead
    of one seed for the whole view, and under e4m3 scales a tensor amax per range (unless
    tensor_amax is given)."""
    q = quantize_view_full(
        x,
        grid,
        block=block,
        block_2d=block_2d,
        scale=scale,
        rounding=rounding,
        rht=rht,
        seed=seed,
        origin=origin,
        tensor_amax=tensor_amax,
        segments=segments,
    )
    out = q.values if keep_padding else q.values[:, : x.shape[1]]
    return out.to(output_dtype(x.dtype, rht, out_dtype))


def quantize_view_full(
    x: torch.Tensor,
    grid,
    *,
    block: int = 16,
    block_2d: bool = False,
    scale: str = "fp32",
    rounding: str = "rtne",
    rht: RHT | None = None,
    seed: int = 0,
    origin: tuple[int, int] = (0, 0),
    tensor_amax: torch.Tensor | None = None,
    segments: Segments | None = None,
) -> QuantizedView:
    if x.dim() != 2:
        raise ValueError(f"quantize_view takes a 2D [rows, cols] view, got shape {tuple(x.shape)}")
    g = get_grid(grid)
    R = x.shape[0]
    xf = source(x, block=block, block_2d=block_2d, rht=rht)
    Rp, Cp = xf.shape

    amax = block_amax(xf, block, block_2d)  # [Rp, Cp // B]
    if scale == "e4m3" and segments is not None and tensor_amax is None:
        problem = tensor_scale_segments_problem(
            segments, block=block, block_2d=block_2d, rht_size=rht.size if rht is not None else None
        )
        if problem is not None:
            raise ValueError(f"cannot quantize {problem}")
        tensor_amax = segment_tensor_amax(amax, segments, block)
    levels = g.levels_tensor(x.device)
    if g.neg_extra is not None:  # two's complement: a negative amax element may reach -g_neg
        signed_max = _block_signed_extreme(xf, block, block_2d)
        g_scale = torch.where(signed_max < 0, g.neg_extra, g.g_max).to(torch.float32)
        levels = torch.cat([levels, levels.new_tensor([g.neg_extra])])
    else:
        g_scale = torch.tensor(g.g_max, dtype=torch.float32, device=x.device)
    s = block_scale(amax, g_scale, scale, tensor_amax)  # [Rp, Cp // B]

    s_el = s.repeat_interleave(block, dim=1)
    safe = s_el > 0
    v = torch.where(
        safe, xf.abs() / torch.where(safe, s_el, torch.ones_like(s_el)), torch.zeros_like(xf)
    )
    neg = xf < 0
    v_max = torch.full_like(v, g.g_max)
    if g.neg_extra is not None:
        v_max = torch.where(neg, g.neg_extra, v_max)
    v = torch.minimum(v, v_max)

    if rounding == "rtne":
        code = round_rtne(v, levels)
    elif rounding == "sr":
        bits = (
            position_bits(Rp, Cp, seed, origin, device=x.device)
            if segments is None
            else segment_bits(Rp, Cp, segments, origin, device=x.device)
        )
        code = round_stochastic(v, levels, uniform24(bits))
    else:
        raise ValueError(f"unknown rounding {rounding!r}; valid: rtne, sr")

    mag = levels[code] * s_el
    values = torch.where(neg, -mag, mag)
    finite = torch.isfinite(s_el)
    values = torch.where(finite, values, torch.full_like(values, float("nan")))
    codes = torch.where(neg, -code, code)
    q = QuantizedView(values=values, codes=codes, scales=s, source=xf, grid=g)
    if Rp != R:
        q.values, q.codes, q.scales, q.source = (
            q.values[:R],
            q.codes[:R],
            q.scales[:R],
            q.source[:R],
        )
    return q


def _block_signed_extreme(x: torch.Tensor, block: int, block_2d: bool) -> torch.Tensor:
    """The signed value of each block's largest-magnitude element (ties: the negative one)."""
    R, C = x.shape
    if block_2d:
        t = (
            x.view(R // block, block, C // block, block)
            .permute(0, 2, 1, 3)
            .reshape(R // block, C // block, block * block)
        )
        mx, mn = t.amax(-1), t.amin(-1)
        ext = torch.where(-mn >= mx, mn, mx)
        return ext.repeat_interleave(block, dim=0)
    t = x.view(R, C // block, block)
    mx, mn = t.amax(-1), t.amin(-1)
    return torch.where(-mn >= mx, mn, mx)

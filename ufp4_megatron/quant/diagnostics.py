"""Quantization diagnostics used by the paper, for tensors and whole layers.

attenuation  alpha = <Q(x), x> / ||x||^2: < 1 means the quantizer shrinks the signal; over K
             quantized GEMMs the signal scales by about prod(alpha_A alpha_B).
sqnr         10 log10(||x||^2 / ||Q(x) - x||^2), in dB.
delta_sqnr   SQNR with RHT minus SQNR without (positive: the rotation helps this grid).
shrinkage_bias  mean signed rounding error per level, in grid units (negative: shrinks).
bucket_ratio B_eff = exp(H) / K, H the entropy of the histogram of used magnitude levels,
             K the number of magnitude levels (1/K: one level used; 1: all used evenly).
effective_bits  entropy, in bits, of the signed codes actually used (at most log2 #codes).

`python -m ufp4_megatron.quant.diagnostics --table` prints alpha and SQNR for each grid with and
without RHT16 on Gaussian and Student-t(3) data.
"""

from __future__ import annotations

import argparse
import math

import torch

from ..numerics.grids import get_grid
from ..numerics.hadamard import as_rht
from ..numerics.quantize import quantize_view_full


def attenuation(x: torch.Tensor, q: torch.Tensor) -> float:
    x64, q64 = x.double().flatten(), q.double().flatten()
    return float((q64 @ x64) / (x64 @ x64))


def sqnr(x: torch.Tensor, q: torch.Tensor) -> float:
    x64, q64 = x.double().flatten(), q.double().flatten()
    noise = ((q64 - x64) ** 2).sum()
    signal = (x64**2).sum()
    if noise == 0:
        return math.inf
    return float(10 * torch.log10(signal / noise))


def _quantized(x: torch.Tensor, fmt, *, rht=None, dim=-1, **kw):
    """(source, QuantizedView) with x moved so that `dim` is last, as a 2D view."""
    moved = x.movedim(dim, -1)
    view = moved.reshape(-1, moved.shape[-1])
    r = as_rht(rht)
    if r is not None and view.shape[1] % r.size:
        raise ValueError(f"size along dim ({view.shape[1]}) must be a multiple of {r.size}")
    q = quantize_view_full(view, fmt, rht=r, **kw)
    C = view.shape[1]
    return q.source[:, :C], q


def quant_stats(x: torch.Tensor, fmt, *, rht=None, dim=-1, **kw) -> dict[str, float]:
    """alpha, SQNR, bucket ratio and effective bits of one quantization (rotated domain)."""
    src, q = _quantized(x, fmt, rht=rht, dim=dim, **kw)
    vals = q.values[:, : src.shape[1]]
    codes = q.codes[:, : src.shape[1]]
    return {
        "alpha": attenuation(src, vals),
        "sqnr_db": sqnr(src, vals),
        "bucket_ratio": bucket_ratio(codes, fmt),
        "effective_bits": effective_bits(codes),
    }


def delta_sqnr(x: torch.Tensor, fmt, *, rht=16, dim=-1, **kw) -> float:
    """SQNR with the RHT minus SQNR without, same blocks, scale and rounding."""
    return (
        quant_stats(x, fmt, rht=rht, dim=dim, **kw)["sqnr_db"]
        - quant_stats(x, fmt, rht=None, dim=dim, **kw)["sqnr_db"]
    )


def bucket_ratio(codes: torch.Tensor, fmt) -> float:
    """B_eff = exp(H) / K over magnitude levels (sign folded)."""
    g = get_grid(fmt)
    k = len(g.levels) + (g.neg_extra is not None)
    counts = torch.bincount(codes.abs().flatten(), minlength=k).double()
    return math.exp(_entropy(counts)) / k


def effective_bits(codes: torch.Tensor) -> float:
    c = codes.flatten()
    counts = torch.bincount(c - c.min()).double() if c.numel() else torch.zeros(1)
    return _entropy(counts) / math.log(2)


def _entropy(counts: torch.Tensor) -> float:
    p = counts[counts > 0] / counts.sum().clamp(min=1)
    return float(-(p * p.log()).sum())


def shrinkage_bias(x: torch.Tensor, fmt, *, dim=-1, **kw) -> dict[float, tuple[int, float]]:
    """{level: (count, mean signed error in grid units)} over the sign-folded scaled values.

    The error of a level is mean(level - v) over the v = |x|/s that rounded to it; E2M1's
    levels 2 and 4 have asymmetric bins and a negative mean (paper: -0.125 and -0.25 for
    uniform v).
    """
    src, q = _quantized(x, fmt, dim=dim, **kw)
    C = src.shape[1]
    s = q.scales.repeat_interleave(kw.get("block", 16), dim=1)[:, :C]
    mask = s > 0
    v = src.abs()[mask] / s[mask]
    code = q.codes[:, :C].abs()[mask]
    levels = q.grid.levels + ((q.grid.neg_extra,) if q.grid.neg_extra else ())
    out = {}
    for i, level in enumerate(levels):
        sel = code == i
        n = int(sel.sum())
        out[level] = (n, float((level - v[sel].double()).mean()) if n else 0.0)
    return out


def sample(kind: str, shape=(4096, 1024), seed: int = 0) -> torch.Tensor:
    """Test data: 'gaussian' or 'student_t3' (heavy-tailed, outlier-rich), fp32."""
    gen = torch.Generator().manual_seed(seed)
    if kind == "gaussian":
        return torch.randn(shape, generator=gen)
    if kind == "student_t3":
        z = torch.randn(shape, generator=gen, dtype=torch.float64)
        chi2 = (torch.randn((3,) + tuple(shape), generator=gen, dtype=torch.float64) ** 2).sum(0)
        return (z / torch.sqrt(chi2 / 3)).float()
    raise ValueError(f"unknown sample kind {kind!r}; valid: gaussian, student_t3")


def table(shape=(4096, 1024), grids=("e2m1", "e1m2", "int4"), seed: int = 0) -> str:
    rows = [
        "| data | grid | RHT | alpha | SQNR (dB) | dSQNR (dB) | B_eff |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for kind in ("gaussian", "student_t3"):
        x = sample(kind, shape, seed)
        for g in grids:
            base = quant_stats(x, g)
            rot = quant_stats(x, g, rht=16)
            for label, st in (("none", base), ("RHT16", rot)):
                d = f"{rot['sqnr_db'] - base['sqnr_db']:+.2f}" if label == "RHT16" else ""
                rows.append(
                    f"| {kind} | {g} | {label} | {st['alpha']:.4f} | "
                    f"{st['sqnr_db']:.2f} | {d} | {st['bucket_ratio']:.3f} |"
                )
    return "\n".join(rows)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="ufp4-diagnostics", description="Quantization diagnostics of the 4-bit grids."
    )
    p.add_argument("--table", action="store_true", help="alpha/SQNR table for each grid")
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if not a.table:
        p.error("nothing to do: pass --table")
    print(f"blocks 1x16, FP32 scales, RTNE; {a.rows}x{a.cols} tensors, seed {a.seed}")
    print(table((a.rows, a.cols), seed=a.seed))


if __name__ == "__main__":
    main()

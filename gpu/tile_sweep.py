"""Tile/warp sweep of the QDQ kernel at 8192x8192 bf16 (one CUDA GPU, under a minute on an
H200); prints ms per config (gpu/kernels.sh keeps the output under its OUT)."""

import torch

from ufp4_megatron.bench.timing import median_ms, rotating
from ufp4_megatron.kernels import quantize_view
from ufp4_megatron.numerics.hadamard import RHT

CONFIGS = {  # row16: (rows, blocks, warps); col16: (groups of 16 rows, columns, warps);
    # col32: (blocks of 32 rows, columns, warps), MXFP4's format
    "row16": [(8, 16, 4), (16, 16, 4), (4, 32, 4)],
    "col16": [(2, 128, 4), (1, 256, 4), (4, 64, 4)],
    "col32": [(1, 128, 4), (1, 64, 2), (1, 256, 8), (2, 128, 8), (2, 64, 4)],
}
FORMATS = {  # UFP4's grid; MXFP4's format for col32
    "row16": dict(grid="e1m2"),
    "col16": dict(grid="e1m2"),
    "col32": dict(grid="e2m1", block=32, scale="e8m0"),
}
n = 8192 * 8192
xs = rotating(lambda: torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16), 2 * n)
o = torch.empty_like(xs[0])
copy = median_ms(lambda x: o.copy_(x), xs)
print(f"copy {copy:.4f} ms")
for mode, cfgs in CONFIGS.items():
    for rounding, rht in (("sr", RHT(16, 0)),):
        spec = dict(FORMATS[mode], rounding=rounding, rht=rht, seed=1)
        for cfg in cfgs:
            tiles = {mode: cfg}
            if mode == "row16":
                fn = lambda x: quantize_view(x, tiles=tiles, **spec)
            else:  # a column layout: the transposed view
                fn = lambda x: quantize_view(x.t(), tiles=tiles, **spec)
            ms = median_ms(fn, xs)
            print(
                f"{mode:4s} {rounding:4s} rht={rht is not None:d} tile={cfg} {ms:.4f} ms "
                f"= {100 * copy / ms:.0f}% of copy BW",
                flush=True,
            )

"""Tile/warp sweep of the QDQ kernel at 8192x8192 bf16 (device tool); prints ms per config."""
import torch

from ufp4_megatron.bench.timing import median_ms, rotating
from ufp4_megatron.kernels import quantize_dual, quantize_view
from ufp4_megatron.numerics.hadamard import RHT

CONFIGS = {
    "row": [(32, 128, 4), (16, 128, 4), (64, 128, 8), (32, 256, 8), (8, 512, 4)],
    "col": [(128, 32, 4), (128, 64, 8), (64, 64, 4), (256, 32, 8), (128, 16, 4)],
    "dual": [(64, 64, 4), (64, 64, 8), (32, 64, 4), (64, 32, 4), (128, 64, 8)],
}
n = 8192 * 8192
xs = rotating(lambda: torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16), 2 * n)
o = torch.empty_like(xs[0])
copy = median_ms(lambda x: o.copy_(x), xs)
print(f"copy {copy:.4f} ms")
for mode, cfgs in CONFIGS.items():
    for rounding, rht in (("rtne", None), ("sr", RHT(16, 0))):
        spec = dict(grid="e1m2", rounding=rounding, rht=rht, seed=1)
        for cfg in cfgs:
            tiles = {mode: cfg}
            fn = {"row": lambda x: quantize_view(x, tiles=tiles, **spec),
                  "col": lambda x: quantize_view(x.t(), tiles=tiles, **spec),
                  "dual": lambda x: quantize_dual(x, spec, spec, tiles=tiles)}[mode]
            ms = median_ms(fn, xs)
            ideal = copy * (1.5 if mode == "dual" else 1.0)
            print(f"{mode:4s} {rounding:4s} rht={rht is not None:d} tile={cfg} {ms:.4f} ms "
                  f"= {100 * ideal / ms:.0f}% of copy BW", flush=True)

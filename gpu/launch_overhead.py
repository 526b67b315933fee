"""Host cost of one kernel launch (one CUDA GPU, seconds): quantize_view on a tiny tensor, CPU
time; prints one line per call (gpu/kernels.sh keeps the output under its OUT)."""

import time

import torch

from ufp4_megatron.kernels import quantize_view
from ufp4_megatron.numerics.hadamard import RHT

x = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
rht = RHT(16, 0)
for name, fn in {
    "row": lambda: quantize_view(x, "e1m2", rht=rht),
    "col16": lambda: quantize_view(x.t(), "e1m2", rht=rht, rounding="sr", seed=3),
    "rht_ctor": lambda: RHT(16, 0),
    "torch_add": lambda: x.add(1),
}.items():
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(500):
        fn()
    print(f"{name}: {(time.perf_counter() - t) / 500 * 1e6:.1f} us per call (host)")
    torch.cuda.synchronize()

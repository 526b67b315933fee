"""Where a UFP4 linear layer's time goes (one CUDA GPU): CPU vs GPU time per fwd+bwd, the
kernels by GPU time, and how often the reference (non-kernel) path runs. About a minute on
an H200; prints its tables."""

import time

import torch
from torch.profiler import ProfilerActivity, profile

from ufp4_megatron import get_recipe, quantized_linear
from ufp4_megatron.quant import fake_quant

calls = {"reference": 0}
_ref = fake_quant._reference_view


def counting_ref(*a, **k):
    calls["reference"] += 1
    return _ref(*a, **k)


fake_quant._reference_view = counting_ref
recipe = get_recipe("ufp4")
for name, (k, n) in {"proj": (2048, 2048), "fc1": (2048, 12288)}.items():
    x = torch.randn(8192, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(8192, n, device="cuda", dtype=torch.bfloat16)

    def step():
        y = quantized_linear(x, w, None, recipe, seed=7)
        return torch.autograd.grad(y, (x, w), dy)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    calls["reference"] = 0
    t = time.perf_counter()
    for _ in range(10):
        step()
    cpu_ms = (time.perf_counter() - t) * 100
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t) * 100
    print(
        f"{name}: per fwd+bwd CPU issue {cpu_ms:.3f} ms, wall {wall_ms:.3f} ms, "
        f"reference calls per step {calls['reference'] / 10}"
    )
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    print(
        prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60)
    )
    print(
        prof.key_averages().table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=60)
    )

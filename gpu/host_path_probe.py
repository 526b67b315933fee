"""Host cost of ops.fprop/dgrad/wgrad per recipe with the kernel launch replaced by a no-op,
and whether each launch would be a cached-launch hit (kernels/launch.py). Runs on a CPU
machine, like `gpu/host_overhead.py --cpu`:

    TRITON_INTERPRET=1 python gpu/host_path_probe.py [--recipes ufp4,e2m1] [--calls 200]

It answers a question of docs/performance.md ("Where a step's time goes"): is E2M1's host
path heavier than UFP4's? The time includes the CPU GEMM of 256x256 operands and every line
of Python up to the launch: a comparison between recipes on one machine, not a GPU number.
"""

from __future__ import annotations

import argparse
import time

import torch
from triton.runtime.jit import JITFunction

from ufp4_megatron import kernels
from ufp4_megatron.kernels import dispatch
from ufp4_megatron.kernels import launch as cached
from ufp4_megatron.quant import ops
from ufp4_megatron.quant.recipe import get_recipe


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipes", default="ufp4,e2m1")
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    seen = []

    jitted = {}

    recording = [True]

    def no_launch(kernel, grid, *a, **kw):
        if not recording[0]:  # timed calls: the launch is a no-op
            return
        # under the interpreter the kernel is an InterpretedFunction; the JITFunction of its
        # source has the parameter list the cached launch reads
        fn = getattr(kernel, "fn", kernel)
        jit = jitted.setdefault(fn, JITFunction(fn) if not hasattr(kernel, "params") else kernel)
        try:
            hash(cached._key(jit, 0, a, kw))
            keyed = True
        except TypeError:
            keyed = False
        seen.append((fn.__name__, keyed and cached._tail(jit, len(a), kw) is not None))

    dispatch.launch = no_launch
    # the path through quantize_pair and dispatch.launch: a prepared launch
    # (kernels.prepare, built per operand shape by ops) calls the compiled kernel directly
    kernels.prepare = lambda *a, **kw: None
    x, w, dy = (torch.randn(256, 256, dtype=torch.bfloat16) for _ in range(3))
    for name in args.recipes.split(","):
        recipe = get_recipe(name)
        for gemm, a, b in (("fprop", x, w), ("dgrad", dy, w), ("wgrad", dy, x)):
            fn = getattr(ops, gemm)
            seen.clear()
            recording[0] = True
            fn(a, b, recipe, backend="triton")
            launches, recording[0] = list(seen), False
            t = time.perf_counter()
            for _ in range(args.calls):
                fn(a, b, recipe, backend="triton")
            us = 1e6 * (time.perf_counter() - t) / args.calls
            print(f"{name} {gemm}: {us:.1f} us per call; launches (kernel, cacheable): {launches}")


if __name__ == "__main__":
    main()

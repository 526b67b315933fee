"""Timing helpers: CUDA events through triton.testing.do_bench (warm-up, L2 flush between
runs, median), with inputs rotated over several buffers so no run reads a cached input."""

from __future__ import annotations

import itertools

import torch
from triton.testing import do_bench

L2_BYTES = 60 * 2**20  # H200: 60 MB (torch.cuda.get_device_properties reports it too)


def rotating(make, nbytes: int, budget: int = 4 * L2_BYTES) -> list:
    """Enough inputs from make() that cycling through them spans `budget` bytes (max 8)."""
    return [make() for _ in range(max(2, min(8, -(-budget // max(nbytes, 1)))))]


def median_ms(fn, inputs: list, warmup_ms: int = 25, rep_ms: int = 100) -> float:
    """Median time of fn(input) in ms, cycling the inputs."""
    it = itertools.cycle(inputs)
    return do_bench(lambda: fn(next(it)), warmup=warmup_ms, rep=rep_ms, return_mode="median")


def peak_bytes(fn, arg) -> int:
    """Peak allocated bytes during one fn(arg) above what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn(arg)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base

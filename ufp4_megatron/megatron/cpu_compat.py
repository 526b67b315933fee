"""Run Megatron-Core on CPU (gloo) for tests: the one place that papers over missing CUDA.

Megatron-Core 0.19.2 assumes CUDA in a few places even when nothing needs a GPU:
  - ~40 allocations on `torch.cuda.current_device()` (RoPE, mappings, router, linears);
  - MoE code creates `torch.cuda.Stream()` / `Event()` and enters `torch.cuda.stream(...)`;
  - `model_parallel_cuda_manual_seed` builds a tracker that forks the CUDA RNG.
`enable_cpu_compat()` points the first at "cpu" and replaces the stream/event objects with
no-ops; `seed_model_parallel(seed)` seeds the RNG trackers in a CPU-safe way. Megatron's own
classes are never patched, only these `torch.cuda` entry points, and only when CUDA is absent:
on a GPU both functions reduce to Megatron's normal behaviour, so GPU runs never use this.

Not covered on CPU (use instead): the alltoall MoE dispatcher's all_to_all with tensor split
sizes (use moe_token_dispatcher_type="allgather"), Megatron's distributed optimizer and grad
clipping (use a torch optimizer), `initialize_megatron` of Megatron-LM (asserts CUDA).
"""
from __future__ import annotations

import contextlib

import torch

_ENABLED = False


class _NullEvent:
    def record(self, stream=None): pass
    def wait(self, stream=None): pass
    def synchronize(self): pass
    def query(self): return True


class _NullStream:
    """Stands in for torch.cuda.Stream: CPU work is already ordered."""

    def __init__(self, *args, **kwargs): pass
    def wait_stream(self, other): pass
    def wait_event(self, event): pass
    def record_event(self, event=None): return event or _NullEvent()
    def synchronize(self): pass
    def query(self): return True
    def __eq__(self, other): return isinstance(other, _NullStream)
    def __hash__(self): return 0


_CURRENT = _NullStream()


def cuda_available() -> bool:
    return torch.cuda.is_available()


def enable_cpu_compat() -> bool:
    """Make Megatron-Core runnable on CPU; idempotent. Returns True when the shims are active,
    False on a CUDA machine (nothing is changed there)."""
    global _ENABLED
    if cuda_available():
        return False
    if _ENABLED:
        return True
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.Stream = _NullStream
    torch.cuda.Event = _NullEvent
    torch.cuda.current_stream = lambda device=None: _CURRENT
    torch.cuda.stream = lambda stream=None: contextlib.nullcontext()
    torch.cuda.synchronize = lambda device=None: None
    _ENABLED = True
    return True


def seed_model_parallel(seed: int) -> None:
    """`model_parallel_cuda_manual_seed(seed)` that also works on CPU.

    On CPU the tracker is Megatron's inference tracker (its fork() does not touch the CUDA
    RNG), and torch's CPU generator is seeded first: with `use_cpu_initialization` every TP
    rank then draws the same full weights and keeps its own slice, so TP=1 and TP=2 models
    start from identical parameters.
    """
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    torch.manual_seed(seed)
    if cuda_available():
        model_parallel_cuda_manual_seed(seed)
    else:
        enable_cpu_compat()
        model_parallel_cuda_manual_seed(seed, inference_rng_tracker=True, force_reset_rng=True)

"""Run Megatron-Core on CPU (gloo): the one place that papers over missing CUDA.

Megatron-Core 0.19.2 assumes CUDA in a few places even when nothing needs a GPU:
  - ~40 allocations on `torch.cuda.current_device()` (RoPE, mappings, router, linears);
  - MoE code creates `torch.cuda.Stream()` / `Event()` and enters `torch.cuda.stream(...)`;
  - `model_parallel_cuda_manual_seed` builds a tracker that forks the CUDA RNG;
  - the optimizers, grad clipping and the schedules allocate small tensors with a literal
    `device='cuda'` (found-inf flags, loss scale, norms, token counters) and check
    `param.type() == 'torch.cuda.FloatTensor'` (FP32Optimizer's clipping, the distributed
    optimizer's and Float16Optimizer's main-param set-up);
  - dist_checkpointing's save calls `torch.cuda.synchronize()`.
`with cpu_compat():` points the first at "cpu", replaces the stream/event objects and
`synchronize` with no-ops, and enters `_CudaOnCpu`, a torch function mode (the mechanism of
`torch.set_default_device`) that turns `device='cuda'` of tensor factories into "cpu", makes
`Tensor.cuda()` return the tensor, and answers `Tensor.type()` with the CUDA type name when
Megatron-Core itself asks; leaving the scope restores the six torch.cuda functions and leaves
the mode. The CPU runtime (train/runtime.py) enters it around a whole run; scopes nest (the
outermost one installs and restores). `enable_cpu_compat()` enters one for the rest of the
process, for test harnesses that are Megatron-on-CPU from their first line to their last.
`seed_model_parallel(seed)` seeds the RNG trackers in a CPU-safe way. Megatron's own classes
are never patched, only these torch entry points, and only when CUDA is absent: on a GPU
every function here reduces to Megatron's normal behaviour, so GPU runs never use this. With
it, Megatron's DDP, `get_megatron_optimizer` (the distributed optimizer too),
`get_forward_backward_func` and `dist_checkpointing` run on CPU/gloo unchanged, so the CPU
tests run the GPU code path.

Not covered on CPU (use instead): the alltoall MoE dispatcher's all_to_all with tensor split
sizes (use moe_token_dispatcher_type="allgather"), `initialize_megatron` of Megatron-LM
(asserts CUDA), pipeline parallelism (not tried on gloo). A torch function mode is
per-thread: the shims hold on the thread that entered the scope (and autograd,
which runs CPU backward on it); dist_checkpointing's writer threads only write bytes.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors


class _NullEvent:
    def record(self, stream=None):
        pass

    def wait(self, stream=None):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True


class _NullStream:
    """Stands in for torch.cuda.Stream: CPU work is already ordered."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return event or _NullEvent()

    def synchronize(self):
        pass

    def query(self):
        return True

    def __eq__(self, other):
        return isinstance(other, _NullStream)

    def __hash__(self):
        return 0


_CURRENT = _NullStream()


def _names_cuda(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return (isinstance(device, str) and device.startswith("cuda")) or (
        isinstance(device, int) and not isinstance(device, bool)
    )


class _CudaOnCpu(TorchFunctionMode):
    """CUDA-only spellings in Megatron-Core, answered on CPU (see the module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FACTORIES and _names_cuda(kwargs.get("device")):
            kwargs = {**kwargs, "device": "cpu"}
        elif func is torch.Tensor.cuda:
            return args[0]
        elif func is torch.Tensor.type and len(args) == 1 and not kwargs and _asked_by_megatron():
            name = func(*args)
            return name if ".cuda." in name else name.replace("torch.", "torch.cuda.", 1)
        return func(*args, **kwargs)


def _asked_by_megatron() -> bool:
    # frame 0: this function, 1: __torch_function__, 2: the code that called Tensor.type()
    return sys._getframe(2).f_globals.get("__name__", "").startswith("megatron.")


_FACTORIES = _device_constructors()


def cuda_available() -> bool:
    return torch.cuda.is_available()


_SHIMS = {  # torch.cuda name -> its CPU stand-in
    "current_device": lambda: "cpu",
    "Stream": _NullStream,
    "Event": _NullEvent,
    "current_stream": lambda device=None: _CURRENT,
    "stream": lambda stream=None: contextlib.nullcontext(),
    "synchronize": lambda device=None: None,
}
_open = 0  # open cpu_compat() scopes; the outermost installs the shims and restores torch.cuda
_saved: dict = {}  # the torch.cuda functions the shims replaced
_mode: _CudaOnCpu | None = None
_forever = False  # enable_cpu_compat() holds one scope open for the rest of the process


def _enter() -> None:
    global _open, _mode
    if _open == 0:
        _saved.update({name: getattr(torch.cuda, name) for name in _SHIMS})
        for name, shim in _SHIMS.items():
            setattr(torch.cuda, name, shim)
        _mode = _CudaOnCpu()
        _mode.__enter__()
    _open += 1


def _exit() -> None:
    global _open, _mode
    _open -= 1
    if _open == 0:
        _mode.__exit__(None, None, None)
        _mode = None
        for name, fn in _saved.items():
            setattr(torch.cuda, name, fn)
        _saved.clear()


@contextlib.contextmanager
def cpu_compat() -> Iterator[bool]:
    """Megatron-Core runnable on CPU inside the block; yields True when the shims are active,
    False on a CUDA machine (nothing is changed there). On exit (an exception too) the
    outermost scope puts torch.cuda's own functions back and leaves the function mode."""
    if cuda_available():
        yield False
        return
    _enter()
    try:
        yield True
    finally:
        _exit()


def active() -> bool:
    """Whether the shims are in place (inside a cpu_compat() scope on a machine without CUDA)."""
    return _open > 0


def enable_cpu_compat() -> bool:
    """`cpu_compat()` for the rest of the process (test harnesses that run nothing but
    Megatron on CPU); idempotent. True when the shims are active, False on a CUDA machine."""
    global _forever
    if cuda_available():
        return False
    if not _forever:
        _enter()
        _forever = True
    return True


def seed_model_parallel(seed: int, graphs: bool = False) -> None:
    """`model_parallel_cuda_manual_seed(seed)` that also works on CPU; graphs: with
    Megatron's cudagraphable RNG tracker (its states registered with every CUDA graph).

    On CPU the tracker is Megatron's inference tracker (its fork() does not touch the CUDA
    RNG), and torch's CPU generator is seeded first: with `use_cpu_initialization` every TP
    rank then draws the same full weights and keeps its own slice, so TP=1 and TP=2 models
    start from identical parameters.
    """
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    torch.manual_seed(seed)
    if cuda_available():
        model_parallel_cuda_manual_seed(seed, use_cudagraphable_rng=graphs, force_reset_rng=graphs)
    else:
        with cpu_compat():
            model_parallel_cuda_manual_seed(seed, inference_rng_tracker=True, force_reset_rng=True)

"""Where and how a run executes, decided once from the config and this machine.

    rt = decide(cfg)        a frozen Runtime; refuses what cannot run here (one line, the key)
    with rt.scope(): ...    everything that runs Megatron-Core; on CPU inside cpu_compat()

The trainer, the mechanism report and the profiler build one Runtime and hand it on: the
model, optimizer, process group, loss reduction, stop flag and checkpoints read their device
facts from it and never ask `torch.cuda.is_available()` again. The table it encodes:

    key                               CUDA visible              no CUDA
    train.device=auto                 cuda                      cpu
    train.device=cuda                 cuda                      refused
    train.device=cpu                  refused (see below)       cpu
    train.dtype=auto                  bf16                      fp32 (CPU bf16 GEMMs are slow
                                                                and no more faithful)
    parallel.backend=auto             nccl                      gloo
    parallel.backend=nccl             nccl                      refused (NCCL has no CPU tensors)
    parallel.pp > 1                   1F1B (Megatron's)         refused (not tried on gloo)
    parallel.distributed_optimizer    as set: Megatron's distributed optimizer, else its
                                      Float16Optimizer (bf16) / FP32Optimizer (fp32)
    checkpoint.optim_fully_reshardable  the distributed optimizer's checkpoint form:
                                      fully_reshardable, else dp_reshardable; none without it
    optim.adam_kernel=auto|fused      TE's (or Apex's) FusedAdam where installed, as Megatron-Core
                                      picks it; else torch AdamW with fused=True, on either
                                      device (Megatron's fallback builds it foreach: several
                                      multi-tensor passes over the optimizer state per step;
                                      what fused saves: docs/performance.md)
    optim.adam_kernel=foreach         torch AdamW foreach; refused where TE/Apex is installed
    checkpoint file format            torch_dist (Megatron 0.19's only save strategy), the
                                      CUDA RNG state saved on GPU only
    train.cuda_graph=local|full_iteration  Megatron-Core's CUDA graphs     refused
                                      (train/graphs.py: what is refused on a GPU too)
    train.weight_cache=auto           all / experts / none by what      all
                                      fits the GPU (train/graphs.py)

train.device=cpu where CUDA is visible is refused: the CPU shims act only where CUDA is absent
(a no-op with CUDA, by design), so Megatron-Core would place its gradient buffers, RoPE tables
and token counters on `torch.cuda.current_device()` beside CPU parameters. A CPU run on a GPU
machine hides the GPUs instead, as `ufp4-launch study --gpus none` does.
"""

from __future__ import annotations

import contextlib
import importlib.util
from dataclasses import dataclass

import torch

from .schema import Config

ADAM_KERNELS = ("auto", "fused", "foreach")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "bf16", "fp32")
BACKENDS = ("auto", "nccl", "gloo")
_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
CHECKPOINT_FORMAT = "torch_dist"


@dataclass(frozen=True)
class Runtime:
    """The decisions of `decide`; pass it, do not re-derive its fields."""

    device: torch.device  # parameters, activations and batches
    dtype: torch.dtype  # Megatron's params_dtype (bf16=True when bfloat16)
    backend: str  # torch.distributed: nccl | gloo
    distributed_optimizer: bool  # Megatron's distributed optimizer, else its plain ones
    # the distributed optimizer's checkpoint form (Megatron-LM's
    # --dist-ckpt-optim-fully-reshardable): dp_reshardable | fully_reshardable; None without it
    optim_sharding: str | None
    # the Adam step: te_fused | apex_fused (Megatron-Core's FusedAdam) | torch_fused | torch_foreach
    adam: str
    checkpoint_format: str = CHECKPOINT_FORMAT  # dist_checkpointing's backend
    cuda_graph: str = "none"  # train.cuda_graph: none | local | full_iteration
    weight_cache: str = "none"  # train.weight_cache decided: all | experts | none

    def describe(self) -> str:
        """One line for the run's log: what was decided."""
        dtype = str(self.dtype).removeprefix("torch.")
        opt = (
            f"distributed optimizer ({self.optim_sharding})"
            if self.distributed_optimizer
            else "plain optimizer"
        )
        return (
            f"runtime: {self.device.type} {dtype}, {self.backend}, {opt}, adam {self.adam}, "
            f"cuda graphs {self.cuda_graph}, weight cache {self.weight_cache}"
        )

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def collective_device(self) -> torch.device:
        """Where a tensor must be for this process group's collectives (NCCL: the GPU)."""
        return torch.device("cuda") if self.backend == "nccl" else torch.device("cpu")

    @property
    def saves_cuda_rng(self) -> bool:
        """Checkpoints hold the CUDA RNG state where the run draws from it."""
        return self.on_gpu

    def scope(self) -> contextlib.AbstractContextManager:
        """The context Megatron-Core runs in: on CPU the plugin's CUDA shims, entered here and
        undone on exit (torch.cuda restored); nothing on GPU."""
        if self.on_gpu:
            return contextlib.nullcontext()
        from ..megatron.cpu_compat import cpu_compat

        return cpu_compat()


def resolve_device(
    requested: str, *, cuda: bool | None = None, key: str = "train.device"
) -> torch.device:
    """auto | cpu | cuda -> the device, given whether CUDA is visible (None: ask torch)."""
    if requested not in DEVICES:
        raise ValueError(f"{key}={requested!r}; valid: {', '.join(DEVICES)}")
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if requested == "auto":
        return torch.device("cuda" if cuda else "cpu")
    if requested == "cuda" and not cuda:
        raise ValueError(
            f"{key}=cuda but no CUDA device is visible here "
            f"(torch.cuda.is_available() is False); use {key}=auto or cpu"
        )
    return torch.device(requested)


def fused_adam_library() -> str | None:
    """Whose FusedAdam Megatron-Core imports here (its own order: TE, then Apex), else None."""
    for module, name in (("transformer_engine", "te"), ("apex", "apex")):
        if importlib.util.find_spec(module) is not None:
            return name
    return None


def resolve_adam(requested: str, library: str | None) -> str:
    """optim.adam_kernel and the installed FusedAdam (None: none) -> Runtime.adam."""
    if requested not in ADAM_KERNELS:
        raise ValueError(f"optim.adam_kernel={requested!r}; valid: {', '.join(ADAM_KERNELS)}")
    if library is not None:
        if requested == "foreach":
            raise ValueError(
                f"optim.adam_kernel=foreach asks for torch's AdamW, but "
                f"Megatron-Core uses {library}'s FusedAdam here; use "
                "optim.adam_kernel=auto"
            )
        return f"{library}_fused"
    return "torch_foreach" if requested == "foreach" else "torch_fused"


INSTALLED = "installed"  # decide()'s default: ask this machine which FusedAdam it has


def decide(
    cfg: Config,
    *,
    cuda: bool | None = None,
    adam_library: str | None = INSTALLED,
    device_bytes: int | None = None,
) -> Runtime:
    """The Runtime of `cfg` on a machine with (cuda=True) or without CUDA (None: this one),
    with `adam_library` ('te', 'apex', None: neither; INSTALLED: what this machine has) and
    a GPU of `device_bytes` memory (None: this one's, asked when the run is on the GPU).
    Raises ValueError, one line naming the key to change, for what cannot run there."""
    from .graphs import check_cuda_graph, resolve_weight_cache

    cuda = torch.cuda.is_available() if cuda is None else cuda
    device = resolve_device(cfg.train.device, cuda=cuda)
    if device.type == "cpu" and cuda:
        raise ValueError(
            "train.device=cpu but a CUDA device is visible here: Megatron-Core "
            "would put its gradient buffers on the GPU (the CPU shims act only "
            "without CUDA); use train.device=auto, or hide the GPUs "
            "(CUDA_VISIBLE_DEVICES=)"
        )
    d = cfg.train.dtype
    if d == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    elif d in _TORCH_DTYPES:
        dtype = _TORCH_DTYPES[d]
    else:
        raise ValueError(f"train.dtype={d!r}; valid: {', '.join(DTYPES)}")
    p = cfg.parallel
    if p.pp > 1 and device.type == "cpu":
        raise ValueError(
            f"parallel.pp={p.pp} runs on GPU only (pipeline parallelism is not "
            "tested on CPU/gloo); use parallel.pp=1 on CPU"
        )
    if p.backend not in BACKENDS:
        raise ValueError(f"parallel.backend={p.backend!r}; valid: {', '.join(BACKENDS)}")
    backend = p.backend if p.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    if backend == "nccl" and device.type == "cpu":
        raise ValueError(
            "parallel.backend=nccl needs GPU tensors but this run is on CPU; use "
            "parallel.backend=auto or gloo"
        )
    sharding = None
    if p.distributed_optimizer:
        sharding = (
            "fully_reshardable" if cfg.checkpoint.optim_fully_reshardable else "dp_reshardable"
        )
    library = fused_adam_library() if adam_library == INSTALLED else adam_library
    on_gpu = device.type == "cuda"
    check_cuda_graph(cfg, on_gpu)
    if on_gpu and device_bytes is None and torch.cuda.is_available():
        device_bytes = torch.cuda.get_device_properties(0).total_memory
    return Runtime(
        device=device,
        dtype=dtype,
        backend=backend,
        distributed_optimizer=p.distributed_optimizer,
        optim_sharding=sharding,
        adam=resolve_adam(cfg.optim.adam_kernel, library),
        cuda_graph=cfg.train.cuda_graph,
        weight_cache=resolve_weight_cache(cfg, device_bytes if on_gpu else None),
    )

"""Process-group and Megatron parallel-state set-up, on GPU (nccl) or CPU (gloo)."""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..megatron.cpu_compat import seed_model_parallel
from .schema import ParallelConfig


@dataclass(frozen=True)
class Dist:
    rank: int
    world_size: int
    device: torch.device
    dp: int
    dp_rank: int


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(cfg: ParallelConfig, device: torch.device, seed: int) -> Dist:
    """torch.distributed (a 1-process group when not under torchrun) and Megatron's groups."""
    from megatron.core import parallel_state as ps

    if device.type == "cpu":
        from ..megatron.cpu_compat import enable_cpu_compat
        enable_cpu_compat()
    if not dist.is_initialized():
        backend = cfg.backend
        if backend == "auto":
            backend = "nccl" if device.type == "cuda" else "gloo"
        if "WORLD_SIZE" in os.environ:
            if device.type == "cuda":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            dist.init_process_group(backend)
        else:
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_free_port()}",
                                    rank=0, world_size=1)
    world = dist.get_world_size()
    model_ranks = cfg.tp * cfg.pp
    if world % model_ranks:
        raise ValueError(f"world size {world} is not divisible by parallel.tp * parallel.pp = "
                         f"{model_ranks}; change the parallel sizes or the number of processes")
    dp = world // model_ranks
    if cfg.dp is not None and cfg.dp != dp:
        raise ValueError(f"parallel.dp={cfg.dp} but world size {world} / (tp*pp) gives {dp}; "
                         f"set parallel.dp=null or launch {cfg.dp * model_ranks} processes")
    if cfg.sp and cfg.tp == 1:
        raise ValueError("parallel.sp=true needs parallel.tp > 1")
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(tensor_model_parallel_size=cfg.tp,
                                     pipeline_model_parallel_size=cfg.pp,
                                     expert_model_parallel_size=cfg.ep)
    seed_model_parallel(seed)
    return Dist(rank=dist.get_rank(), world_size=world, device=device, dp=dp,
                dp_rank=ps.get_data_parallel_rank())


def shutdown() -> None:
    from megatron.core import parallel_state as ps

    if dist.is_initialized():
        dist.barrier()
        ps.destroy_model_parallel()
        dist.destroy_process_group()

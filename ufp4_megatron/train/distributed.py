"""Process-group and Megatron parallel-state set-up, on GPU (nccl) or CPU (gloo).

The backend and device come decided (train/runtime.py); on CPU this runs inside the
runtime's scope (the CPU shims), entered by the caller around the whole run.

Addresses: under torchrun the process group joins torchrun's rendezvous (env://, its
MASTER_ADDR/MASTER_PORT). A single process (no WORLD_SIZE) needs no rendezvous: its group is
made over an in-process store (`single_process_group`), so it opens no port, takes no
port another job could take, and cannot wait on a connection: with the loopback interface
down, a TCP store on 127.0.0.1 retried its connection for torch's 30-minute default timeout.
A process group that cannot be made (gloo finds no network interface, NCCL fails to set
up) is a ConfigError, one line saying what the machine lacks.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..megatron.cpu_compat import active as cpu_compat_active
from ..megatron.cpu_compat import seed_model_parallel
from .runtime import Runtime
from .schema import ParallelConfig
from .validate import ConfigError


@dataclass(frozen=True)
class Dist:
    rank: int
    world_size: int
    device: torch.device
    dp: int
    dp_rank: int


SINGLE_PROCESS_TIMEOUT = datetime.timedelta(minutes=5)  # a collective of one waits on no one


def single_process_group(backend: str) -> None:
    """torch.distributed's default group for this process alone, over an in-process store."""
    _make_group(
        lambda: dist.init_process_group(
            backend, store=dist.HashStore(), rank=0, world_size=1, timeout=SINGLE_PROCESS_TIMEOUT
        )
    )


def _make_group(make) -> None:
    try:
        make()
    except (RuntimeError, ValueError) as e:  # DistNetworkError, gloo's enforce failures, ...
        what = " ".join(str(e).split())[:300]
        hint = ""
        if "interface" in what.lower() or "network" in what.lower():
            hint = (
                "; gloo needs a network interface for its address, even alone: bring the "
                "loopback interface up (`ip link set lo up`) or name one with "
                "GLOO_SOCKET_IFNAME"
            )
        raise ConfigError(
            f"torch.distributed could not set up its process group on this "
            f"machine ({type(e).__name__}: {what}){hint}"
        ) from None


def init(cfg: ParallelConfig, runtime: Runtime, seed: int) -> Dist:
    """torch.distributed (a 1-process group when not under torchrun) and Megatron's groups."""
    from megatron.core import parallel_state as ps

    if not runtime.on_gpu and not cpu_compat_active():
        raise RuntimeError(
            "distributed.init on CPU outside the runtime's scope: run Megatron "
            "inside `with runtime.scope():` (train/runtime.py)"
        )
    if not dist.is_initialized():
        if "WORLD_SIZE" in os.environ:
            if runtime.on_gpu:
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            _make_group(lambda: dist.init_process_group(runtime.backend))
        else:
            single_process_group(runtime.backend)
    world = dist.get_world_size()
    model_ranks = cfg.tp * cfg.pp
    if world % model_ranks:
        raise ValueError(
            f"world size {world} is not divisible by parallel.tp * parallel.pp = "
            f"{model_ranks}; change the parallel sizes or the number of processes"
        )
    dp = world // model_ranks
    if cfg.dp is not None and cfg.dp != dp:
        raise ValueError(
            f"parallel.dp={cfg.dp} but world size {world} / (tp*pp) gives {dp}; "
            f"set parallel.dp=null or launch {cfg.dp * model_ranks} processes"
        )
    if cfg.sp and cfg.tp == 1:
        raise ValueError("parallel.sp=true needs parallel.tp > 1")
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(
            tensor_model_parallel_size=cfg.tp,
            pipeline_model_parallel_size=cfg.pp,
            expert_model_parallel_size=cfg.ep,
        )
    seed_model_parallel(seed, graphs=runtime.cuda_graph != "none")
    return Dist(
        rank=dist.get_rank(),
        world_size=world,
        device=runtime.device,
        dp=dp,
        dp_rank=ps.get_data_parallel_rank(),
    )


def shutdown() -> None:
    from megatron.core import parallel_state as ps

    if dist.is_initialized():
        dist.barrier()
        ps.destroy_model_parallel()
        dist.destroy_process_group()

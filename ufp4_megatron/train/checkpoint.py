"""Checkpoints: save every N steps, at the end and on SIGTERM/SIGUSR1; resume exactly.

A checkpoint holds everything that decides the next step's loss: model, optimizer, step
(which is the data position and the LR schedule's state, see data.py and optim.lr_at), all
RNG streams (torch, Megatron's tracker, numpy, random) and the SR-seed state. Layout:

    <dir>/step_00000120/rank_00000.pt ...   one file per rank (CPU)
    <dir>/step_00000120/dist/               Megatron dist_checkpointing of model + optimizer (GPU)
    <dir>/latest                            "120", written last, after every rank has saved

dist_checkpointing is used on GPU only. On CPU its save calls torch.cuda.synchronize (the
plugin's cpu_compat stubs that) and its async file writer needs psutil, which this package
does not install; per-rank torch.save is the CPU format.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist


def _rng_state() -> dict:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
             "random": random.getstate(), "tracker": get_cuda_rng_tracker().get_states()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["random"])
    get_cuda_rng_tracker().set_states(state["tracker"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])


def latest_step(ckpt_dir: Path) -> int | None:
    f = Path(ckpt_dir) / "latest"
    return int(f.read_text()) if f.exists() else None


def save(ckpt_dir: Path, step: int, model, optimizer, extra: dict, keep: int) -> Path:
    """Collective: every rank writes its part, then rank 0 marks the step as latest."""
    ckpt_dir = Path(ckpt_dir)
    path = ckpt_dir / f"step_{step:08d}"
    rank = dist.get_rank()
    path.mkdir(parents=True, exist_ok=True)
    state = {"step": step, "world_size": dist.get_world_size(), "rng": _rng_state(),
             "extra": {k: v.state_dict() for k, v in extra.items()}}
    if _use_dist_checkpointing(model):
        _dist_save(path / "dist", model, optimizer)
    else:
        state |= {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    tmp = path / f"rank_{rank:05d}.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path / f"rank_{rank:05d}.pt")
    dist.barrier()
    if rank == 0:
        (ckpt_dir / "latest.tmp").write_text(str(step))
        os.replace(ckpt_dir / "latest.tmp", ckpt_dir / "latest")
        old = sorted(ckpt_dir.glob("step_*"))[:-keep] if keep > 0 else []
        for p in old:
            shutil.rmtree(p, ignore_errors=True)
    dist.barrier()
    return path


def load(ckpt_dir: Path, model, optimizer, extra: dict) -> int:
    """Restores the latest checkpoint in ckpt_dir; returns its step."""
    step = latest_step(ckpt_dir)
    path = Path(ckpt_dir) / f"step_{step:08d}"
    state = torch.load(path / f"rank_{dist.get_rank():05d}.pt", weights_only=False)
    if state["world_size"] != dist.get_world_size():
        raise RuntimeError(f"{path} was written by {state['world_size']} ranks, this run has "
                           f"{dist.get_world_size()}; resume with the same layout")
    if _use_dist_checkpointing(model):
        _dist_load(path / "dist", model, optimizer)
    else:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    for k, v in extra.items():
        v.load_state_dict(state["extra"][k])
    _set_rng_state(state["rng"])
    return state["step"]


def _use_dist_checkpointing(model) -> bool:
    return next(model.parameters()).is_cuda


def _dist_save(path: Path, model, optimizer) -> None:  # GPU path; not run on the CPU CI
    from megatron.core import dist_checkpointing

    if dist.get_rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    model_sd = model.sharded_state_dict()
    dist_checkpointing.save({"model": model_sd,
                             "optimizer": optimizer.opt.sharded_state_dict(model_sd)}, str(path))


def _dist_load(path: Path, model, optimizer) -> None:
    from megatron.core import dist_checkpointing

    model_sd = model.sharded_state_dict()
    template = {"model": model_sd, "optimizer": optimizer.opt.sharded_state_dict(model_sd,
                                                                                is_loading=True)}
    state = dist_checkpointing.load(template, str(path))
    model.load_state_dict(state["model"])
    optimizer.opt.load_state_dict(state["optimizer"])


class StopSignal:
    """Turns SIGTERM/SIGUSR1 (Slurm's pre-emption warnings) into a flag read between steps;
    `requested()` agrees across ranks, so all of them save and stop at the same step."""

    def __init__(self):
        self._flag = False
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self._flag = True

    def requested(self) -> bool:
        t = torch.tensor([int(self._flag)], dtype=torch.int32)
        if dist.is_initialized() and dist.get_backend() == "gloo":
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        elif dist.is_initialized():
            t = t.cuda()
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

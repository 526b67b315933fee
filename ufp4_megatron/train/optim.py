"""AdamW with warmup + cosine decay and global-norm clipping, on GPU or CPU.

GPU: Megatron-Core's DDP and `get_megatron_optimizer` (distributed optimizer when asked).
CPU: Megatron's optimizer and DDP hard-code CUDA tensors, so a plain torch AdamW per rank,
with the gradient all-reduce and the TP-aware grad norm done here. Both present one
interface: zero_grad(), step() -> grad norm, state_dict(), load_state_dict().
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .schema import Config, OptimConfig


def lr_at(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """Linear warmup over warmup_steps, then cosine from lr to min_lr at total_steps."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))


def _decays(name: str, p: torch.nn.Parameter) -> bool:
    return p.dim() > 1  # no weight decay on norms and biases (Megatron's default)


class CpuOptimizer:
    """torch AdamW + data-parallel gradient averaging + clipping by the global grad norm."""

    def __init__(self, model: torch.nn.Module, cfg: Config):
        from megatron.core import parallel_state as ps

        self.model, self.cfg = model, cfg.optim
        self.sp = cfg.parallel.sp
        params = list(model.named_parameters())
        groups = [
            {"params": [p for n, p in params if _decays(n, p)],
             "weight_decay": self.cfg.weight_decay},
            {"params": [p for n, p in params if not _decays(n, p)], "weight_decay": 0.0},
        ]
        self.opt = torch.optim.AdamW(groups, lr=self.cfg.lr, betas=(self.cfg.beta1, self.cfg.beta2),
                                     eps=self.cfg.eps)
        self.dp_group = ps.get_data_parallel_group()
        self.tp_group = ps.get_tensor_model_parallel_group()
        self.mp_group = ps.get_model_parallel_group()

    def set_lr(self, lr: float) -> None:
        for g in self.opt.param_groups:
            g["lr"] = lr

    def zero_grad(self) -> None:
        self.model.zero_grad(set_to_none=False)

    def _finalize_grads(self) -> None:
        params = [p for p in self.model.parameters() if p.grad is not None]
        if dist.get_world_size(self.dp_group) > 1:
            for p in params:
                dist.all_reduce(p.grad, group=self.dp_group)
                p.grad.div_(dist.get_world_size(self.dp_group))
        if self.sp and dist.get_world_size(self.tp_group) > 1:
            # sequence-parallel norms see only this rank's tokens: sum their grads over TP
            for p in params:
                if getattr(p, "sequence_parallel", False):
                    dist.all_reduce(p.grad, group=self.tp_group)

    def _grad_norm(self) -> torch.Tensor:
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

        sq = torch.zeros((), dtype=torch.float32)
        for p in self.model.parameters():
            if p.grad is not None and param_is_not_tensor_parallel_duplicate(p):
                sq += p.grad.float().pow(2).sum()
        if dist.get_world_size(self.mp_group) > 1:
            dist.all_reduce(sq, group=self.mp_group)
        return sq.sqrt()

    def step(self) -> float:
        self._finalize_grads()
        norm = self._grad_norm()
        if self.cfg.clip_grad > 0:
            coef = torch.clamp(self.cfg.clip_grad / (norm + 1e-6), max=1.0)
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(coef)
        self.opt.step()
        return float(norm)

    def state_dict(self) -> dict:
        return self.opt.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.opt.load_state_dict(state)


class MegatronOptimizer:
    """Megatron-Core DDP + optimizer (distributed optimizer when parallel.distributed_optimizer)."""

    def __init__(self, model: torch.nn.Module, cfg: Config):
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.distributed import finalize_model_grads
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        o, p = cfg.optim, cfg.parallel
        ddp_cfg = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                                use_distributed_optimizer=p.distributed_optimizer)
        self.model = DistributedDataParallel(config=model.config, ddp_config=ddp_cfg, module=model)
        model.config.finalize_model_grads_func = finalize_model_grads
        model.config.no_sync_func = self.model.no_sync
        opt_cfg = OptimizerConfig(
            optimizer="adam", lr=o.lr, min_lr=o.min_lr, weight_decay=o.weight_decay,
            adam_beta1=o.beta1, adam_beta2=o.beta2, adam_eps=o.eps, clip_grad=o.clip_grad,
            bf16=model.config.bf16, params_dtype=model.config.params_dtype,
            use_distributed_optimizer=p.distributed_optimizer)
        self.opt = get_megatron_optimizer(opt_cfg, [self.model])

    def set_lr(self, lr: float) -> None:
        for g in self.opt.param_groups:
            g["lr"] = lr

    def zero_grad(self) -> None:
        self.model.zero_grad_buffer()
        self.opt.zero_grad()

    def step(self) -> float:
        _, grad_norm, _ = self.opt.step()
        return float(grad_norm)

    def state_dict(self) -> dict:
        return self.opt.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.opt.load_state_dict(state)


def build_optimizer(model: torch.nn.Module, cfg: Config, device: torch.device):
    return MegatronOptimizer(model, cfg) if device.type == "cuda" else CpuOptimizer(model, cfg)

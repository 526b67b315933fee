"""Megatron-Core's DDP, optimizer and LR schedule, on GPU and CPU alike.

`get_megatron_optimizer` (AdamW, global-norm clipping; the distributed optimizer when
parallel.distributed_optimizer) over Megatron's DDP, and `OptimizerParamScheduler` for the LR
(the decay styles of Megatron-LM: cosine, linear, constant, inverse-square-root, WSD). On CPU
these run unchanged inside the CPU runtime's scope (the plugin's cpu_compat shims), so the CPU
tests exercise the code path of GPU runs, checkpoints included. Which optimizer, and how its
state is checkpointed, comes decided in the Runtime (train/runtime.py).

LR indexing: the update of step s (0-based) runs at the scheduler's value after s + 1
increments. Warmup is then lr * (s + 1) / warmup_steps, as before this module used Megatron's
scheduler, and the last update of a run runs at min_lr. (Megatron-LM evaluates after s
increments, so its first update runs at lr_warmup_init, 0 by default.)
"""

from __future__ import annotations

import torch

from .runtime import Runtime
from .schema import Config

DECAY_STYLES = ("cosine", "linear", "constant", "inverse-square-root", "WSD")
WSD_DECAY_STYLES = ("linear", "cosine", "exponential", "minus_sqrt")


class MegatronOptimizer:
    """Megatron-Core DDP + optimizer + LR scheduler; `model` is the DDP-wrapped module."""

    def __init__(self, model: torch.nn.Module, cfg: Config, runtime: Runtime):
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        o, distributed = cfg.optim, runtime.distributed_optimizer
        ddp_cfg = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=False,
            use_distributed_optimizer=distributed,
        )
        self.model = DistributedDataParallel(
            config=model.config,
            ddp_config=ddp_cfg,
            module=model,
            full_param_layout=_param_layout(model, ddp_cfg),
        )
        model.config.finalize_model_grads_func = finalize_model_grads
        model.config.no_sync_func = self.model.no_sync
        opt_cfg = OptimizerConfig(
            optimizer="adam",
            lr=o.lr,
            min_lr=o.min_lr,
            weight_decay=o.weight_decay,
            adam_beta1=o.beta1,
            adam_beta2=o.beta2,
            adam_eps=o.eps,
            clip_grad=o.clip_grad,
            bf16=model.config.bf16,
            params_dtype=model.config.params_dtype,
            use_distributed_optimizer=distributed,
        )
        self.opt = get_megatron_optimizer(opt_cfg, [self.model])
        select_adam_kernel(self.opt, runtime.adam)
        self.scheduler = build_scheduler(self.opt, cfg)
        self.distributed = distributed

    def prepare_load(self) -> None:
        """Before building a load template. Without Apex/TE Megatron-Core 0.19.2 falls back to
        torch AdamW, whose state holds a per-param 'step' that a fresh optimizer lacks; the
        distributed optimizer's state_dict() requires it. Give each param the state a first
        step would create (zeros, step 0); the load then overwrites all of it."""
        if not self.distributed:  # Megatron's plain optimizers build their template themselves
            return
        for inner in _torch_adams(self.opt):
            for group in inner.param_groups:
                for q in group["params"]:
                    st = inner.state[q]
                    if "step" not in st:
                        st.setdefault("exp_avg", torch.zeros_like(q))
                        st.setdefault("exp_avg_sq", torch.zeros_like(q))
                        st["step"] = _step_tensor(0.0, group, q)

    def load_state_dict(self, state: dict) -> None:
        """Megatron's load_state_dict, plus repairs of its torch-AdamW fallback (no Apex/TE:
        this package's CPU and GPU environments) in the distributed optimizer, whose torch
        state then carries a per-param 'step' that Megatron's own code does not expect:
          - fully_reshardable drops 'step' from the loaded tensors, then copies every key of
            the torch state into place (KeyError 'step'): its parameter state is loaded here,
            by Megatron's load_parameter_state_from_fully_reshardable, with 'step' held aside;
          - the load gives every param one shared 'step' tensor, which AdamW would then
            increment once per param per update, and (dp_reshardable) copies the load
            template's step over the restored one: each param gets its own step, set from its
            param group's, which Megatron restores from the checkpoint."""
        chained = getattr(self.opt, "chained_optimizers", [self.opt])
        parts = [state] if len(chained) == 1 else [v for _, v in sorted(state.items())]
        later = []
        for sub, part in zip(chained, parts):
            if (
                _torch_adam(sub) is not None
                and isinstance(part, dict)
                and part.get("param_state_sharding_type") == "fully_reshardable"
            ):
                later.append((sub, part.pop("param_state")))
                part.pop("param_state_sharding_type")
        with torch.no_grad():  # copies into parameters (fp32 main params are views of them)
            self.opt.load_state_dict(state)
            for sub, param_state in later:
                inner = _torch_adam(sub)
                for st in inner.state.values():
                    st.pop("step", None)
                sub.load_parameter_state_from_fully_reshardable(param_state)
        for inner in filter(None, map(_torch_adam, chained)):
            for group in inner.param_groups:
                if "step" not in group:  # not the distributed optimizer: torch restored it
                    continue
                for q in group["params"]:
                    inner.state[q]["step"] = _step_tensor(float(group["step"]), group, q)

    def advance_lr(self) -> float:
        """Moves the schedule to the coming update and returns its LR."""
        self.scheduler.step(increment=1)
        return float(self.opt.param_groups[0]["lr"])

    def zero_grad(self) -> None:
        self.model.zero_grad_buffer()
        self.opt.zero_grad()

    def step(self) -> float:
        _, grad_norm, _ = self.opt.step()
        return float(grad_norm)


def select_adam_kernel(opt, adam: str) -> None:
    """Runtime.adam on the torch AdamW that Megatron-Core builds without TE/Apex (foreach, as
    it passes no kernel flag). torch reads `fused`/`foreach` from each param group at every
    step, so setting them here is torch's own switch; nothing of Megatron's is patched. Applied
    to whatever torch AdamW Megatron built, so a TE/Apex install that fails to import still
    gets the fused kernel. TE/Apex FusedAdam: nothing to select."""
    fused = adam != "torch_foreach"
    for inner in _torch_adams(opt):
        for group in [inner.defaults, *inner.param_groups]:
            group["fused"], group["foreach"] = fused, not fused


def _step_tensor(value: float, group: dict, param: torch.Tensor) -> torch.Tensor:
    """A torch Adam 'step' as torch itself creates it: float32 on the parameter's device for the
    fused (or capturable) kernel, which reads it there; on the CPU otherwise."""
    on_param = group.get("fused") or group.get("capturable")
    return torch.tensor(
        value, dtype=torch.float32, device=param.device if on_param else torch.device("cpu")
    )


def _torch_adam(sub) -> torch.optim.Optimizer | None:
    """The torch Adam(W) inside one of Megatron's optimizers; None with Apex/TE's FusedAdam."""
    inner = getattr(sub, "optimizer", None)
    return inner if isinstance(inner, (torch.optim.Adam, torch.optim.AdamW)) else None


def _torch_adams(opt) -> list[torch.optim.Optimizer]:
    return list(filter(None, map(_torch_adam, getattr(opt, "chained_optimizers", [opt]))))


def _param_layout(model: torch.nn.Module, ddp_cfg):
    """The distributed optimizer's parameter layout, computed before DDP as Megatron-LM's
    wrap_model_chunks_with_ddp does (one bucket: overlap_grad_reduce is off); None without it."""
    from megatron.core import parallel_state as ps
    from megatron.core.optimizer import DistributedOptimizer

    if not ddp_cfg.use_distributed_optimizer:
        return None
    return DistributedOptimizer.compute_full_param_layout(
        [q for q in model.parameters() if q.requires_grad],
        None,
        ps.get_data_parallel_world_size(with_context_parallel=True),
        ddp_cfg,
        expert_data_parallel_world_size=ps.get_expert_data_parallel_world_size(),
    )


def check_schedule(cfg: Config) -> None:
    """The schedule's keys, checked before anything is built (one line per mistake)."""
    o = cfg.optim
    if o.decay_style not in DECAY_STYLES:
        raise ValueError(f"optim.decay_style={o.decay_style!r}; valid: {', '.join(DECAY_STYLES)}")
    if o.warmup_steps < 0:
        raise ValueError(f"optim.warmup_steps={o.warmup_steps} must be >= 0")
    if not 0 <= o.min_lr <= o.lr:
        raise ValueError(f"optim.min_lr={o.min_lr} must be in [0, optim.lr={o.lr}]")
    if o.decay_steps is not None and o.decay_steps <= o.warmup_steps:
        raise ValueError(
            f"optim.decay_steps={o.decay_steps} must exceed optim.warmup_steps="
            f"{o.warmup_steps}; or set optim.decay_steps=null (= train.steps)"
        )
    if o.decay_style == "WSD":
        if o.wsd_decay_steps is None or o.wsd_decay_steps < 1:
            raise ValueError(
                "optim.decay_style=WSD needs optim.wsd_decay_steps >= 1 (the length "
                "of the final decay)"
            )
        if o.wsd_decay_style not in WSD_DECAY_STYLES:
            raise ValueError(
                f"optim.wsd_decay_style={o.wsd_decay_style!r}; valid: {', '.join(WSD_DECAY_STYLES)}"
            )
        if o.wsd_decay_steps > decay_steps(cfg) - o.warmup_steps:
            raise ValueError(
                f"optim.wsd_decay_steps={o.wsd_decay_steps} is longer than the "
                f"decay phase ({decay_steps(cfg)} - {o.warmup_steps} warmup steps)"
            )


def decay_steps(cfg: Config) -> int:
    """optim.decay_steps, or train.steps; at least warmup + 1, as Megatron's scheduler asks
    (a run shorter than its warmup then stays in warmup, as it did before)."""
    o = cfg.optim
    return o.decay_steps if o.decay_steps is not None else max(cfg.train.steps, o.warmup_steps + 1)


def build_scheduler(optimizer, cfg: Config):
    """Megatron-Core's OptimizerParamScheduler, as Megatron-LM builds it from its flags
    (--lr-warmup-iters, --lr-decay-iters, --lr-decay-style, --lr-wsd-decay-*, constant wd).
    On resume its state is the checkpoint's (use_checkpoint_opt_param_scheduler)."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    check_schedule(cfg)
    o = cfg.optim
    return OptimizerParamScheduler(
        optimizer,
        init_lr=0.0,
        max_lr=o.lr,
        min_lr=o.min_lr,
        lr_warmup_steps=o.warmup_steps,
        lr_decay_steps=decay_steps(cfg),
        lr_decay_style=o.decay_style,
        start_wd=o.weight_decay,
        end_wd=o.weight_decay,
        wd_incr_steps=decay_steps(cfg),
        wd_incr_style="constant",
        use_checkpoint_opt_param_scheduler=True,
        override_opt_param_scheduler=False,
        wsd_decay_steps=o.wsd_decay_steps,
        lr_wsd_decay_style=o.wsd_decay_style,
    )


def build_optimizer(model: torch.nn.Module, cfg: Config, runtime: Runtime) -> MegatronOptimizer:
    return MegatronOptimizer(model, cfg, runtime)


def resumed_schedule_note(scheduler, cfg: Config) -> str | None:
    """A line for the log when a resumed run's schedule (the checkpoint's) differs from what
    its config would start, e.g. after extending train.steps."""
    asked = decay_steps(cfg)
    if scheduler.lr_decay_steps == asked:
        return None
    return (
        f"LR schedule continues the checkpoint's: {scheduler.lr_decay_style} decay over "
        f"{scheduler.lr_decay_steps} steps (this config alone would decay over {asked}); "
        f"steps past {scheduler.lr_decay_steps} run at min_lr={scheduler.min_lr:g}"
    )

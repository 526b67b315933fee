"""One run's parts, built in the order Megatron needs them: ranks -> recipe -> model ->
optimizer -> datasets. The trainer (loop.py), the mechanism report (report/mechanism.py) and
the step profiler (bench/profile.py) all build a run here, so the three cannot drift apart
(a model without the run's recipe, data without its attention masks). Call it inside the
runtime's scope (`with rt.scope():`): on CPU, Megatron needs the CUDA shims from the start.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..data import datasets as data
from ..quant.recipe import Recipe
from . import distributed, optim
from . import model as model_lib
from .precision import recipe_from_config
from .runtime import Runtime
from .schema import Config


@dataclass(frozen=True)
class BuiltRun:
    """What build_run returns. model: the module as built (checkpoints load into it);
    opt.model: Megatron's DDP wrapper around it, which the steps run; n_micro: micro-batches
    per global batch on this data-parallel rank."""

    env: distributed.Dist
    recipe: Recipe
    model: Any
    policy: Any
    opt: Any
    train_ds: Any
    valid_ds: Any
    n_micro: int


def build_run(
    cfg: Config,
    rt: Runtime,
    *,
    n_train: int,
    n_valid: int,
    after_init: Callable[[], None] | None = None,
) -> BuiltRun:
    """The process group, recipe, model, optimizer and datasets of `cfg` on `rt`: n_train
    and n_valid samples (the datasets' sizes), the linears keeping their weight operands as
    the runtime decided (Runtime.weight_cache, train.weight_cache); after_init runs once the
    process group is up, before anything is built (the trainer's checks that every rank
    agrees)."""
    env = distributed.init(cfg.parallel, rt, cfg.train.seed)
    if after_init is not None:
        after_init()
    recipe = recipe_from_config(cfg.precision)
    model, policy = model_lib.build_model(
        cfg, recipe, rt.dtype, rt.device, weight_cache=rt.weight_cache
    )
    opt = optim.build_optimizer(model, cfg, rt)
    t = cfg.train
    train_ds, valid_ds = data.build_datasets(
        cfg.data,
        seed=t.seed,
        seq_len=t.seq_len,
        vocab_size=cfg.model.vocab_size,
        n_train=n_train,
        n_valid=n_valid,
        create_attention_mask=model_lib.needs_attention_mask(cfg),  # only unfused attention
    )
    n_micro = data.num_micro_batches(t.global_batch, t.micro_batch, env.dp)
    return BuiltRun(env, recipe, model, policy, opt, train_ds, valid_ds, n_micro)

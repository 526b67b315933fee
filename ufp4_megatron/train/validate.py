"""Every check of a training config that can fail before anything is built or written.

    check_config(cfg, world_size=None)   the config alone: values in range, a parallel layout
                                         the model divides into (and, given a world size, one
                                         the processes divide into); `describe` uses it too
    check_machine(cfg)                   what this machine must offer (train/runtime.py: a
                                         GPU for train.device=cuda or pipeline parallelism,
                                         none for train.device=cpu, CUDA for nccl)

Each failure is a ConfigError whose message is one line naming the key, its value and what to
change; `python -m ufp4_megatron.train` prints it as `error: <message>` and exits 2. The
schema (train/schema.py) already refused unknown keys and wrong types; these are the values
a type cannot rule out, which otherwise end in a ZeroDivisionError, a SIGFPE, a NaN loss that
exits 0, or an assertion deep inside Megatron.
"""
from __future__ import annotations

import math
import os
from math import gcd

from . import tensorboard_log
from .optim import check_schedule
from .runtime import BACKENDS, DEVICES, DTYPES, decide
from .schema import Config
from .te_route import check_config as check_te_route
from .te_route import check_installed

PROGRESS = ("auto", "bar", "plain")
WANDB_MODES = ("auto", "offline", "online", "disabled")
MAX_SEED = 2**31  # numpy's RandomState (Megatron's dataset shuffling) takes seeds < 2**32


class ConfigError(ValueError):
    """A config the trainer refuses; str(e) is one line saying what to change."""


def check_config(cfg: Config, world_size: int | None = None) -> None:
    """Raises ConfigError for the first problem found (in the order of the groups below).

    world_size: the number of processes (torchrun's WORLD_SIZE); None: the one parallel.dp
    implies, or no world checks when that is null too."""
    _check_model(cfg)
    _check_train(cfg)
    _check_optim(cfg)
    _check_logging(cfg)
    _check_precision(cfg)
    _check_layout(cfg)
    _check_transformer_impl(cfg)
    p = cfg.parallel
    if world_size is None and p.dp is not None:  # describe: the world the layout names
        world_size = p.tp * p.pp * p.dp
    if world_size is not None:
        _check_world(cfg, world_size)


def check_machine(cfg: Config) -> None:
    """The checks that depend on this machine, not on the config alone: what the runtime
    decision (train/runtime.py) refuses here, and the environment's UFP4_CACHED_LAUNCH
    (kernels/launch.py reads it when the kernels are first imported, deep in a GPU run: here
    a wrong value stops the start in one line instead)."""
    launch = os.environ.get("UFP4_CACHED_LAUNCH")
    if launch not in (None, "0", "1"):
        raise ConfigError(f"UFP4_CACHED_LAUNCH={launch!r}: give 1 (cached kernel launches, the "
                          "default) or 0 (Triton's own launch path for every call), or unset it")
    try:
        decide(cfg)
        if cfg.model.transformer_impl == "transformer_engine":
            check_installed()
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if cfg.logging.tensorboard and (problem := tensorboard_log.problem()):
        raise ConfigError(problem)


def _positive(values: dict[str, int]) -> None:
    for key, v in values.items():
        if v < 1:
            raise ConfigError(f"{key}={v} must be >= 1")


def _one_of(key: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ConfigError(f"{key}={value!r}; valid: {', '.join(valid)}")


def _check_model(cfg: Config) -> None:
    m = cfg.model
    _positive({"model.num_layers": m.num_layers, "model.hidden_size": m.hidden_size,
               "model.ffn_hidden_size": m.ffn_hidden_size,
               "model.num_attention_heads": m.num_attention_heads,
               "model.num_query_groups": m.num_query_groups, "model.vocab_size": m.vocab_size,
               "model.max_seq_len": m.max_seq_len})
    if m.num_attention_heads % m.num_query_groups:
        raise ConfigError(f"model.num_query_groups={m.num_query_groups} must divide "
                          f"model.num_attention_heads={m.num_attention_heads} (each key/value "
                          "head serves a whole number of query heads)")
    if m.kv_channels is None and m.hidden_size % m.num_attention_heads:
        raise ConfigError(f"model.hidden_size={m.hidden_size} is not a multiple of "
                          f"model.num_attention_heads={m.num_attention_heads}; change one, or "
                          "set model.kv_channels (the head dim)")
    if m.kv_channels is not None:
        _positive({"model.kv_channels": m.kv_channels})
    if m.init_std <= 0:
        raise ConfigError(f"model.init_std={m.init_std} must be > 0")
    if m.num_experts is None:
        return
    _positive({"model.num_experts": m.num_experts})
    if not 1 <= m.moe_router_topk <= m.num_experts:
        raise ConfigError(f"model.moe_router_topk={m.moe_router_topk} must be between 1 and "
                          f"model.num_experts={m.num_experts}")
    if m.moe_ffn_hidden_size is None or m.moe_ffn_hidden_size < 1:
        raise ConfigError(f"model.moe_ffn_hidden_size={m.moe_ffn_hidden_size}: an MoE model "
                          "(model.num_experts set) needs the routed experts' width >= 1")
    if not 0 <= m.moe_first_dense < m.num_layers:
        raise ConfigError(f"model.moe_first_dense={m.moe_first_dense} must be in "
                          f"[0, model.num_layers={m.num_layers}) (at least one MoE layer)")


def _check_train(cfg: Config) -> None:
    t, m = cfg.train, cfg.model
    _positive({"train.steps": t.steps, "train.seq_len": t.seq_len,
               "train.micro_batch": t.micro_batch, "train.global_batch": t.global_batch})
    if t.seq_len > m.max_seq_len:
        raise ConfigError(f"train.seq_len={t.seq_len} exceeds model.max_seq_len="
                          f"{m.max_seq_len}; shorten the sequence or raise model.max_seq_len")
    if t.global_batch % t.micro_batch:
        raise ConfigError(f"train.global_batch={t.global_batch} is not a multiple of "
                          f"train.micro_batch={t.micro_batch}")
    if not 0 <= t.seed < MAX_SEED:
        raise ConfigError(f"train.seed={t.seed} must be in [0, 2**31)")
    vs = cfg.data.valid_seed
    if vs is not None and not 0 <= vs < MAX_SEED:
        raise ConfigError(f"data.valid_seed={vs} must be in [0, 2**31), or null (train.seed's)")
    if t.eval_interval < 0:
        raise ConfigError(f"train.eval_interval={t.eval_interval} must be >= 0 (0: never)")
    if t.eval_interval and t.eval_iters < 1:
        raise ConfigError(f"train.eval_iters={t.eval_iters} with train.eval_interval="
                          f"{t.eval_interval}: evaluate at least 1 batch, or set "
                          "train.eval_interval=0")
    if t.eval_interval and _held_out_share(cfg.data.split) == 0:
        raise ConfigError(f"train.eval_interval={t.eval_interval} evaluates on data.split's "
                          f"second part, which is 0 in data.split={cfg.data.split!r}: hold some "
                          "out (e.g. data.split=98,2,0), or set train.eval_interval=0")
    _one_of("train.device", t.device, DEVICES)
    _one_of("train.dtype", t.dtype, DTYPES)


def _held_out_share(split: str) -> float | None:
    """The validation weight of a Megatron split string ("98,2,0" or "98/2/0"); None where it
    does not parse (Megatron's own parser says why, at the start of the run)."""
    parts = str(split).replace("/", ",").split(",")
    try:
        return float(parts[1]) if len(parts) > 1 else 0.0
    except ValueError:
        return None


def _check_optim(cfg: Config) -> None:
    o = cfg.optim
    if not o.lr > 0:
        raise ConfigError(f"optim.lr={o.lr} must be > 0")
    if not 0 <= o.min_lr <= o.lr:
        raise ConfigError(f"optim.min_lr={o.min_lr} must be in [0, optim.lr={o.lr}]")
    if o.warmup_steps < 0:
        raise ConfigError(f"optim.warmup_steps={o.warmup_steps} must be >= 0")
    if o.weight_decay < 0:
        raise ConfigError(f"optim.weight_decay={o.weight_decay} must be >= 0")
    for key in ("beta1", "beta2"):
        if not 0 <= getattr(o, key) < 1:
            raise ConfigError(f"optim.{key}={getattr(o, key)} must be in [0, 1)")
    if not o.eps > 0:
        raise ConfigError(f"optim.eps={o.eps} must be > 0")
    if o.clip_grad < 0:
        raise ConfigError(f"optim.clip_grad={o.clip_grad} must be >= 0 (0: no clipping)")
    try:  # the LR schedule's own keys (decay style, WSD, ...)
        check_schedule(cfg)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _check_logging(cfg: Config) -> None:
    lg, w = cfg.logging, cfg.logging.wandb
    _positive({"logging.log_interval": lg.log_interval,
               "logging.print_interval": lg.print_interval})
    _one_of("logging.progress", lg.progress, PROGRESS)
    _one_of("logging.wandb.mode", w.mode, WANDB_MODES)
    if lg.peak_tflops is not None and not (math.isfinite(lg.peak_tflops) and lg.peak_tflops > 0):
        raise ConfigError(f"logging.peak_tflops={lg.peak_tflops}: give the GPU's dense BF16 "
                          "peak in TFLOP/s (e.g. 989 for an H100 SXM), or null for the table's")
    if w.diagnostics_interval < 0:
        raise ConfigError(f"logging.wandb.diagnostics_interval={w.diagnostics_interval} must "
                          "be >= 0 (0: never)")
    n = cfg.model.num_layers
    outside = [i for i in w.diagnostics_layers if not 0 <= i < n]
    if outside or (w.diagnostics_interval and not w.diagnostics_layers):
        raise ConfigError(f"logging.wandb.diagnostics_layers={list(w.diagnostics_layers)}: "
                          f"give layer indices in [0, {n}) (model.num_layers={n})")


def _check_precision(cfg: Config) -> None:
    from .precision import check_bf16_layers, recipe_from_config

    try:
        recipe_from_config(cfg.precision)
        check_bf16_layers(cfg.precision, cfg.model.num_layers)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _check_transformer_impl(cfg: Config) -> None:
    try:  # what the TransformerEngine route refuses (train/te_route.py)
        check_te_route(cfg)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _check_layout(cfg: Config) -> None:
    """The model must split evenly over tp, pp and ep (Megatron asserts deep inside otherwise)."""
    p, m, t = cfg.parallel, cfg.model, cfg.train
    _positive({"parallel.tp": p.tp, "parallel.pp": p.pp, "parallel.ep": p.ep})
    if p.dp is not None:
        _positive({"parallel.dp": p.dp})
    _one_of("parallel.backend", p.backend, BACKENDS)
    if p.sp and p.tp == 1:
        raise ConfigError("parallel.sp=true needs parallel.tp > 1 (sequence parallelism splits "
                          "activations over the tensor-parallel ranks)")
    split_by_tp = {"model.num_attention_heads": m.num_attention_heads,
                   "model.ffn_hidden_size": m.ffn_hidden_size, "model.vocab_size": m.vocab_size}
    if m.num_experts is not None:
        split_by_tp["model.moe_ffn_hidden_size"] = m.moe_ffn_hidden_size
        if m.moe_shared_expert_size:
            split_by_tp["model.moe_shared_expert_size"] = m.moe_shared_expert_size
    if p.sp:
        split_by_tp["train.seq_len"] = t.seq_len
    for key, value in split_by_tp.items():
        if value % p.tp:
            raise ConfigError(f"parallel.tp={p.tp} does not divide {key}={value}; use a tp "
                              f"that divides it (e.g. {_largest_divisor(value, p.tp)})")
    if m.num_query_groups % p.tp and p.tp % m.num_query_groups:
        raise ConfigError(f"parallel.tp={p.tp} and model.num_query_groups={m.num_query_groups}:"
                          " one must divide the other (Megatron splits or replicates the "
                          "key/value heads over the tensor-parallel ranks)")
    if m.num_layers % p.pp:
        raise ConfigError(f"parallel.pp={p.pp} does not divide model.num_layers={m.num_layers}; "
                          f"use a pp that divides it (e.g. {_largest_divisor(m.num_layers, p.pp)})")
    if p.ep > 1 and m.num_experts is None:
        raise ConfigError(f"parallel.ep={p.ep} needs an MoE model (model.num_experts is null); "
                          "use parallel.ep=1")
    if m.num_experts is not None and m.num_experts % p.ep:
        raise ConfigError(f"parallel.ep={p.ep} does not divide model.num_experts="
                          f"{m.num_experts}; use an ep that divides it "
                          f"(e.g. {_largest_divisor(m.num_experts, p.ep)})")


def _check_world(cfg: Config, world_size: int) -> None:
    """The processes must split into the layout: tp*pp model ranks, ep among the replicas."""
    p, t = cfg.parallel, cfg.train
    if world_size % (p.tp * p.pp):
        raise ConfigError(f"{world_size} processes do not divide into parallel.tp * parallel.pp"
                          f" = {p.tp} * {p.pp}; launch a multiple of {p.tp * p.pp} processes "
                          "or change the parallel sizes")
    dp = world_size // (p.tp * p.pp)
    if p.dp is not None and p.dp != dp:
        raise ConfigError(f"parallel.dp={p.dp} but {world_size} processes / (tp * pp) give "
                          f"dp={dp}; set parallel.dp=null or launch "
                          f"{p.dp * p.tp * p.pp} processes")
    if dp % p.ep:
        raise ConfigError(f"parallel.ep={p.ep} does not divide the data-parallel size {dp} "
                          f"(experts are spread over replicas); launch "
                          f"{p.tp * p.pp * p.ep * dp // gcd(dp, p.ep)} processes or lower "
                          "parallel.ep")
    if t.global_batch % (t.micro_batch * dp):
        raise ConfigError(f"train.global_batch={t.global_batch} must be a multiple of "
                          f"train.micro_batch * data-parallel size = {t.micro_batch} * {dp}")


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)

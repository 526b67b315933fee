"""Every check of a training config that can fail before anything is built or written.

    checked_config(dcfg, world_size)     the composed DictConfig -> a typed Config, after all
                                         of the checks below (what the trainer runs first)
    check_config(cfg, world_size=None)   the config alone: values in range, a parallel layout
                                         the model divides into (and, given a world size, one
                                         the processes divide into); `describe` uses it too
    check_machine(cfg)                   what this machine must offer (train/runtime.py: a
                                         GPU for train.device=cuda or pipeline parallelism,
                                         none for train.device=cpu, CUDA for nccl)
    check_fits(cfg, world_size)          the model's state fits this device's memory

Each failure is a ConfigError whose message is one line naming the key, its value and what to
change; `python -m ufp4_megatron.train` prints it as `error: <message>` and exits 2. The
schema (train/schema.py) already refused unknown keys and wrong types; these are the values
a type cannot rule out, which otherwise end in a ZeroDivisionError, a SIGFPE, a NaN loss that
exits 0, or an assertion deep inside Megatron. Each numeric option's own range is declared in
train/ranges.py and checked first; what is here relates options to each other.
"""

from __future__ import annotations

import os
import re
from math import gcd

from .logs import tensorboard_log
from .optim import check_schedule
from .ranges import check_ranges
from .runtime import BACKENDS, DEVICES, DTYPES, decide
from .schema import Config
from .te_route import check_config as check_te_route
from .te_route import check_installed

PROGRESS = ("auto", "bar", "plain")
WANDB_MODES = ("auto", "offline", "online", "disabled")
# megatron/attention.py's BACKENDS and KERNELS (importing it here would load Megatron-Core;
# tests/megatron/test_attention.py keeps the two equal)
ATTENTION_BACKENDS = ("sdpa", "te", "megatron")
SDPA_KERNELS = ("flash", "cudnn", "efficient", "math")
# data.split: up to three weights (train, valid, test), as Megatron reads them
_SPLIT = re.compile(r"\s*\d+(\.\d*)?\s*([,/]\s*\d+(\.\d*)?\s*){0,2}")


class ConfigError(ValueError):
    """A config the trainer refuses; str(e) is one line saying what to change."""


def typed_config(dcfg) -> Config:
    """The composed DictConfig as the schema's dataclasses; a mandatory value left unset (a
    group removed with `~precision`, a key of a user's YAML missing) is a ConfigError."""
    from omegaconf import OmegaConf

    from .overrides import missing_problem

    if problem := missing_problem(dcfg):
        raise ConfigError(problem)
    return OmegaConf.to_object(dcfg)


def checked_config(dcfg, world_size: int | None = None) -> Config:
    """typed_config, check_config and check_machine: everything the trainer checks before it
    writes anything (train/__main__.py)."""
    cfg = typed_config(dcfg)
    check_config(cfg, world_size=world_size)
    check_machine(cfg)
    check_fits(cfg, world_size)
    return cfg


def check_config(cfg: Config, world_size: int | None = None) -> None:
    """Raises ConfigError for the first problem found (in the order of the groups below).

    world_size: the number of processes (torchrun's WORLD_SIZE); None: the one parallel.dp
    implies, or no world checks when that is null too."""
    try:
        check_ranges(cfg)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    _check_model(cfg)
    _check_train(cfg)
    _check_optim(cfg)
    _check_data(cfg)
    _check_logging(cfg)
    _check_precision(cfg)
    _check_layout(cfg)
    _check_transformer_impl(cfg)
    _check_deterministic(cfg)
    p = cfg.parallel
    if world_size is None and p.dp is not None:  # describe: the world the layout names
        world_size = p.tp * p.pp * p.dp
    if world_size is not None:
        _check_world(cfg, world_size)


def check_machine(cfg: Config) -> None:
    """The checks that depend on this machine, not on the config alone: what the runtime
    decision (train/runtime.py) refuses here, the environment's UFP4_CACHED_LAUNCH
    (kernels/launch.py reads it when the kernels are first imported, deep in a GPU run: here
    a wrong value stops the start in one line instead) and, with train.deterministic, its
    determinism variables."""
    launch = os.environ.get("UFP4_CACHED_LAUNCH")
    if launch not in (None, "0", "1"):
        raise ConfigError(
            f"UFP4_CACHED_LAUNCH={launch!r}: give 1 (cached kernel launches, the "
            "default) or 0 (Triton's own launch path for every call), or unset it"
        )
    try:
        decide(cfg)
        if cfg.model.transformer_impl == "transformer_engine":
            check_installed()
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if cfg.logging.tensorboard and (problem := tensorboard_log.problem()):
        raise ConfigError(problem)
    if cfg.train.deterministic:
        from .determinism import environment_problem

        if problem := environment_problem(os.environ):
            raise ConfigError(problem)


def _one_of(key: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ConfigError(f"{key}={value!r}; valid: {', '.join(valid)}")


def _check_model(cfg: Config) -> None:
    m = cfg.model
    if m.num_attention_heads % m.num_query_groups:
        raise ConfigError(
            f"model.num_query_groups={m.num_query_groups} must divide "
            f"model.num_attention_heads={m.num_attention_heads} (each key/value "
            "head serves a whole number of query heads)"
        )
    if m.kv_channels is None and m.hidden_size % m.num_attention_heads:
        raise ConfigError(
            f"model.hidden_size={m.hidden_size} is not a multiple of "
            f"model.num_attention_heads={m.num_attention_heads}; change one, or "
            "set model.kv_channels (the head dim)"
        )
    head_dim = m.kv_channels or m.hidden_size // m.num_attention_heads
    if head_dim % 2:
        key = (
            "model.kv_channels"
            if m.kv_channels is not None
            else f"the head dim model.hidden_size / model.num_attention_heads = {m.hidden_size} "
            f"/ {m.num_attention_heads}"
        )
        raise ConfigError(
            f"{key}={head_dim} is odd: RoPE rotates pairs of channels, so the "
            f"head dim must be even (e.g. model.kv_channels={head_dim + 1})"
        )
    _one_of("model.attention_backend", m.attention_backend, ATTENTION_BACKENDS)
    if m.sdpa_kernels is not None:
        unknown = [k for k in m.sdpa_kernels if k not in SDPA_KERNELS]
        if unknown or not m.sdpa_kernels:
            raise ConfigError(
                f"model.sdpa_kernels={list(m.sdpa_kernels)}: give SDPA kernels "
                f"from {', '.join(SDPA_KERNELS)} in priority order, or null "
                "(PyTorch's choice)"
            )
        if m.attention_backend != "sdpa":
            raise ConfigError(
                f"model.sdpa_kernels={list(m.sdpa_kernels)} applies to "
                f"model.attention_backend=sdpa, not {m.attention_backend}; set "
                "model.sdpa_kernels=null"
            )
    if m.num_experts is None:
        return
    if m.moe_router_topk > m.num_experts:
        raise ConfigError(
            f"model.moe_router_topk={m.moe_router_topk} must be between 1 and "
            f"model.num_experts={m.num_experts}"
        )
    if m.moe_ffn_hidden_size is None:
        raise ConfigError(
            f"model.moe_ffn_hidden_size={m.moe_ffn_hidden_size}: an MoE model "
            "(model.num_experts set) needs the routed experts' width >= 1"
        )
    if m.moe_first_dense >= m.num_layers:
        raise ConfigError(
            f"model.moe_first_dense={m.moe_first_dense} must be in "
            f"[0, model.num_layers={m.num_layers}) (at least one MoE layer)"
        )


def _check_train(cfg: Config) -> None:
    t, m = cfg.train, cfg.model
    if t.seq_len > m.max_seq_len:
        raise ConfigError(
            f"train.seq_len={t.seq_len} exceeds model.max_seq_len="
            f"{m.max_seq_len}; shorten the sequence or raise model.max_seq_len"
        )
    if t.global_batch % t.micro_batch:
        raise ConfigError(
            f"train.global_batch={t.global_batch} is not a multiple of "
            f"train.micro_batch={t.micro_batch}"
        )
    if t.eval_interval and t.eval_iters < 1:
        raise ConfigError(
            f"train.eval_iters={t.eval_iters} with train.eval_interval="
            f"{t.eval_interval}: evaluate at least 1 batch, or set "
            "train.eval_interval=0"
        )
    _one_of("train.device", t.device, DEVICES)
    _one_of("train.dtype", t.dtype, DTYPES)


def _check_optim(cfg: Config) -> None:
    try:  # the LR schedule's own keys (decay style, min_lr <= lr, WSD, ...)
        check_schedule(cfg)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _check_data(cfg: Config) -> None:
    """What the data group says, before any file is read or written (data/datasets.py checks
    the files themselves at the start of the loop)."""
    from ..data.bpe import MIN_VOCAB
    from ..data.tokenizers import TOKENIZER_TYPES

    d, t = cfg.data, cfg.train
    _one_of("data.tokenizer.type", d.tokenizer.type, TOKENIZER_TYPES)
    if not _SPLIT.fullmatch(d.split):
        raise ConfigError(
            f"data.split={d.split!r}: give up to three non-negative weights "
            "train,valid,test, e.g. data.split='98,2,0'"
        )
    weights = [float(w) for w in re.split(r"[,/]", d.split)] + [0.0, 0.0]
    if weights[0] <= 0:
        raise ConfigError(
            f"data.split={d.split!r} gives the training split no data; e.g. data.split='98,2,0'"
        )
    if t.eval_interval and weights[1] <= 0:
        raise ConfigError(
            f"data.split={d.split!r} gives the validation split no data, but "
            f"train.eval_interval={t.eval_interval} evaluates on it; give it a "
            "weight (e.g. '98,2,0') or set train.eval_interval=0"
        )
    if 0 < d.corpus_bpe_vocab < MIN_VOCAB:
        raise ConfigError(
            f"data.corpus_bpe_vocab={d.corpus_bpe_vocab}: a byte-level BPE needs "
            f"at least {MIN_VOCAB} tokens (256 bytes and the EOD); 0 for bytes"
        )
    paths = {
        "data.cache_dir": d.cache_dir,
        "data.tokenizer.path": d.tokenizer.path,
        "checkpoint.dir": cfg.checkpoint.dir,
        "logging.wandb.dir": cfg.logging.wandb.dir,
    }
    for key, value in paths.items():  # "" is the current directory to pathlib
        if value is not None and not value.strip():
            null = ", or null" if key != "data.cache_dir" else ""
            raise ConfigError(
                f"{key}={value!r} is empty, which would mean the current "
                f"directory; give a path{null}"
            )
    bad = [p for p in d.prefixes if not str(p).strip()]
    if bad:
        raise ConfigError(
            f"data.prefixes={list(d.prefixes)} holds an empty prefix; give "
            "file prefixes (written by prepare_data) or [] for the embedded corpus"
        )
    if d.prefixes and d.corpus_bpe_vocab:
        raise ConfigError(
            f"data.corpus_bpe_vocab={d.corpus_bpe_vocab} trains a BPE on the "
            "embedded corpus, but data.prefixes is set: set "
            "data.corpus_bpe_vocab=0 and data.tokenizer to your data's tokenizer"
        )
    if d.corpus_bpe_vocab and (d.tokenizer.type != "huggingface" or d.tokenizer.path):
        raise ConfigError(
            f"data.corpus_bpe_vocab={d.corpus_bpe_vocab} brings its own "
            "tokenizer: leave data.tokenizer.type=huggingface and "
            "data.tokenizer.path=null (as data=embedded_bpe does)"
        )
    if not d.prefixes and not d.corpus_bpe_vocab and d.tokenizer.type != "byte-level":
        raise ConfigError(
            f"data.prefixes is empty (the embedded corpus) with "
            f"data.tokenizer.type={d.tokenizer.type}: the corpus is tokenized "
            "with bytes or its own BPE (data=embedded_bpe); for another "
            "tokenizer run prepare_data --tokenizer ... and set data.prefixes"
        )


def _check_logging(cfg: Config) -> None:
    lg, w = cfg.logging, cfg.logging.wandb
    _one_of("logging.progress", lg.progress, PROGRESS)
    _one_of("logging.wandb.mode", w.mode, WANDB_MODES)
    n = cfg.model.num_layers
    outside = [i for i in w.diagnostics_layers if not 0 <= i < n]
    if outside or (w.diagnostics_interval and not w.diagnostics_layers):
        raise ConfigError(
            f"logging.wandb.diagnostics_layers={list(w.diagnostics_layers)}: "
            f"give layer indices in [0, {n}) (model.num_layers={n})"
        )


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
    _one_of("parallel.backend", p.backend, BACKENDS)
    if p.sp and p.tp == 1:
        raise ConfigError(
            "parallel.sp=true needs parallel.tp > 1 (sequence parallelism splits "
            "activations over the tensor-parallel ranks)"
        )
    split_by_tp = {
        "model.num_attention_heads": m.num_attention_heads,
        "model.ffn_hidden_size": m.ffn_hidden_size,
        "model.vocab_size": m.vocab_size,
    }
    if m.num_experts is not None:
        split_by_tp["model.moe_ffn_hidden_size"] = m.moe_ffn_hidden_size
        if m.moe_shared_expert_size:
            split_by_tp["model.moe_shared_expert_size"] = m.moe_shared_expert_size
    if p.sp:
        split_by_tp["train.seq_len"] = t.seq_len
    for key, value in split_by_tp.items():
        if value % p.tp:
            raise ConfigError(
                f"parallel.tp={p.tp} does not divide {key}={value}; use a tp "
                f"that divides it (e.g. {_largest_divisor(value, p.tp)})"
            )
    if m.num_query_groups % p.tp and p.tp % m.num_query_groups:
        raise ConfigError(
            f"parallel.tp={p.tp} and model.num_query_groups={m.num_query_groups}:"
            " one must divide the other (Megatron splits or replicates the "
            "key/value heads over the tensor-parallel ranks)"
        )
    if m.num_layers % p.pp:
        raise ConfigError(
            f"parallel.pp={p.pp} does not divide model.num_layers={m.num_layers}; "
            f"use a pp that divides it (e.g. {_largest_divisor(m.num_layers, p.pp)})"
        )
    if p.ep > 1 and m.num_experts is None:
        raise ConfigError(
            f"parallel.ep={p.ep} needs an MoE model (model.num_experts is null); use parallel.ep=1"
        )
    if m.num_experts is not None and m.num_experts % p.ep:
        raise ConfigError(
            f"parallel.ep={p.ep} does not divide model.num_experts="
            f"{m.num_experts}; use an ep that divides it "
            f"(e.g. {_largest_divisor(m.num_experts, p.ep)})"
        )


def _check_world(cfg: Config, world_size: int) -> None:
    """The processes must split into the layout: tp*pp model ranks, ep among the replicas."""
    p, t = cfg.parallel, cfg.train
    if world_size % (p.tp * p.pp):
        raise ConfigError(
            f"{world_size} processes do not divide into parallel.tp * parallel.pp"
            f" = {p.tp} * {p.pp}; launch a multiple of {p.tp * p.pp} processes "
            "or change the parallel sizes"
        )
    dp = world_size // (p.tp * p.pp)
    if p.dp is not None and p.dp != dp:
        raise ConfigError(
            f"parallel.dp={p.dp} but {world_size} processes / (tp * pp) give "
            f"dp={dp}; set parallel.dp=null or launch "
            f"{p.dp * p.tp * p.pp} processes"
        )
    if dp % p.ep:
        raise ConfigError(
            f"parallel.ep={p.ep} does not divide the data-parallel size {dp} "
            f"(experts are spread over replicas); launch "
            f"{p.tp * p.pp * p.ep * dp // gcd(dp, p.ep)} processes or lower "
            "parallel.ep"
        )
    if t.global_batch % (t.micro_batch * dp):
        raise ConfigError(
            f"train.global_batch={t.global_batch} must be a multiple of "
            f"train.micro_batch * data-parallel size = {t.micro_batch} * {dp}"
        )


def _check_deterministic(cfg: Config) -> None:
    from .determinism import config_problem

    if problem := config_problem(cfg):
        raise ConfigError(problem)


def check_fits(cfg: Config, world_size: int | None = None) -> None:
    """The model's weights, gradients and optimizer state alone must fit the device: a size
    option set far too large (model.hidden_size=1000000) otherwise ends in an allocator
    traceback or the kernel's OOM killer, after the run dir is written."""
    from dataclasses import replace

    import torch

    from .footprint import memory_estimate, with_smallest_dp

    p = cfg.parallel
    if world_size is not None and p.dp is None:  # the optimizer state is shared over dp
        cfg = replace(cfg, parallel=replace(p, dp=max(1, world_size // (p.tp * p.pp))))
    est = memory_estimate(with_smallest_dp(cfg))
    need = est["weights_gib"] + est["grads_gib"] + est["optimizer_gib"]
    on_gpu = decide(cfg).on_gpu
    if on_gpu:
        local = int(os.environ.get("LOCAL_RANK", 0))
        total = torch.cuda.get_device_properties(local).total_memory / 2**30
        where = f"this GPU's {total:.0f} GiB"
    else:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        where = f"this machine's {total:.0f} GiB of memory"
    if need > total:
        raise ConfigError(
            f"model={cfg.model.name} needs about {need:,.0f} GiB per "
            f"{'GPU' if on_gpu else 'process'} for its weights, gradients and "
            f"optimizer state alone (train/footprint.py), more than {where}: "
            "check the model's sizes, or spread it with parallel.tp/pp/ep"
        )


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)

"""A training config's size without building it: parameter counts (total, active per token,
embedding) and a per-GPU memory estimate for its parallel layout; `load_config` composes the
config exactly as the trainer does. `ufp4-describe` (cli/describe.py) prints them; the step
benchmark (bench/step.py) takes its FLOPs from them. Counts follow Megatron-Core's GPT with
the local spec (RMSNorm, SwiGLU, GQA, no biases); tests check them against a built model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .schema import Config, ModelConfig


@dataclass(frozen=True)
class ParamCounts:
    total: int
    active: int
    embedding: int  # input embedding + output head
    dense_per_rank_share: int  # non-expert params (split by tp * pp)
    expert: int  # routed-expert params (split by ep * tp * pp)


def count_params(m: ModelConfig) -> ParamCounts:
    h = m.hidden_size
    d = m.kv_channels or h // m.num_attention_heads
    attn = h * d * (m.num_attention_heads + 2 * m.num_query_groups) + m.num_attention_heads * d * h
    norms = 2 * h
    dense_mlp = 3 * h * m.ffn_hidden_size  # SwiGLU: fc1 is h -> 2 * ffn, fc2 ffn -> h
    embedding = m.vocab_size * h * (2 if m.untie_embeddings else 1)
    total = active = embedding + h + m.num_layers * (attn + norms)  # + final norm
    expert = 0
    if m.num_experts is None:
        total += m.num_layers * dense_mlp
        active = total
    else:
        n_moe = m.num_layers - m.moe_first_dense
        routed = 3 * h * m.moe_ffn_hidden_size
        shared = 3 * h * (m.moe_shared_expert_size or 0)
        router = h * m.num_experts
        dense_part = m.moe_first_dense * dense_mlp + n_moe * (shared + router)
        expert = n_moe * m.num_experts * routed
        total += dense_part + expert
        active += dense_part + n_moe * m.moe_router_topk * routed
    return ParamCounts(
        total=total,
        active=active,
        embedding=embedding,
        dense_per_rank_share=total - expert,
        expert=expert,
    )


def memory_estimate(cfg: Config) -> dict[str, float]:
    """GiB per GPU: weights, grads, optimizer state and activations (1F1B, no recompute).

    BF16 weights (2 B) + FP32 main grads (4 B) + FP32 master weights and Adam moments (12 B,
    divided by dp with the distributed optimizer). Activations follow Korthikanti et al. 2022:
    s*b*h*(34 + 5*a*s/h) bytes per layer, / tp with sequence parallelism, times the pp
    micro-batches the first stage holds. An estimate, not a measurement: the 4-bit recipes'
    quantized copies and allocator slack are not included.
    """
    m, p, t = cfg.model, cfg.parallel, cfg.train
    c = count_params(m)
    params = c.dense_per_rank_share / (p.tp * p.pp) + c.expert / (p.ep * p.tp * p.pp)
    dp = p.dp or 1
    opt_bytes = 12 / dp if p.distributed_optimizer else 12
    gib = 2**30
    s, b, h, a = t.seq_len, t.micro_batch, m.hidden_size, m.num_attention_heads
    per_layer = s * b * h * (34 + 5 * a * s / h) / (p.tp if p.sp or p.tp == 1 else 1)
    layers_per_stage = m.num_layers / p.pp
    act = per_layer * layers_per_stage * p.pp  # first stage keeps pp micro-batches in flight
    out = {
        "weights_gib": params * 2 / gib,
        "grads_gib": params * 4 / gib,
        "optimizer_gib": params * opt_bytes / gib,
        "activations_gib": act / gib,
    }
    out["total_gib"] = sum(out.values())
    return out


def quantized_linears(cfg: Config) -> list[tuple[int, int, float, bool]]:
    """(K, N, tokens it sees per token of the batch, routed expert) of each linear the recipe
    quantizes, for one model replica (tp = pp = ep = 1): every transformer layer's attention,
    MLP, shared-expert and routed-expert linears (not the router, embeddings or head) outside
    the layers kept in BF16; none for a recipe that quantizes nothing. A routed expert sees
    top-k / experts of the tokens, times the capacity factor when its input is padded."""
    from .precision import recipe_from_config

    if not recipe_from_config(cfg.precision).quantized:
        return []
    m = cfg.model
    h = m.hidden_size
    d = m.kv_channels or h // m.num_attention_heads
    attn = [
        (h, d * (m.num_attention_heads + 2 * m.num_query_groups)),
        (m.num_attention_heads * d, h),
    ]
    bf16 = cfg.precision.bf16_layers
    out = []
    for i in range(bf16.start, m.num_layers - bf16.end):
        out += [(k, n, 1.0, False) for k, n in attn]
        if m.num_experts is None or i < m.moe_first_dense:  # SwiGLU: fc1 is h -> 2 * ffn
            out += [(h, 2 * m.ffn_hidden_size, 1.0, False), (m.ffn_hidden_size, h, 1.0, False)]
            continue
        if m.moe_shared_expert_size:
            s = m.moe_shared_expert_size
            out += [(h, 2 * s, 1.0, False), (s, h, 1.0, False)]
        share = m.moe_router_topk / m.num_experts * (m.moe_capacity_factor or 1.0)
        f = m.moe_ffn_hidden_size
        out += [(h, 2 * f, share, True), (f, h, share, True)] * m.num_experts
    return out


def quantized_weights(cfg: Config, copies=lambda k, n: 1) -> tuple[float, float]:
    """(dense, routed-expert) weight elements per GPU of the linears the recipe quantizes
    (quantized_linears), each weight [n, k] counted copies(k, n) times; (0, 0) for a recipe
    that quantizes nothing."""
    p = cfg.parallel
    dense = expert = 0
    for k, n, _, routed in quantized_linears(cfg):
        if routed:
            expert += k * n * copies(k, n)
        else:
            dense += k * n * copies(k, n)
    return dense / (p.tp * p.pp), expert / (p.ep * p.tp * p.pp)


def weight_cache_gib(cfg: Config, which: str, element_bytes: int = 2) -> float:
    """GiB per GPU of the weight cache (ufp4_megatron/quant/weight_cache.py) for `which` linears
    ("all", "experts", "none"): two quantized copies (fprop's and dgrad's layouts) of each
    cached weight, element_bytes each (bf16 runs: 2), or one where the two are one tensor
    (quant.ops.shares_weight_operand: NVFP4's 16x16 tiles; judged on the full weight)."""
    import torch

    from ..quant.ops import shares_weight_operand
    from .precision import recipe_from_config

    if which not in ("all", "experts", "none"):
        raise ValueError(f"weight cache {which!r}; valid: all, experts, none")
    recipe = recipe_from_config(cfg.precision)
    dense, expert = quantized_weights(
        cfg, lambda k, n: 1 if shares_weight_operand(recipe, n, k, torch.bfloat16) else 2
    )
    elements = {"all": dense + expert, "experts": expert, "none": 0.0}[which]
    return element_bytes * elements / 2**30


def with_smallest_dp(cfg: Config) -> Config:
    """parallel.dp=null means "whatever the world gives": describe the smallest world the
    layout fits in, dp = ep (the experts are spread over the data-parallel replicas)."""
    if cfg.parallel.dp is not None:
        return cfg
    return replace(cfg, parallel=replace(cfg.parallel, dp=cfg.parallel.ep))


def describe(cfg: Config) -> str:
    cfg = with_smallest_dp(cfg)
    c = count_params(cfg.model)
    mem = memory_estimate(cfg)
    p = cfg.parallel
    lines = [
        f"model: {cfg.model.name}",
        f"total_params: {c.total}",
        f"active_params: {c.active}",
        f"embedding_params: {c.embedding}",
        f"layout: tp={p.tp} pp={p.pp} ep={p.ep} dp={p.dp} sp={p.sp} "
        f"distributed_optimizer={p.distributed_optimizer} seq_len={cfg.train.seq_len} "
        f"micro_batch={cfg.train.micro_batch}",
    ]
    lines += [f"per_gpu_{k}: {v:.2f}" for k, v in mem.items()]
    # the weight cache is beside the estimate above: what each train.weight_cache setting
    # adds (auto picks the largest that fits the device, train/graphs.py)
    lines.append(
        "per_gpu_weight_cache_gib: "
        + " ".join(f"{which}={weight_cache_gib(cfg, which):.2f}" for which in ("all", "experts"))
        + f" (train.weight_cache={cfg.train.weight_cache})"
    )
    return "\n".join(lines)


def load_config(overrides: list[str], config_dir: str | None = None) -> Config:
    """The training config composed exactly as `python -m ufp4_megatron.train` would
    (`config_dir`: the trainer's --config-dir, a user's own config groups)."""
    from omegaconf import OmegaConf

    from .overrides import compose_training, training_configs

    with training_configs():
        return OmegaConf.to_object(compose_training(overrides, config_dir))

"""ModelConfig -> Megatron-Core TransformerConfig and a GPTModel with the plugin's layer spec."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..megatron.policy import UFP4Policy
from ..quant.recipe import Recipe
from . import graphs, te_route
from .schema import Config


def transformer_config(
    cfg: Config, dtype: torch.dtype, device: torch.device, recipe: Recipe | None = None
):
    """recipe: the run's, for model.transformer_impl=transformer_engine (TE's FP4 fields)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    m, p, bf16 = cfg.model, cfg.parallel, cfg.precision.bf16_layers
    on_gpu = device.type == "cuda"
    moe = {}
    if m.num_experts is not None:
        pattern = [0] * m.moe_first_dense + [1] * (m.num_layers - m.moe_first_dense)
        moe = dict(
            num_moe_experts=m.num_experts,
            moe_router_topk=m.moe_router_topk,
            moe_ffn_hidden_size=m.moe_ffn_hidden_size,
            moe_shared_expert_intermediate_size=m.moe_shared_expert_size,
            moe_layer_freq=pattern,
            moe_aux_loss_coeff=m.moe_aux_loss_coeff,
            moe_router_load_balancing_type="aux_loss",
            # all experts' GEMMs at once (grouped_ops), for every recipe
            moe_grouped_gemm=m.moe_grouped_gemm,
            # alltoall's split sizes stay tensors on gloo; allgather runs everywhere
            moe_token_dispatcher_type="alltoall" if on_gpu else "allgather",
        )
    # the TE route: Megatron's FP4 path with the recipe's TE quantizer factory (te_route.py)
    te = te_route.config_fields(recipe) if m.transformer_impl == te_route.TE else {}
    return TransformerConfig(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups,
        kv_channels=m.kv_channels,
        init_method_std=m.init_std,
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=p.tp,
        pipeline_model_parallel_size=p.pp,
        expert_model_parallel_size=p.ep,
        sequence_parallel=p.sp,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        pipeline_dtype=dtype,
        # CPU init draws each full weight from one generator, then splits it: the same
        # weights for every TP layout (what layout-invariance checks need); slower on GPU
        use_cpu_initialization=(not on_gpu) if m.cpu_init is None else m.cpu_init,
        # Megatron's BF16 first/last layers, which the plugin's policy honours
        first_last_layers_bf16=bf16.start + bf16.end > 0,
        num_layers_at_start_in_bf16=bf16.start,
        num_layers_at_end_in_bf16=bf16.end,
        # the fused kernels need apex/TE or CUDA extensions this package does not install
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        # the loss over the logits in fewer passes (unfused: an estimated ~12 ms of the BF16
        # small step's ~60 ms of kernels, fp32 passes over its logits; docs/performance.md)
        cross_entropy_loss_fusion=m.cross_entropy_fusion,
        cross_entropy_fusion_impl="native",
        # train.deterministic: Megatron's deterministic code paths (train/determinism.py)
        deterministic_mode=cfg.train.deterministic,
        **moe,
        **te,
        **graphs.megatron_config(cfg),
    )


def block_spec(
    config,
    policy: UFP4Policy,
    *,
    attention_backend: str = "sdpa",
    sdpa_kernels=None,
    pp_rank: int | None = None,
    transformer_impl: str = "local",
):
    """Megatron's local GPT spec (dense, or per-layer dense/MoE) with the core attention of
    `attention_backend` (megatron/attention.py; the same for every recipe), rewritten by the
    plugin: UFP4 linears where the policy quantizes, Megatron's own classes elsewhere. With
    transformer_impl="transformer_engine": Megatron's TE spec with that core attention, not
    rewritten (TE quantizes through the config's FP4 recipe: train/te_route.py).
    pp_rank: None for this rank's pipeline stage (needs Megatron's parallel state)."""
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_layer_local_spec,
    )

    from ..megatron.attention import core_attention_spec, with_core_attention
    from ..megatron.spec import ufp4_block_spec

    if transformer_impl == te_route.TE:
        return with_core_attention(
            te_route.te_spec(config, pp_rank=pp_rank),
            core_attention_spec(attention_backend, tuple(sdpa_kernels) if sdpa_kernels else None),
        )
    if config.num_moe_experts:
        base = get_gpt_decoder_block_spec(
            config, use_transformer_engine=False, normalization="RMSNorm", pp_rank=pp_rank
        )
    else:
        base = get_gpt_layer_local_spec(normalization="RMSNorm")
    if attention_backend != "megatron":
        base = with_core_attention(
            base,
            core_attention_spec(attention_backend, tuple(sdpa_kernels) if sdpa_kernels else None),
        )
    return ufp4_block_spec(base, config, policy, pp_rank=pp_rank)


def needs_attention_mask(cfg: Config) -> bool:
    """Only Megatron's unfused attention reads a materialised [b, 1, s, s] mask: the fused
    backends are causal by construction, so the data path builds none for them."""
    return cfg.model.attention_backend == "megatron"


def build_model(
    cfg: Config,
    recipe: Recipe,
    dtype: torch.dtype,
    device: torch.device,
    *,
    weight_cache: str | None = None,
):
    """(GPTModel, policy); the policy owns the SR-seed stream that checkpoints must save.
    weight_cache: which linears keep their weight operands per step (Runtime.weight_cache;
    None: UFP4Policy's default)."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    m = cfg.model
    if cfg.train.seq_len > m.max_seq_len:
        raise ValueError(
            f"train.seq_len={cfg.train.seq_len} exceeds model.max_seq_len={m.max_seq_len}"
        )
    config = transformer_config(cfg, dtype, device, recipe)
    policy = UFP4Policy(
        recipe,
        sr_seed=cfg.train.seed,
        **({} if weight_cache is None else {"weight_cache": weight_cache}),
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=block_spec(
            config,
            policy,
            attention_backend=m.attention_backend,
            sdpa_kernels=m.sdpa_kernels,
            transformer_impl=m.transformer_impl,
        ),
        vocab_size=m.vocab_size,
        max_sequence_length=m.max_seq_len,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=not m.untie_embeddings,
        position_embedding_type="rope",
        rotary_base=m.rotary_base,
    )
    # Every parameter in the run's dtype, as Megatron-LM's Float16Module casts a --bf16 model:
    # Megatron builds its torch norms in fp32, and its non-distributed Float16Optimizer can
    # checkpoint only float16 parameters (an fp32 norm weight fails its sharded_state_dict).
    return model.to(device=device, dtype=dtype), policy

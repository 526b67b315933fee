"""Layer-spec rewrite: Megatron's GPT spec with UFP4 linears, one spec per layer.

    block = ufp4_block_spec(get_gpt_layer_local_spec(...), config, policy)   # library API
    GPTModel(config, transformer_layer_spec=block, ...)

    --spec ufp4_megatron.megatron.spec ufp4_gpt_spec                          # Megatron-LM

The rewrite walks the spec (ModuleSpecs, `partial` builders, submodule dataclasses) and swaps,
by field name, each linear that the policy quantizes:
    ColumnParallelLinear -> UFP4ColumnParallelLinear   linear_qkv, linear_fc1, MLA up/q projs
    RowParallelLinear    -> UFP4RowParallelLinear      linear_proj, linear_fc2
    SequentialMLP        -> UFP4SequentialMLP, or with config.moe_grouped_gemm Megatron's
                            TEGroupedMLP with grouped fc1/fc2 (routed experts; every
                            recipe, BF16 too: one grouped GEMM for all experts)
and, given `te=te_modules()`, the TransformerEngine modules of a TE spec (te_spec.py: fused
norm+linear modules are split into TE's norm + UFP4 linear, with the checkpoint keys kept).
Shared experts are MLPs and are swapped like dense MLPs. Layers get their own spec because
each binding carries its global layer number (SR seeds, BF16 first/last layers). Untouched:
embeddings, LM head (a ColumnParallelLinear outside the block), norms, core attention, router,
MTP layers (GPTModelBuilder builds them from Megatron's own spec) and MLA's down projections
(MLA checks their class by identity; they stay BF16). With sequence parallelism, torch norms
are built SP-aware (norms.py).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any

from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_decoder_block_spec,
    get_gpt_layer_local_spec,
)
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.moe.experts import GroupedMLPSubmodules, SequentialMLP, TEGroupedMLP
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_block import (
    LayerNormImpl,
    TransformerBlockSubmodules,
    get_num_layers_to_build,
)
from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

from ..quant.recipe import Recipe, get_recipe
from .experts import (
    UFP4ColumnParallelGroupedLinear,
    UFP4RowParallelGroupedLinear,
    UFP4SequentialMLP,
)
from .linear import UFP4ColumnParallelLinear, UFP4RowParallelLinear
from .norms import sequence_parallel_torch_norm
from .policy import UFP4Binding, UFP4Policy
from .te_spec import TEModules, place_norms, te_modules

_LOCAL_KIND = {ColumnParallelLinear: "column", RowParallelLinear: "row"}
_UFP4_CLASS = {"column": UFP4ColumnParallelLinear, "row": UFP4RowParallelLinear}
# MLA selects kwargs by `submodules.linear_*_down_proj in [ColumnParallelLinear, ...]`; its
# down projections (fused or not) stay in Megatron's classes.
_KEPT_BF16 = {"linear_q_down_proj", "linear_kv_down_proj", "linear_qkv_down_proj"}
_SP_NORMS = {"input_layernorm", "pre_mlp_layernorm", "pre_cross_attn_layernorm"}


def ufp4_block_spec(
    spec: ModuleSpec | TransformerBlockSubmodules,
    config,
    policy: UFP4Policy,
    *,
    vp_stage: int | None = None,
    pp_rank: int | None = None,
    te: TEModules | None = None,
) -> TransformerBlockSubmodules:
    """This pipeline stage's block spec with UFP4 linears where `policy` quantizes.

    spec: a layer spec (e.g. get_gpt_layer_local_spec(...)), repeated over this stage's
          layers, or a block spec whose layer_specs are already this stage's (as
          get_gpt_decoder_block_spec returns, e.g. for MoE with moe_layer_freq).
    te:   for a TransformerEngine spec, its TE classes (te_spec.te_modules()).
    """
    if isinstance(spec, TransformerBlockSubmodules):
        layer_specs, layer_norm = list(spec.layer_specs), spec.layer_norm
    elif isinstance(spec, ModuleSpec):
        layer_specs = [spec] * get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=pp_rank)
        layer_norm = LayerNormImpl
    else:
        raise TypeError(
            f"expected a layer ModuleSpec or TransformerBlockSubmodules, got {type(spec).__name__}"
        )
    offset = get_transformer_layer_offset(config, vp_stage=vp_stage, pp_rank=pp_rank)
    rewritten = []
    for i, layer_spec in enumerate(layer_specs):
        number = offset + i + 1  # Megatron's global, 1-based layer number
        ctx = _Ctx(policy, config, number, f"decoder.layers.{number - 1}", [], te, [])
        layer = _rewrite(layer_spec, ctx, path="")
        if ctx.unfused:
            layer = place_norms(layer, ctx.unfused, te)
        rewritten.append(layer)
        if not ctx.seen:
            raise TypeError(
                f"layer {number}: no ColumnParallelLinear/RowParallelLinear/SequentialMLP in its "
                "spec. ufp4_block_spec rewrites Megatron's local spec (get_gpt_layer_local_spec,"
                " get_gpt_decoder_block_spec(..., use_transformer_engine=False)), or a "
                "TransformerEngine spec given te=te_modules()."
                + ("" if te is None else " This spec has none of the TE classes either.")
            )
    if config.sequence_parallel and layer_norm is WrappedTorchNorm:
        layer_norm = sequence_parallel_torch_norm
    return TransformerBlockSubmodules(layer_specs=rewritten, layer_norm=layer_norm)


def ufp4_gpt_spec(
    config, vp_stage: int | None = None, *rest, recipe: Recipe | None = None
) -> TransformerBlockSubmodules:
    """Megatron-LM entry point: `--spec ufp4_megatron.megatron.spec ufp4_gpt_spec`.

    Megatron-LM's GPTModelBuilder (what pretrain_gpt.py uses) calls it with its GPTModelConfig:
    the spec is then Megatron-LM's own default spec for that config (`default_layer_spec`:
    local or TransformerEngine by --transformer-impl, dense or MoE, MLA, qk-layernorm, ...)
    with UFP4 linears. Called with a TransformerConfig (Megatron-Core scripts), it rewrites the
    local spec (for a TE spec there: ufp4_block_spec(spec, config, policy, te=te_modules())).

    The recipe: `recipe` (bound by --fp4-recipe ufp4, patches/0001), else the environment,
    read here only: UFP4_RECIPE is a preset name (default "ufp4") or the path of a JSON file
    {"recipe": ..., "rules": {...}, "sr_seed": N, "weight_cache": "experts" | "all" | "none"}
    (policy_from_env). Each call builds its own
    policy, so every model chunk (vp_stage) has its own SR stream.
    Also accepts the (args, config, vp_stage) call of forks that call --spec hooks.
    """
    if not hasattr(config, "num_moe_experts") and rest:  # (args, config, vp_stage)
        config, vp_stage = vp_stage, rest[0]
    policy = UFP4Policy(recipe) if recipe is not None else policy_from_env()
    te = None
    if hasattr(config, "transformer"):  # Megatron-LM's GPTModelConfig
        model_config, config = config, config.transformer
        impl = config.transformer_impl
        if impl not in ("local", "transformer_engine"):
            raise ValueError(
                f"--transformer-impl {impl}: UFP4 rewrites Megatron's local or "
                "transformer_engine spec; pass --transformer-impl local"
            )
        te = te_modules() if impl == "transformer_engine" else None
        base = _megatron_lm_default_spec(model_config, vp_stage)
    elif config.num_moe_experts:
        base = get_gpt_decoder_block_spec(
            config,
            use_transformer_engine=False,
            normalization=config.normalization,
            qk_l2_norm=config.qk_l2_norm,
            vp_stage=vp_stage,
        )
    else:
        base = get_gpt_layer_local_spec(
            qk_layernorm=config.qk_layernorm,
            multi_latent_attention=config.multi_latent_attention,
            normalization=config.normalization,
        )
    return ufp4_block_spec(base, config, policy, vp_stage=vp_stage, te=te)


def _megatron_lm_default_spec(model_config, vp_stage):
    """The spec GPTModelBuilder builds without --spec, including its override for
    --attention-backend local (which it applies to a ModuleSpec only, so not to ours)."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnBackend
    from megatron.training.models.gpt import default_layer_spec

    spec = default_layer_spec(model_config, vp_stage)
    if model_config.attention_backend == AttnBackend.local and hasattr(spec, "submodules"):
        spec.submodules.self_attention.submodules.core_attention = DotProductAttention
    return spec


def policy_from_env() -> UFP4Policy:
    value = os.environ.get("UFP4_RECIPE", "ufp4")
    if not value.endswith(".json"):
        return UFP4Policy(value)
    with open(value) as f:
        cfg = json.load(f)
    unknown = set(cfg) - {"recipe", "rules", "sr_seed", "weight_cache"}
    if unknown:
        raise ValueError(
            f"{value}: unknown keys {sorted(unknown)}; valid: recipe, rules, sr_seed, weight_cache"
        )
    return UFP4Policy(
        cfg.get("recipe", "ufp4"),
        rules=cfg.get("rules", {}),
        sr_seed=cfg.get("sr_seed", 0),
        weight_cache=cfg.get("weight_cache", "experts"),
    )


# ----------------------------------------------------------------------------- the walk


@dataclasses.dataclass(frozen=True)
class _Ctx:
    policy: UFP4Policy
    config: Any
    layer_number: int
    prefix: str
    seen: list  # paths of the swappable modules found (an unrecognized spec has none)
    te: TEModules | None
    unfused: list  # fused TE norm+linear paths that became UFP4 linears (te_spec.place_norms)

    def bind(self, path: str):
        self.seen.append(path)
        return self.policy.bind(
            f"{self.prefix}.{path}", layer_number=self.layer_number, config=self.config
        )

    def quantizes(self, path: str) -> bool:
        return (
            self.policy.recipe_for(
                f"{self.prefix}.{path}", layer_number=self.layer_number, config=self.config
            )
            is not None
        )

    def is_experts(self, module, submodules) -> bool:
        return module is SequentialMLP or (
            self.te is not None and self.te.is_grouped_experts(module, submodules)
        )

    def refuse_fused_mlp(self, func, path: str) -> None:
        if (
            self.te is not None
            and self.te.is_fused_mlp(func)
            and any(self.quantizes(_join(path, f)) for f in ("linear_fc1", "linear_fc2"))
        ):
            raise ValueError(
                f"{self.prefix}.{path}: TransformerEngine's fused MLP "
                "(--use-transformer-engine-op-fuser) runs its own GEMMs, so UFP4 "
                "cannot quantize it; drop that flag"
            )


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _rewrite(obj, ctx: _Ctx, path: str, field: str = ""):
    if isinstance(obj, ModuleSpec):
        if ctx.is_experts(obj.module, obj.submodules):
            return _experts(obj.submodules, ctx, path) or obj
        subs = _rewrite(obj.submodules, ctx, path) if obj.submodules is not None else None
        return dataclasses.replace(obj, submodules=subs)
    if isinstance(obj, functools.partial):
        if ctx.is_experts(obj.func, obj.keywords.get("submodules")):
            return _experts(obj.keywords["submodules"], ctx, path) or obj
        ctx.refuse_fused_mlp(obj.func, path)
        kw = {
            k: (_rewrite(v, ctx, path) if k == "submodules" else v) for k, v in obj.keywords.items()
        }
        return functools.partial(obj.func, *obj.args, **kw)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {
            f.name: _rewrite(getattr(obj, f.name), ctx, _join(path, f.name), f.name)
            for f in dataclasses.fields(obj)
        }
        return dataclasses.replace(obj, **changes)
    if not isinstance(obj, type):
        return obj
    kind = _LOCAL_KIND.get(obj) or (ctx.te.linear_kind(obj) if ctx.te is not None else None)
    if kind is not None and field not in _KEPT_BF16:
        binding = ctx.bind(path)
        if binding is None:
            return obj
        if ctx.te is not None and obj is ctx.te.fused:
            ctx.unfused.append(path)
        return functools.partial(_UFP4_CLASS[kind], ufp4=binding)
    if obj is WrappedTorchNorm and ctx.config.sequence_parallel and field in _SP_NORMS:
        return sequence_parallel_torch_norm
    return obj


def _experts(mlp_submodules, ctx: _Ctx, path: str):
    """Routed experts: with config.moe_grouped_gemm, Megatron's TEGroupedMLP hosting grouped
    linears for every recipe (BF16 experts, and fc1/fc2 kept BF16 by the policy, run the same
    grouped GEMMs unquantized); otherwise UFP4SequentialMLP, or None (Megatron's own) when
    nothing is quantized. A TE spec whose experts stay BF16 keeps TE's own grouped GEMMs."""
    fc1, fc2 = ctx.bind(f"{path}.linear_fc1"), ctx.bind(f"{path}.linear_fc2")
    if fc1 is None and fc2 is None and ctx.te is not None:
        return None
    if ctx.config.moe_grouped_gemm:
        subs = GroupedMLPSubmodules(
            linear_fc1=functools.partial(
                UFP4ColumnParallelGroupedLinear,
                ufp4=fc1 or _bf16_binding(ctx, f"{path}.linear_fc1"),
            ),
            linear_fc2=functools.partial(
                UFP4RowParallelGroupedLinear, ufp4=fc2 or _bf16_binding(ctx, f"{path}.linear_fc2")
            ),
            activation_func=mlp_submodules.activation_func,
        )
        return functools.partial(TEGroupedMLP, submodules=subs)
    if fc1 is None and fc2 is None:
        return None
    subs = _rewrite(mlp_submodules, ctx, path)
    return functools.partial(UFP4SequentialMLP, submodules=subs)


def _bf16_binding(ctx: _Ctx, path: str) -> UFP4Binding:
    """The binding of a grouped linear the policy leaves in BF16 (no SR, so no role needed)."""
    return UFP4Binding(
        recipe=get_recipe("bf16"),
        seeds=ctx.policy.seeds,
        layer_number=ctx.layer_number,
        path=f"{ctx.prefix}.{path}",
        role=0,
    )

"""model.transformer_impl=transformer_engine: Megatron's TransformerEngine spec, UFP4 through TE.

    python -m ufp4_megatron.train model=small precision=ufp4 model.transformer_impl=transformer_engine

The local route (the default) rewrites Megatron's local spec with the plugin's linears. This
one keeps Megatron's TE spec (TE's LayerNormLinear, Linear and GroupedLinear) and sets the
config Megatron-LM's `--fp4-format e2m1 --fp4-recipe custom --fp4-quantizer-factory` set:
fp4_quantizer_factory is the dotted path of the run's recipe (ufp4_megatron.te), so Megatron
enters TE's autocast around each layer (not around its BF16 first/last layers) and TE asks the
factory for its quantizers. A bf16 run is the TE spec without FP4. The core attention is
model.attention_backend's in both routes, so they differ in their linears only.

Checked before anything is built: TransformerEngine >= 2.19 importable (check_installed), and
what the TE route refuses (check_config): sequence parallelism, tensor parallelism with
stochastic rounding, SR on weights, per-layer diagnostics (they hook the local route's linears).
Grouped MoE experts take the subclasses of megatron/te_experts.py: Megatron-Core 0.19's own
cannot checkpoint a custom recipe.
"""

from __future__ import annotations

IMPLS = ("local", "transformer_engine")
TE = "transformer_engine"


def check_config(cfg) -> None:
    """Raises ValueError (one line) for what the TE route cannot run; nothing for local."""
    m, p = cfg.model, cfg.parallel
    if m.transformer_impl not in IMPLS:
        raise ValueError(
            f"model.transformer_impl={m.transformer_impl!r}; valid: {', '.join(IMPLS)}"
        )
    if m.transformer_impl != TE:
        return
    from ..te.checks import check_parallel, check_recipe
    from .precision import recipe_from_config

    recipe = recipe_from_config(cfg.precision)
    if p.sp and recipe.quantized:
        raise ValueError(
            "model.transformer_impl=transformer_engine with parallel.sp=true: TE "
            "all-gathers the dequantized input and quantizes it again, so a GEMM "
            "would not get the recipe's operand; use parallel.sp=false or "
            "model.transformer_impl=local"
        )
    if cfg.logging.wandb.diagnostics_interval and recipe.quantized:
        raise ValueError(
            "logging.wandb.diagnostics_interval with model.transformer_impl="
            "transformer_engine: the per-layer diagnostics hook the local route's "
            "linears; set logging.wandb.diagnostics_interval=0 or use "
            "model.transformer_impl=local"
        )
    check_recipe(recipe)
    check_parallel(recipe, p.tp)


def check_installed() -> None:
    """TransformerEngine >= 2.19 installed and loading here (te/installed.py)."""
    from ..te.installed import check_installed as te_installed

    try:
        te_installed()
    except ValueError as e:
        raise ValueError(
            f"model.transformer_impl=transformer_engine {e}; install it (an "
            "offline node: gpu/te_setup.sh) or use model.transformer_impl=local"
        ) from None


def config_fields(recipe) -> dict:
    """TransformerConfig fields of the TE route: Megatron-LM's --fp4-format e2m1 --fp4-recipe
    custom --fp4-quantizer-factory <the recipe's factory>; none for an unquantized recipe."""
    if not recipe.quantized:
        return {}
    from ..te import factory_path

    return {"fp4": "e2m1", "fp4_recipe": "custom", "fp4_quantizer_factory": factory_path(recipe)}


def te_spec(config, *, pp_rank: int | None = None):
    """Megatron's TE GPT spec for `config` (dense: a layer spec; MoE: this stage's block, its
    grouped expert linears able to checkpoint the custom recipe: megatron/te_experts.py)."""
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )

    from ..megatron.te_experts import checkpointable_experts

    if config.num_moe_experts:
        return checkpointable_experts(
            get_gpt_decoder_block_spec(
                config, use_transformer_engine=True, normalization="RMSNorm", pp_rank=pp_rank
            )
        )
    return get_gpt_layer_with_transformer_engine_spec()

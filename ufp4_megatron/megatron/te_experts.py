"""TE's grouped expert linears for the TransformerEngine route, able to checkpoint a custom recipe.

Megatron-Core 0.19's TEGroupedLinear splits its TE extra state into one record per expert when
it saves and merges them back when it loads, decoding the state with Megatron's SafeUnpickler
(megatron/core/safe_globals.py). Under a custom FP4 recipe that state holds TE's CustomRecipe
with its quantizer factory, and the allowlist has TE's built-in recipes only, so the first
save of a grouped MoE model fails. The TE route's spec takes these subclasses instead (a spec
seam, Megatron's classes untouched): they decode with the same allowlist plus

    transformer_engine.common.recipe.CustomRecipe   the recipe (a dataclass of plain fields)
    ufp4_megatron.te.factories.resolve              how the plugin's factories pickle: a
                                                    lookup by preset, ablation or registered
                                                    name, which builds nothing else

(te/factories.py: CHECKPOINT_GLOBALS), so a checkpoint still cannot name any other
callable. Everything else (the split, the merge, the encoding) is Megatron's. Needs
TransformerEngine (the classes are made on first use).
"""

from __future__ import annotations

import dataclasses
import functools
import io

import torch
from megatron.core.safe_globals import SafeUnpickler
from megatron.core.transformer.spec_utils import ModuleSpec

from ..te.factories import CHECKPOINT_GLOBALS


class ExtraStateUnpickler(SafeUnpickler):
    """Megatron's extra-state allowlist plus a custom recipe and the plugin's factories."""

    _SAFE_CLASSES = SafeUnpickler._SAFE_CLASSES | CHECKPOINT_GLOBALS


def decode_extra_state(state, fallback):
    """TEGroupedLinear._decode_extra_state with ExtraStateUnpickler for byte tensors (TE >= 2);
    any other form goes to `fallback` (Megatron's own decoder)."""
    if isinstance(state, torch.Tensor):
        if state.numel() == 0:  # no FP8/FP4 state
            return None
        return ExtraStateUnpickler(io.BytesIO(state.detach().cpu().numpy().tobytes())).load()
    return fallback(state)


@functools.cache
def grouped_linears() -> dict:
    """{Megatron's TE grouped linear class: its subclass here} for column and row parallel."""
    from megatron.core.extensions import transformer_engine as te_ext

    class UFP4TEColumnParallelGroupedLinear(te_ext.TEColumnParallelGroupedLinear):
        def _decode_extra_state(self, state):
            return decode_extra_state(state, super()._decode_extra_state)

    class UFP4TERowParallelGroupedLinear(te_ext.TERowParallelGroupedLinear):
        def _decode_extra_state(self, state):
            return decode_extra_state(state, super()._decode_extra_state)

    return {
        te_ext.TEColumnParallelGroupedLinear: UFP4TEColumnParallelGroupedLinear,
        te_ext.TERowParallelGroupedLinear: UFP4TERowParallelGroupedLinear,
    }


def swap_modules(spec, mapping: dict):
    """`spec` with every class in `mapping` replaced by its value, wherever it sits: module
    specs, submodule dataclasses, lists and tuples, functools.partial arguments."""
    if isinstance(spec, type) and spec in mapping:
        return mapping[spec]
    if isinstance(spec, ModuleSpec):
        return dataclasses.replace(
            spec,
            module=swap_modules(spec.module, mapping),
            submodules=swap_modules(spec.submodules, mapping),
        )
    if isinstance(spec, functools.partial):
        return functools.partial(
            swap_modules(spec.func, mapping),
            *(swap_modules(a, mapping) for a in spec.args),
            **{k: swap_modules(v, mapping) for k, v in spec.keywords.items()},
        )
    if dataclasses.is_dataclass(spec) and not isinstance(spec, type):
        changes = {
            f.name: swap_modules(getattr(spec, f.name), mapping)
            for f in dataclasses.fields(spec)
            if f.init
        }
        return dataclasses.replace(spec, **changes)
    if isinstance(spec, (list, tuple)):
        items = [swap_modules(s, mapping) for s in spec]
        return type(spec)(*items) if hasattr(spec, "_fields") else type(spec)(items)
    return spec


def checkpointable_experts(spec):
    """The TE spec `spec` with TE's grouped expert linears replaced by the subclasses above."""
    return swap_modules(spec, grouped_linears())


def te_gpt_spec(config, vp_stage: int | None = None, *rest):
    """Megatron-LM entry point for the TE route with grouped MoE experts that checkpoint:
    `--spec ufp4_megatron.megatron.te_experts te_gpt_spec` beside `--transformer-impl
    transformer_engine --fp4-format e2m1 --fp4-recipe custom --fp4-quantizer-factory ...`.

    The spec Megatron-LM builds without --spec (its `default_layer_spec` for the config, as
    ufp4_megatron.megatron.spec rebuilds it) with TE's grouped expert linears replaced by the
    subclasses above; nothing else changes: the quantizer factory does the quantization, as
    without --spec. Called with a TransformerConfig (Megatron-Core scripts), it takes
    Megatron-Core's TE decoder block spec for that config. Also accepts the (args, config,
    vp_stage) call of forks that call --spec hooks.
    """
    if not hasattr(config, "num_moe_experts") and rest:  # (args, config, vp_stage)
        config, vp_stage = vp_stage, rest[0]
    if hasattr(config, "transformer"):  # Megatron-LM's GPTModelConfig
        impl = config.transformer.transformer_impl
        if impl != "transformer_engine":
            raise ValueError(
                f"--spec ufp4_megatron.megatron.te_experts te_gpt_spec is for "
                f"--transformer-impl transformer_engine, not {impl}; for the local route use "
                "--spec ufp4_megatron.megatron.spec ufp4_gpt_spec"
            )
        from .spec import _megatron_lm_default_spec

        return checkpointable_experts(_megatron_lm_default_spec(config, vp_stage))
    if getattr(config, "transformer_impl", "transformer_engine") != "transformer_engine":
        raise ValueError(
            f"te_gpt_spec builds TransformerEngine layers: set transformer_impl="
            f"'transformer_engine' (not {config.transformer_impl!r}), or use "
            "ufp4_megatron.megatron.spec.ufp4_gpt_spec for the local route"
        )
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    return checkpointable_experts(
        get_gpt_decoder_block_spec(
            config,
            use_transformer_engine=True,
            normalization=config.normalization,
            qk_l2_norm=config.qk_l2_norm,
            vp_stage=vp_stage,
        )
    )

"""TransformerEngine layer specs (`--transformer-impl transformer_engine`) for the UFP4 rewrite.

What the rewrite (spec.py) does with each TE module of Megatron's TE spec, where the policy
quantizes the linear (everywhere else, e.g. BF16 first/last layers, TE's module stays):
    TEColumnParallelLinear           -> UFP4ColumnParallelLinear
    TERowParallelLinear              -> UFP4RowParallelLinear
    TELayerNormColumnParallelLinear  -> the norm it fuses goes back to the layer's norm slot
                                        (TENorm, the same TE norm), the linear becomes
                                        UFP4ColumnParallelLinear:
        self_attention.linear_qkv        norm -> input_layernorm
        mlp.linear_fc1                   norm -> pre_mlp_layernorm
        self_attention.linear_q_up_proj  norm -> self_attention.q_layernorm    (MLA)
        self_attention.linear_kv_up_proj norm -> self_attention.kv_layernorm   (MLA)
    TEGroupedMLP (TE grouped linears) -> the routed experts of the local path (spec._experts)
    TEFusedMLP (--use-transformer-engine-op-fuser) -> refused: it runs its own GEMMs
    TEDotProductAttention, TENorm, TELinear (MLA down projections) -> unchanged
The split keeps Megatron's checkpoint keys: the layer's sharded_state_dict_keys_map sends
`input_layernorm.*` to `self_attention.linear_qkv.layer_norm_*` (as Megatron's local spec
does), so a UFP4 layer reads and writes the keys of TE's fused module. TE's own `_extra_state`
(FP8 metadata) in a TE checkpoint is ignored by the UFP4 linears (linear.py).

The classes come from Megatron's TESpecProvider (`te_modules()`), so this follows whatever the
installed Megatron puts in its TE spec. TE is not installed on the machines this was written
on: the rewrite is tested on a TE-shaped spec built from stand-in classes (tests/megatron_lm),
never on TransformerEngine itself.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.spec_utils import ModuleSpec

# A fused (norm + column-parallel linear) path, relative to the layer -> its norm slot there.
NORM_SLOT = {
    "self_attention.linear_qkv": "input_layernorm",
    "mlp.linear_fc1": "pre_mlp_layernorm",
    "self_attention.linear_q_up_proj": "self_attention.q_layernorm",
    "self_attention.linear_kv_up_proj": "self_attention.kv_layernorm",
}
_QK_SLOTS = {"self_attention.q_layernorm", "self_attention.kv_layernorm"}


@dataclasses.dataclass(frozen=True)
class TEModules:
    """The TransformerEngine classes of a spec, and the norms an unfused layer gets."""

    fused: Any  # norm + column-parallel linear (TELayerNormColumnParallelLinear)
    column: Any  # TEColumnParallelLinear
    row: Any  # TERowParallelLinear
    norm: Any  # for input_layernorm / pre_mlp_layernorm (TENorm)
    qk_norm: Any  # for q_layernorm / kv_layernorm (MLA)
    grouped_mlp: Any = None  # TEGroupedMLP, when its linears are TE's grouped ones
    grouped_linears: tuple = ()  # (TEColumnParallelGroupedLinear, TERowParallelGroupedLinear)
    fused_mlps: tuple = ()  # TEFusedMLP and friends: refused when quantized

    def linear_kind(self, cls) -> str | None:
        """'column' or 'row' for a TE linear the UFP4 linears can replace, else None."""
        if cls is self.fused or cls is self.column:
            return "column"
        if cls is self.row:
            return "row"
        return None

    def is_grouped_experts(self, module, submodules) -> bool:
        return (
            self.grouped_mlp is not None
            and module is self.grouped_mlp
            and getattr(submodules, "linear_fc1", None) in self.grouped_linears
        )

    def is_fused_mlp(self, func) -> bool:
        owner = getattr(func, "__self__", func)  # MLP specs are partial(cls.as_mlp_submodule)
        return any(owner is cls for cls in self.fused_mlps)


def te_modules() -> TEModules:
    """The TE classes of the installed Megatron's TE spec (TESpecProvider)."""
    from megatron.core.extensions import transformer_engine as te_ext

    if not te_ext.HAVE_TE:
        raise ValueError(
            "--transformer-impl transformer_engine needs TransformerEngine, which "
            "is not installed: pass --transformer-impl local (UFP4 runs without TE)"
        )
    from megatron.core.extensions.transformer_engine_spec_provider import TESpecProvider
    from megatron.core.transformer.moe.experts import TEGroupedMLP

    te = TESpecProvider()
    return TEModules(
        fused=te.column_parallel_layer_norm_linear(),
        column=te.column_parallel_linear(),
        row=te.row_parallel_linear(),
        norm=te.layer_norm(),
        qk_norm=te.layer_norm(for_qk=True),
        grouped_mlp=TEGroupedMLP,
        grouped_linears=tuple(
            c
            for c in (te_ext.TEColumnParallelGroupedLinear, te_ext.TERowParallelGroupedLinear)
            if c is not None
        ),
        fused_mlps=tuple(
            c
            for c in (
                getattr(te_ext, "TEFusedMLP", None),
                getattr(te_ext, "TEFusedMLPWithGroupedLinear", None),
            )
            if c is not None
        ),
    )


def place_norms(layer_spec: ModuleSpec, unfused: list[str], te: TEModules) -> ModuleSpec:
    """Give each fused linear that became a UFP4 linear its norm back, keeping the TE
    checkpoint keys (see the module docstring). `unfused`: paths relative to the layer."""
    subs = layer_spec.submodules
    keys_map = dict(subs.sharded_state_dict_keys_map)
    for path in unfused:
        slot = NORM_SLOT.get(path)
        if slot is None:
            raise TypeError(
                f"{path}: a fused TE norm+linear module where UFP4 has no norm slot "
                f"for it (known: {', '.join(NORM_SLOT)}); keep it in BF16 with a "
                "policy rule, or use --transformer-impl local"
            )
        norm = te.qk_norm if slot in _QK_SLOTS else te.norm
        subs = _replace_at(subs, slot.split("."), norm, path)
        keys_map[f"{slot}."] = f"{path}.layer_norm_"
    subs = dataclasses.replace(subs, sharded_state_dict_keys_map=keys_map)
    return dataclasses.replace(layer_spec, submodules=subs)


def _replace_at(obj, fields: list[str], value, fused_path: str):
    if isinstance(obj, ModuleSpec):
        return dataclasses.replace(
            obj, submodules=_replace_at(obj.submodules, fields, value, fused_path)
        )
    if isinstance(obj, functools.partial):
        kw = dict(
            obj.keywords,
            submodules=_replace_at(obj.keywords["submodules"], fields, value, fused_path),
        )
        return functools.partial(obj.func, *obj.args, **kw)
    head, rest = fields[0], fields[1:]
    current = getattr(obj, head)
    if rest:
        return dataclasses.replace(obj, **{head: _replace_at(current, rest, value, fused_path)})
    if current is not IdentityOp:
        raise TypeError(
            f"{fused_path} fuses a norm, but the layer's {head} is {current!r}, not "
            "empty: an unexpected TE spec; use --transformer-impl local"
        )
    return dataclasses.replace(obj, **{head: value})

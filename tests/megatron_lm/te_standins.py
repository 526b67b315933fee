"""TransformerEngine stand-ins: Megatron's TE layer structure, built from Megatron's classes.

TE cannot be installed on these machines, and without it Megatron's TE classes are MagicMocks,
so the TE rewrite (ufp4_megatron/megatron/te_spec.py) is tested on this spec instead: the
structure of get_gpt_layer_with_transformer_engine_submodules (no MLA) with
  FusedNormColumn  for TELayerNormColumnParallelLinear (RMSNorm weight `layer_norm_weight`
                   inside a column-parallel linear, as TE's fused module keeps it)
  TEColumn, TERow  for TEColumnParallelLinear, TERowParallelLinear
  GroupedColumn, GroupedRow  for TE's grouped expert linears (in Megatron's TEGroupedMLP)
and TE_CLASSES, the TEModules table that te_modules() would read from TESpecProvider.
"""

import functools

import torch
from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.models.backends import LocalSpecProvider
from megatron.core.models.gpt.gpt_layer_specs import get_mlp_module_spec_for_backend
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.moe.experts import GroupedMLPSubmodules, SequentialMLP, TEGroupedMLP
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_layer import (
    TransformerLayer,
    TransformerLayerSubmodules,
)

from ufp4_megatron.megatron.te_spec import TEModules


class FusedNormColumn(ColumnParallelLinear):
    def __init__(self, input_size, output_size, *, config, **kw):
        super().__init__(input_size, output_size, config=config, **kw)
        self.layer_norm_weight = torch.nn.Parameter(torch.ones(input_size))
        self.eps = config.layernorm_epsilon

    def forward(self, x, *args, **kwargs):
        x = torch.nn.functional.rms_norm(x, (x.shape[-1],), self.layer_norm_weight, self.eps)
        return super().forward(x, *args, **kwargs)


class TEColumn(ColumnParallelLinear):
    pass


class TERow(RowParallelLinear):
    pass


class GroupedColumn:
    """TEColumnParallelGroupedLinear stand-in (never built: quantized experts replace it)."""


class GroupedRow:
    """TERowParallelGroupedLinear stand-in."""


class FusedMLP(MLP):
    """TEFusedMLP stand-in (never built: the rewrite refuses it)."""


class FakeTEBackend(LocalSpecProvider):
    """TESpecProvider's answers, with the stand-ins."""

    def column_parallel_linear(self):
        return TEColumn

    def row_parallel_linear(self):
        return TERow

    def fuse_layernorm_and_linear(self):
        return True

    def column_parallel_layer_norm_linear(self):
        return FusedNormColumn

    def grouped_mlp_modules(self, moe_use_grouped_gemm):
        if moe_use_grouped_gemm:
            return functools.partial(
                TEGroupedMLP,
                submodules=GroupedMLPSubmodules(
                    linear_fc1=GroupedColumn, linear_fc2=GroupedRow, activation_func=None
                ),
            )
        return functools.partial(
            SequentialMLP, submodules=MLPSubmodules(linear_fc1=TEColumn, linear_fc2=TERow)
        )


TE_CLASSES = TEModules(
    fused=FusedNormColumn,
    column=TEColumn,
    row=TERow,
    norm=WrappedTorchNorm,
    qk_norm=WrappedTorchNorm,
    grouped_mlp=TEGroupedMLP,
    grouped_linears=(GroupedColumn, GroupedRow),
    fused_mlps=(FusedMLP,),
)


def te_layer(num_experts=None, fused_mlp=False, grouped=False) -> ModuleSpec:
    backend = FakeTEBackend()
    mlp = get_mlp_module_spec_for_backend(
        backend=backend, num_experts=num_experts, moe_grouped_gemm=grouped
    )
    if fused_mlp:  # what use_te_op_fuser selects
        mlp = functools.partial(FusedMLP.as_mlp_submodule, **mlp.keywords)
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            self_attention=ModuleSpec(
                module=SelfAttention,
                params={"attn_mask_type": AttnMaskType.causal},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=backend.column_parallel_layer_norm_linear(),
                    core_attention=backend.core_attention(),
                    linear_proj=backend.row_parallel_linear(),
                    q_layernorm=IdentityOp,
                    k_layernorm=IdentityOp,
                ),
            ),
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=WrappedTorchNorm if num_experts else IdentityOp,
            mlp=mlp,
            mlp_bda=get_bias_dropout_add,
        ),
    )

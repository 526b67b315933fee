"""The TransformerEngine spec rewrite (te_spec.py), on Megatron's TE layer structure built from
stand-in classes (te_standins.py; TE itself cannot be installed here).

- Where the policy quantizes: TE column/row linears -> UFP4 linears; a fused norm+linear ->
  the norm in the layer's slot + a UFP4 linear; TE's grouped experts -> the plugin's (sequential
  or grouped); elsewhere (a BF16 layer) TE's modules stay.
- The rewritten model has exactly the checkpoint keys and shapes of the all-TE model
  (`self_attention.linear_qkv.layer_norm_weight`, ...), dense and MoE, and trains a step.
- TE's fused MLP is refused where it would be quantized; an unexpected fused module or norm
  slot is refused; without TE, `te_modules()` says to use --transformer-impl local.
"""

import functools

import pytest
from conftest import run_probe
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.moe.experts import TEGroupedMLP
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from te_standins import (
    TE_CLASSES,
    FusedNormColumn,
    GroupedColumn,
    GroupedRow,
    TEColumn,
    TERow,
    te_layer,
)

from ufp4_megatron.megatron import UFP4ColumnParallelLinear, UFP4Policy, UFP4RowParallelLinear
from ufp4_megatron.megatron.experts import (
    UFP4ColumnParallelGroupedLinear,
    UFP4RowParallelGroupedLinear,
)
from ufp4_megatron.megatron.spec import ufp4_block_spec
from ufp4_megatron.megatron.te_spec import place_norms, te_modules


def _config(**kw):
    return TransformerConfig(
        num_layers=2, hidden_size=64, num_attention_heads=4, normalization="RMSNorm", **kw
    )


def _rewrite(layer, config, policy):
    return ufp4_block_spec(layer, config, policy, te=TE_CLASSES, pp_rank=0)


def _cls(builder):
    return builder.func if isinstance(builder, functools.partial) else builder


@pytest.fixture(scope="module")
def te_results(tmp_path_factory):
    return run_probe("te", tmp=tmp_path_factory.mktemp("te"))


def test_fused_linear_is_split_into_norm_and_ufp4_linear():
    block = _rewrite(te_layer(), _config(), UFP4Policy("ufp4"))
    layer = block.layer_specs[0].submodules
    attn = layer.self_attention.submodules
    mlp = layer.mlp.keywords["submodules"]
    assert (
        _cls(attn.linear_qkv) is UFP4ColumnParallelLinear
        and layer.input_layernorm is WrappedTorchNorm
    )
    assert (
        _cls(mlp.linear_fc1) is UFP4ColumnParallelLinear
        and layer.pre_mlp_layernorm is WrappedTorchNorm
    )
    assert _cls(attn.linear_proj) is UFP4RowParallelLinear
    assert _cls(mlp.linear_fc2) is UFP4RowParallelLinear
    assert layer.sharded_state_dict_keys_map == {
        "input_layernorm.": "self_attention.linear_qkv.layer_norm_",
        "pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_",
    }


def test_bf16_layers_keep_te_modules():
    policy = UFP4Policy(
        "ufp4", rules={"decoder.layers.0.*": "bf16", "decoder.layers.1.mlp.*": "bf16"}
    )
    block = _rewrite(te_layer(), _config(), policy)
    first, second = (s.submodules for s in block.layer_specs)
    assert first.self_attention.submodules.linear_qkv is FusedNormColumn
    assert first.self_attention.submodules.linear_proj is TERow
    assert first.input_layernorm is IdentityOp and first.sharded_state_dict_keys_map == {}
    assert second.mlp.keywords["submodules"].linear_fc1 is FusedNormColumn
    assert second.pre_mlp_layernorm is IdentityOp and second.input_layernorm is WrappedTorchNorm
    assert second.sharded_state_dict_keys_map == {
        "input_layernorm.": "self_attention.linear_qkv.layer_norm_"
    }


def test_te_sequential_experts_become_ufp4():
    config = _config(num_moe_experts=4, moe_router_topk=2, add_bias_linear=False)
    block = _rewrite(te_layer(num_experts=4), config, UFP4Policy("ufp4"))
    experts = block.layer_specs[0].submodules.mlp.keywords["submodules"].experts
    assert experts.func.__name__ == "UFP4SequentialMLP"
    assert {
        _cls(experts.keywords["submodules"].linear_fc1),
        _cls(experts.keywords["submodules"].linear_fc2),
    } == {UFP4ColumnParallelLinear, UFP4RowParallelLinear}


def test_te_grouped_experts_become_ufp4_grouped_experts():
    config = _config(
        num_moe_experts=4, moe_router_topk=2, add_bias_linear=False, moe_grouped_gemm=True
    )
    block = _rewrite(te_layer(num_experts=4, grouped=True), config, UFP4Policy("ufp4"))
    experts = block.layer_specs[0].submodules.mlp.keywords["submodules"].experts
    subs = experts.keywords["submodules"]
    assert experts.func is TEGroupedMLP
    assert (_cls(subs.linear_fc1), _cls(subs.linear_fc2)) == (
        UFP4ColumnParallelGroupedLinear,
        UFP4RowParallelGroupedLinear,
    )
    kept = _rewrite(
        te_layer(num_experts=4, grouped=True),
        config,
        UFP4Policy("ufp4", rules={"*.experts.*": "bf16"}),
    )
    subs = kept.layer_specs[0].submodules.mlp.keywords["submodules"].experts.keywords["submodules"]
    assert (subs.linear_fc1, subs.linear_fc2) == (GroupedColumn, GroupedRow)


def test_without_te_classes_a_te_spec_is_refused():
    with pytest.raises(TypeError, match="TransformerEngine spec given te=te_modules()"):
        ufp4_block_spec(te_layer(), _config(), UFP4Policy("ufp4"), pp_rank=0)


def test_te_fused_mlp_is_refused_where_quantized():
    with pytest.raises(ValueError, match="--use-transformer-engine-op-fuser"):
        _rewrite(te_layer(fused_mlp=True), _config(), UFP4Policy("ufp4"))
    policy = UFP4Policy("ufp4", rules={"*.mlp.*": "bf16"})  # kept BF16: fine
    _rewrite(te_layer(fused_mlp=True), _config(), policy)


def test_unknown_fused_module_or_taken_norm_slot_is_refused():
    layer = te_layer()
    with pytest.raises(TypeError, match="no norm slot"):
        place_norms(layer, ["self_attention.linear_proj"], TE_CLASSES)
    taken = ufp4_block_spec(
        te_layer(), _config(), UFP4Policy("ufp4"), te=TE_CLASSES, pp_rank=0
    ).layer_specs[0]
    with pytest.raises(TypeError, match="not empty"):
        place_norms(taken, ["self_attention.linear_qkv"], TE_CLASSES)


def test_te_modules_without_te_says_use_local():
    with pytest.raises(ValueError, match="pass --transformer-impl local"):
        te_modules()


def test_te_classes_cover_the_local_equivalents():
    assert TE_CLASSES.linear_kind(FusedNormColumn) == "column"
    assert TE_CLASSES.linear_kind(TEColumn) == "column"
    assert TE_CLASSES.linear_kind(TERow) == "row"
    assert TE_CLASSES.linear_kind(WrappedTorchNorm) is None


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_rewritten_te_model_keeps_te_checkpoint_keys(te_results, kind):
    bf16, ufp4 = te_results[kind]["bf16"], te_results[kind]["ufp4"]
    assert ufp4["keys"] == bf16["keys"]
    assert any(
        k[0] == "decoder.layers.self_attention.linear_qkv.layer_norm_weight" for k in ufp4["keys"]
    )


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_rewritten_te_model_builds_and_trains(te_results, kind):
    ufp4 = te_results[kind]["ufp4"]
    classes = {p: v[0] for p, v in ufp4["linears"].items()}
    assert classes["decoder.layers.0.self_attention.linear_qkv"] == "FusedNormColumn"
    assert classes["decoder.layers.1.self_attention.linear_qkv"] == "UFP4ColumnParallelLinear"
    assert classes["decoder.layers.2.self_attention.linear_proj"] == "UFP4RowParallelLinear"
    assert ufp4["norms"]["decoder.layers.0.input_layernorm"] == "IdentityOp"
    assert ufp4["norms"]["decoder.layers.1.input_layernorm"] == "RMSNorm"
    if kind == "dense":
        assert classes["decoder.layers.1.mlp.linear_fc1"] == "UFP4ColumnParallelLinear"
        assert ufp4["norms"]["decoder.layers.1.pre_mlp_layernorm"] == "RMSNorm"
    else:
        experts = {p: c for p, c in classes.items() if "decoder.layers.1.mlp.experts" in p}
        assert len(experts) == 8 and set(experts.values()) == {
            "UFP4ColumnParallelLinear",
            "UFP4RowParallelLinear",
        }
    assert 0 < ufp4["loss"] < 10

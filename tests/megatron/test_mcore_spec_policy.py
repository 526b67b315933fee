"""In-process contracts (no process group): policy and registry, spec rewrite, SR seed
stream, shard units, version guard, Megatron-LM entry point configuration. (The CPU
compat layer patches torch.cuda process-wide, so it is exercised only inside the gloo
workers of the distributed tests, never in this process.)"""

import copy
import functools
import json

import pytest
import torch
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer import MLATransformerConfig, TransformerConfig

from ufp4_megatron import get_recipe
from ufp4_megatron.megatron import (
    SRSeeds,
    UFP4ColumnParallelLinear,
    UFP4Policy,
    UFP4RowParallelLinear,
    _version,
)
from ufp4_megatron.megatron.spec import policy_from_env, ufp4_block_spec


def _config(**kw):
    return TransformerConfig(num_layers=3, hidden_size=64, num_attention_heads=4, **kw)


def _cls(builder):
    return builder.func if isinstance(builder, functools.partial) else builder


def _attn(block, i):
    return block.layer_specs[i].submodules.self_attention.submodules


def _mlp(block, i):
    return block.layer_specs[i].submodules.mlp.keywords["submodules"]


def test_policy_first_matching_rule_wins_else_default():
    policy = UFP4Policy("ufp4", rules={"*.linear_fc2": "e2m1", "*.mlp.*": "mxfp4"})
    at = functools.partial(policy.recipe_for, layer_number=1)
    assert at("decoder.layers.0.mlp.linear_fc2").name == "e2m1"
    assert at("decoder.layers.0.mlp.linear_fc1").name == "mxfp4"
    assert at("decoder.layers.0.self_attention.linear_qkv").name == "ufp4"


def test_policy_unquantized_recipe_means_megatron_module():
    assert UFP4Policy("bf16").recipe_for("decoder.layers.0.mlp.linear_fc1", layer_number=1) is None


def test_policy_rejects_unknown_recipe_name():
    with pytest.raises(ValueError, match="unknown recipe"):
        UFP4Policy("fp3")


def test_policy_honours_megatron_first_last_layers_bf16():
    config = _config(
        first_last_layers_bf16=True, num_layers_at_start_in_bf16=1, num_layers_at_end_in_bf16=1
    )
    policy = UFP4Policy("ufp4")
    quantized = [
        policy.recipe_for("x", layer_number=n, config=config) is not None for n in (1, 2, 3)
    ]
    assert quantized == [False, True, False]


def test_spec_rewrite_swaps_dense_linears_per_layer():
    config = _config(
        first_last_layers_bf16=True, num_layers_at_start_in_bf16=1, num_layers_at_end_in_bf16=0
    )
    policy = UFP4Policy("ufp4", rules={"*.linear_fc2": "e2m1"})
    block = ufp4_block_spec(get_gpt_layer_local_spec(), config, policy, pp_rank=0)
    assert len(block.layer_specs) == 3
    assert _cls(_attn(block, 0).linear_qkv) is ColumnParallelLinear  # BF16 first layer
    assert _cls(_mlp(block, 0).linear_fc2) is RowParallelLinear
    for i in (1, 2):
        qkv, fc2 = _attn(block, i).linear_qkv, _mlp(block, i).linear_fc2
        assert _cls(qkv) is UFP4ColumnParallelLinear and _cls(fc2) is UFP4RowParallelLinear
        assert _cls(_attn(block, i).linear_proj) is UFP4RowParallelLinear
        assert qkv.keywords["ufp4"].layer_number == i + 1
        assert qkv.keywords["ufp4"].path == f"decoder.layers.{i}.self_attention.linear_qkv"
        assert fc2.keywords["ufp4"].recipe.name == "e2m1"
        assert qkv.keywords["ufp4"].seeds is policy.seeds


def test_spec_rewrite_mla_keeps_identity_checked_down_projections():
    config = MLATransformerConfig(
        num_layers=1,
        hidden_size=64,
        num_attention_heads=4,
        multi_latent_attention=True,
        q_lora_rank=32,
        kv_lora_rank=32,
    )
    block = ufp4_block_spec(
        get_gpt_layer_local_spec(multi_latent_attention=True), config, UFP4Policy("ufp4"), pp_rank=0
    )
    attn = _attn(block, 0)
    assert attn.linear_q_down_proj is ColumnParallelLinear  # MLA checks its class by identity
    assert attn.linear_kv_down_proj is ColumnParallelLinear
    for name in ("linear_q_up_proj", "linear_kv_up_proj"):
        assert _cls(getattr(attn, name)) is UFP4ColumnParallelLinear
    assert _cls(attn.linear_proj) is UFP4RowParallelLinear


def test_sr_seeds_state_dict_restores_the_stream_exactly():
    seeds = SRSeeds(11)
    [seeds.draw(1, 2, 0, 0) for _ in range(3)]
    saved = copy.deepcopy(seeds.state_dict())
    expected = [seeds.draw(layer, 7, 0, 0) for layer in (1, 2, 3)]
    resumed = SRSeeds(0)
    resumed.load_state_dict(saved)
    assert [resumed.draw(layer, 7, 0, 0) for layer in (1, 2, 3)] == expected
    assert resumed.draws == 6


def test_sr_seeds_are_the_counter_based_stream():
    from ufp4_megatron.numerics.philox import stream_seed

    seeds = SRSeeds(2**40 + 3)
    assert [seeds.draw(1, 7, 0, 2) for _ in range(3)] == [
        stream_seed(2**40 + 3, k, 1, 7, 0, 2) for k in range(3)
    ]
    assert seeds.state_dict() == {"format": 2, "seed": 2**40 + 3, "draws": 3}


def test_sr_seeds_of_an_older_checkpoint_continue_its_stream():
    """A format-1 state (a CPU generator's, saved before the counter-based stream) resumes
    exactly: each call seed is mix_seed(the generator's next value, *salt), as it was."""
    from ufp4_megatron.numerics.philox import mix_seed

    gen = torch.Generator().manual_seed(21)
    old = {"seed": 21, "draws": 0, "generator": gen.get_state()}
    want = [
        mix_seed(int(torch.randint(0, 2**62, (1,), generator=gen).item()), 4, 1, 0, 0)
        for _ in range(2)
    ]
    seeds = SRSeeds(0)
    seeds.load_state_dict(old)
    assert [seeds.draw(4, 1, 0, 0) for _ in range(2)] == want
    assert set(seeds.state_dict()) == {"seed", "draws", "generator"}  # saved as it came


def test_sr_seeds_refuse_an_unknown_format():
    with pytest.raises(ValueError, match="format 7"):
        SRSeeds(0).load_state_dict({"format": 7, "seed": 1, "draws": 0})


def test_sr_seeds_mix_layer_and_data_parallel_rank():
    draws = {salt: SRSeeds(3).draw(*salt) for salt in ((1, 0, 0, 0), (2, 0, 0, 0), (1, 0, 0, 1))}
    assert len(set(draws.values())) == 3


def test_sr_seeds_are_shared_through_deepcopy():
    seeds = SRSeeds(1)
    assert copy.deepcopy({"s": seeds})["s"] is seeds


@pytest.mark.parametrize("name,unit", [("ufp4", 16), ("e2m1", 16), ("mxfp4", 32)])
def test_shard_unit_is_block_and_rht_lcm(name, unit):
    assert get_recipe(name).shard_unit == unit


@pytest.mark.parametrize("found", ["0.19.1", "0.19.2", "0.19.1+f8837c04", "0.19.2+8e83c0d"])
def test_version_guard_accepts_core_r0_19_checkout_and_wheel(found):
    _version.check_version(found)


@pytest.mark.parametrize("found", ["0.16.1", "0.19.0", "0.19.3", "0.20.0rc1"])
def test_version_guard_refuses_other_megatron_core(found):
    with pytest.raises(ImportError, match=f"supports megatron-core 0.19.1 and 0.19.2.*{found}"):
        _version.check_version(found, where="x")


def test_version_guard_reads_the_imported_megatron_core():
    from megatron.core import package_info

    _version.check_megatron_core()  # the installed wheel
    assert package_info.__version__.split("+")[0] in _version.SUPPORTED_MEGATRON_CORE


def test_policy_from_env_reads_name_or_json_file(monkeypatch, tmp_path):
    monkeypatch.setenv("UFP4_RECIPE", "e2m1")
    assert policy_from_env().default.name == "e2m1"
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"recipe": "ufp4", "rules": {"*.linear_fc2": "e2m1"}, "sr_seed": 5}))
    monkeypatch.setenv("UFP4_RECIPE", str(path))
    policy = policy_from_env()
    assert policy.rules[0][1].name == "e2m1" and policy.seeds.seed == 5
    path.write_text(json.dumps({"recipes": "ufp4"}))
    with pytest.raises(ValueError, match="unknown keys"):
        policy_from_env()


def test_spec_rewrite_refuses_a_spec_without_megatron_local_linears():
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_layer import (
        TransformerLayer,
        TransformerLayerSubmodules,
    )

    empty = ModuleSpec(module=TransformerLayer, submodules=TransformerLayerSubmodules())
    with pytest.raises(TypeError, match="local spec"):
        ufp4_block_spec(empty, _config(), UFP4Policy("ufp4"), pp_rank=0)

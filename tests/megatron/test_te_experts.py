"""megatron/te_experts.py without TransformerEngine: the extra-state decoder the TE route's
grouped expert linears use, and the spec walk that puts them in. That TE's grouped experts
then save and load a custom-recipe checkpoint is a GPU claim (gpu/te_check.sh)."""

from __future__ import annotations

import functools
import io
import os
import pickle
from collections import namedtuple

import pytest
import torch
from megatron.core.safe_globals import SafeUnpickler
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.moe.experts import GroupedMLPSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec

from ufp4_megatron.megatron import te_experts
from ufp4_megatron.quant.recipe import get_recipe
from ufp4_megatron.te import factory_path, resolve
from ufp4_megatron.te.factories import CHECKPOINT_GLOBALS


def _as_tensor(obj) -> torch.Tensor:
    """What TEGroupedLinear._encode_extra_state makes (TE >= 2): the pickle as a byte tensor."""
    return torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)


def _not_called(state):
    raise AssertionError(f"fallback called for {type(state)}")


def test_extra_state_with_the_plugins_factory_decodes_to_the_same_factory():
    registered = factory_path(get_recipe("ufp4", rht_size=None)).rsplit(".", 1)[1]
    for name in ("ufp4", "e2m1", "ufp4_no_sr", registered):
        factory = resolve(name)
        state = {"extra_fp8_variables": {"num_gemms": 4}, "qfactory": factory}
        out = te_experts.decode_extra_state(_as_tensor(state), _not_called)
        assert out["qfactory"] is factory and out["extra_fp8_variables"] == {"num_gemms": 4}


def test_megatrons_own_allowlist_refuses_the_factory():
    """Why the subclasses exist: Megatron-Core's SafeUnpickler has no custom recipe entries."""
    data = pickle.dumps({"qfactory": resolve("ufp4")})
    with pytest.raises(pickle.UnpicklingError, match="ufp4_megatron.te.factories.resolve"):
        SafeUnpickler(io.BytesIO(data)).load()
    assert not CHECKPOINT_GLOBALS & SafeUnpickler._SAFE_CLASSES


@pytest.mark.parametrize(
    "planted",
    [
        os.getcwd,  # any other callable
        factory_path,  # another function of the plugin's TE module
        functools.partial(print, "x"),
    ],
    ids=["os", "plugin-function", "partial"],
)
def test_extra_state_naming_anything_else_is_refused(planted):
    with pytest.raises(pickle.UnpicklingError, match="Refusing to unpickle"):
        te_experts.decode_extra_state(_as_tensor({"recipe": planted}), _not_called)


def test_empty_state_is_none_and_other_forms_go_to_megatrons_decoder():
    assert te_experts.decode_extra_state(torch.empty(0, dtype=torch.uint8), _not_called) is None
    seen = []
    buffer = io.BytesIO()
    assert te_experts.decode_extra_state(buffer, lambda s: seen.append(s) or "megatron's") == (
        "megatron's"
    )
    assert seen == [buffer]


class _Column:  # stand-ins for TE's grouped linear classes: the walk only matches identity
    pass


class _Row:
    pass


class _NewColumn(_Column):
    pass


class _NewRow(_Row):
    pass


def test_swap_reaches_the_grouped_linears_wherever_the_spec_puts_them():
    mapping = {_Column: _NewColumn, _Row: _NewRow}
    experts = ModuleSpec(
        module=object, submodules=GroupedMLPSubmodules(linear_fc1=_Column, linear_fc2=_Row)
    )
    Pair = namedtuple("Pair", "a b")
    spec = [
        ModuleSpec(module=dict, submodules={"unchanged": _Column}),  # dicts are not walked
        experts,
        functools.partial(object, submodules=GroupedMLPSubmodules(_Column, _Row)),
        Pair(_Row, (_Column, 3)),
    ]
    out = te_experts.swap_modules(spec, mapping)
    assert out[1].submodules == GroupedMLPSubmodules(linear_fc1=_NewColumn, linear_fc2=_NewRow)
    assert out[2].keywords["submodules"] == GroupedMLPSubmodules(_NewColumn, _NewRow)
    assert out[3] == Pair(_NewRow, (_NewColumn, 3)) and type(out[3]) is Pair
    assert out[0].submodules == {"unchanged": _Column} and out[0].module is dict
    assert experts.submodules.linear_fc1 is _Column  # the input spec is left as it was


class _GPTModelConfig:  # the shape of Megatron-LM's GPTModelConfig that te_gpt_spec reads
    def __init__(self, impl):
        self.transformer = TransformerConfig(
            num_layers=2, hidden_size=64, num_attention_heads=4, transformer_impl=impl
        )


def _experts_spec():
    return ModuleSpec(
        module=object, submodules=GroupedMLPSubmodules(linear_fc1=_Column, linear_fc2=_Row)
    )


def test_te_gpt_spec_is_megatron_lms_spec_with_checkpointable_experts(monkeypatch):
    from ufp4_megatron.megatron import spec as spec_mod

    seen = []

    def default_spec(model_config, vp_stage):
        seen.append((model_config, vp_stage))
        return [_experts_spec()]

    monkeypatch.setattr(spec_mod, "_megatron_lm_default_spec", default_spec)
    monkeypatch.setattr(te_experts, "grouped_linears", lambda: {_Column: _NewColumn, _Row: _NewRow})
    cfg = _GPTModelConfig("transformer_engine")
    for out in (te_experts.te_gpt_spec(cfg, 1), te_experts.te_gpt_spec("args", cfg, 1)):
        assert out[0].submodules == GroupedMLPSubmodules(_NewColumn, _NewRow)
    assert seen == [(cfg, 1), (cfg, 1)]


def test_te_gpt_spec_on_a_transformer_config_takes_megatron_cores_te_block(monkeypatch):
    from megatron.core.models.gpt import gpt_layer_specs

    calls = []

    def block_spec(config, use_transformer_engine, normalization, qk_l2_norm, vp_stage):
        calls.append((use_transformer_engine, normalization, vp_stage))
        return [_experts_spec()]

    monkeypatch.setattr(gpt_layer_specs, "get_gpt_decoder_block_spec", block_spec)
    monkeypatch.setattr(te_experts, "grouped_linears", lambda: {_Column: _NewColumn, _Row: _NewRow})
    config = _GPTModelConfig("transformer_engine").transformer
    out = te_experts.te_gpt_spec(config, 0)
    assert out[0].submodules.linear_fc2 is _NewRow and calls == [(True, "LayerNorm", 0)]


@pytest.mark.parametrize("as_model_config", [True, False], ids=["megatron-lm", "mcore"])
def test_te_gpt_spec_refuses_the_local_implementation(as_model_config):
    cfg = _GPTModelConfig("local")
    with pytest.raises(ValueError, match="transformer_engine") as err:
        te_experts.te_gpt_spec(cfg if as_model_config else cfg.transformer)
    assert "ufp4_gpt_spec" in str(err.value)

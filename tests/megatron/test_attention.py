"""Fused core attention (megatron/attention.py) against Megatron's DotProductAttention, and
grouped BF16 experts, on the shared 2-rank gloo launch (mcore_scenarios.attention, models).

- test_sdpa_equals_megatron_attention: same q, k, v, output gradient; MHA, GQA (2 groups),
  MQA; causal without a mask tensor, causal with Megatron's mask given, and a padding mask.
  fp32: output and dq/dk/dv within 1e-5 relative (summation order only); bf16: within 2e-2
  (bf16 rounding of probabilities and outputs in two different kernels).
- test_sdpa_gpt_matches_megatron_attention_gpt: the tiny dense GPT with SDPA and no mask
  tensor gives Megatron-attention's loss and gradients (fp32 params), at TP=1 and TP=2 (+SP).
- test_grouped_bf16_experts_match_sequential: BF16 experts through grouped GEMMs give the
  loss and gradients of Megatron's SequentialMLP (TP=1, TP=2+SP, EP=2).
- spec wiring: the trainer's block_spec puts SDPAttention (or TE, or Megatron's) in every
  layer and keeps the UFP4 rewrite; unknown backends and kernels fail with the valid choices.
"""

import functools

import pytest

pytestmark = pytest.mark.distributed


def _rel(a: dict, b: dict) -> float:
    num = sum(((a[k].double() - b[k].double()) ** 2).sum() for k in b)
    den = sum((b[k].double() ** 2).sum() for k in b)
    return float((num / den).sqrt())


@pytest.mark.parametrize("groups", (4, 2, 1))
@pytest.mark.parametrize("mask", ("causal", "causal_mask_given", "padding"))
@pytest.mark.parametrize("dtype,tol", (("float32", 1e-5), ("bfloat16", 2e-2)))
def test_sdpa_equals_megatron_attention(mcore_results, dtype, tol, mask, groups):
    errors = mcore_results["attention"][(dtype, groups, mask)]  # y, dq, dk, dv
    assert max(errors) < tol, errors


@pytest.mark.parametrize("layout", ("tp1", "tp2", "tp2sp"))
def test_sdpa_gpt_matches_megatron_attention_gpt(mcore_results, layout):
    runs = mcore_results["models"]
    ref, run = runs[("dense", "bf16", layout)], runs[("dense", "bf16", f"{layout}_sdpa")]
    assert abs(run["loss"] - ref["loss"]) <= 1e-6 * ref["loss"]
    assert _rel(run["grads"], ref["grads"]) < 1e-5
    assert run["modules"]["decoder.layers.0.self_attention.core_attention"] == "SDPAttention"


@pytest.mark.parametrize("layout", ("tp1", "tp2sp", "ep2"))
def test_grouped_bf16_experts_match_sequential(mcore_results, layout):
    runs = mcore_results["models"]
    ref, run = runs[("moe", "bf16", layout)], runs[("moe", "bf16", f"{layout}_grouped")]
    assert abs(run["loss"] - ref["loss"]) <= 1e-6 * ref["loss"]
    key = "grads" if layout != "ep2" else "grads_dp"
    assert _rel(run[key], ref[key]) < 1e-6
    assert (
        run["modules"]["decoder.layers.0.mlp.experts.linear_fc1"]
        == "UFP4ColumnParallelGroupedLinear"
    )
    assert ref["modules"]["decoder.layers.0.mlp.experts"] == "SequentialMLP"


# ----------------------------------------------------------------------------- spec wiring


def _config(**kw):
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2, **kw
    )


def _core(block, i):
    c = block.layer_specs[i].submodules.self_attention.submodules.core_attention
    return c.func if isinstance(c, functools.partial) else c


@pytest.mark.parametrize("moe", (False, True))
def test_trainer_block_spec_uses_the_chosen_attention(moe):
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from ufp4_megatron.megatron import UFP4Policy
    from ufp4_megatron.megatron.attention import SDPAttention
    from ufp4_megatron.train.model import block_spec

    kw = dict(num_moe_experts=4, moe_ffn_hidden_size=64, moe_grouped_gemm=True) if moe else {}
    config = _config(**kw)
    block = block_spec(config, UFP4Policy("ufp4"), pp_rank=0)
    assert all(_core(block, i) is SDPAttention for i in range(2))
    linear = block.layer_specs[0].submodules.self_attention.submodules.linear_qkv
    assert linear.func.__name__ == "UFP4ColumnParallelLinear"  # the UFP4 rewrite still ran
    kernels = block_spec(config, UFP4Policy("ufp4"), sdpa_kernels=["flash", "math"], pp_rank=0)
    c = kernels.layer_specs[0].submodules.self_attention.submodules.core_attention
    assert c.keywords["kernels"] == ("flash", "math")
    plain = block_spec(config, UFP4Policy("bf16"), attention_backend="megatron", pp_rank=0)
    assert _core(plain, 0) is DotProductAttention


def test_attention_backend_errors_name_the_choices():
    from ufp4_megatron.megatron.attention import core_attention_spec

    with pytest.raises(ValueError, match="valid: sdpa, te, megatron"):
        core_attention_spec("flash")
    with pytest.raises(ValueError, match="valid: flash, cudnn, efficient, math"):
        core_attention_spec("sdpa", ("fast",))
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="needs TransformerEngine"):
            core_attention_spec("te")


def test_the_trainers_check_knows_the_same_backends_and_kernels():
    """train/validate.py refuses a bad model.attention_backend / model.sdpa_kernels before
    Megatron is imported, from its own copy of the names: the two stay equal."""
    from ufp4_megatron.megatron.attention import BACKENDS, KERNELS
    from ufp4_megatron.train.validate import ATTENTION_BACKENDS, SDPA_KERNELS

    assert ATTENTION_BACKENDS == BACKENDS and tuple(KERNELS) == SDPA_KERNELS


def test_sdpa_refuses_what_it_does_not_implement():
    from megatron.core.transformer.enums import AttnMaskType

    from ufp4_megatron.megatron.attention import SDPAttention

    with pytest.raises(ValueError, match="window_size"):
        SDPAttention(
            _config(window_size=(8, 0)), 1, AttnMaskType.causal, "self", pg_collection=object()
        )

"""Contracts of the UFP4 parallel linears and experts, checked on 2 gloo ranks (TP=2 +- SP).

- test_bf16_recipe_matches_megatron_linear_bitwise: with a recipe that quantizes nothing, the
  UFP4 autograd function reproduces Megatron's LinearWithGradAccumulation... exactly (y, dx,
  dW, db), so its communication (SP gather, dgrad all-reduce / reduce-scatter) is Megatron's.
- test_tp2_layer_matches_quantized_linear_on_full_tensors: a TP=2 UFP4 linear equals the
  single-device `quantized_linear` on the unsharded tensors with the same seed, up to fp32
  accumulation order (1e-6); a different SR seed moves dW by ~0.16, so SR bits are shared.
- test_grad_accumulation_fusion_accumulates_into_main_grad: wgrad added into main_grad,
  weight.grad left None, without apex.
- test_shard_of_partial_blocks_raises_clear_error: K/TP not a multiple of the block.
- test_grouped_experts_match_sequential_experts_bitwise (RTNE, SR on dY, SR on every operand:
  the two hosts key each expert's SR bits alike and draw one seed per role and forward),
  test_empty_expert_..., test_sequential_experts_know_their_global_index: the two hosts;
  test_grouped_experts_checkpoint_weights_layout_equals_sequential: their distributed checkpoints hold
  the same expert weights (sharded keys, global shapes, the global box of every expert under
  EP=2, EP=2 with SwiGLU, expert-TP=2 with SwiGLU); the grouped linears save their stacked
  parameter itself; test_grouped_checkpoint_loads_into_sequential_experts_and_back: a real
  dist_checkpointing save/load between the two hosts restores every parameter exactly.
"""

import pytest

pytestmark = pytest.mark.distributed

LAYOUTS = ("tp2", "tp2sp")
KINDS = ("column", "row")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", KINDS)
def test_bf16_recipe_matches_megatron_linear_bitwise(mcore_results, layout, kind):
    assert mcore_results["layers"][layout][(kind, "bf16_vs_megatron_maxabs")] == 0.0


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", KINDS)
def test_tp2_layer_matches_quantized_linear_on_full_tensors(mcore_results, layout, kind):
    rel = mcore_results["layers"][layout][(kind, "ufp4_rel")]
    assert max(rel.values()) < 1e-6, rel
    assert rel["dw"] == 0.0  # wgrad is not reduced across ranks: bitwise
    assert mcore_results["layers"][layout][(kind, "ufp4_other_seed_rel_dw")] > 0.05


def test_grad_accumulation_fusion_accumulates_into_main_grad(mcore_results):
    fusion = mcore_results["layers"]["fusion"]
    assert fusion["weight_grad_is_none"]
    assert fusion["main_grad_rel"] < 1e-6


def test_shard_of_partial_blocks_raises_clear_error(mcore_results):
    message = mcore_results["layers"]["divisibility"]
    assert "24 is not a multiple of 16" in message and "TP" in message


@pytest.mark.parametrize("rounding", ("rtne", "sr", "sr_all"))
def test_grouped_experts_match_sequential_experts_bitwise(mcore_results, rounding):
    experts = mcore_results["layers"]["experts"][rounding]  # y, dx, dW of fc1 and fc2
    assert experts["grouped_vs_sequential_maxabs"] == 0.0
    # one draw per role (fc1, fc2) and forward in both hosts: the same stream position
    assert (
        experts["draws"]["seq"]
        == experts["draws"]["grp"]
        == ([0, 0] if rounding == "rtne" else [1, 1])
    )
    if rounding != "rtne":
        assert experts["dx_vs_rtne_maxabs"] > 0  # SR is on: the equality above is not RTNE's


@pytest.mark.parametrize("rounding", ("rtne", "sr"))
def test_empty_expert_and_uneven_token_counts_work(mcore_results, rounding):
    experts = mcore_results["layers"]["experts"][rounding]  # tokens per expert: 0, 5, 17, 10
    assert experts["all_finite"]
    assert experts["empty_expert_wgrad_maxabs"] == 0.0


def test_sequential_experts_know_their_global_index(mcore_results):
    assert mcore_results["layers"]["experts"]["sr"]["expert_indices"] == [0, 1, 2, 3]


@pytest.mark.parametrize("layout", ("ep2", "ep2_glu", "tp2sp_glu"))
def test_grouped_experts_checkpoint_weights_layout_equals_sequential(mcore_results, layout):
    layouts = mcore_results["checkpoint"]  # rank 0: 2 layers x 2 or 4 local experts x fc1/fc2
    seq, grp = layouts[(layout, "sequential")], layouts[(layout, "grouped")]
    assert len(seq) == {"ep2": 8, "ep2_glu": 12, "tp2sp_glu": 24}[layout]  # glu: fc1 halves
    assert grp == seq
    assert all(layouts[(layout, "grouped_data_is_param")])  # one stacked parameter per linear
    assert len(layouts[(layout, "grouped_data_is_param")]) == 4


def test_grouped_checkpoint_loads_into_sequential_experts_and_back(mcore_results):
    trip = mcore_results["checkpoint_roundtrip"]
    if trip is None:
        pytest.skip("dist_checkpointing needs psutil")
    assert trip["grouped_to_sequential"] == 0.0 and trip["sequential_to_grouped"] == 0.0
    assert all(trip["same_names"])


def test_sr_seeds_drawn_only_by_forwards_that_will_backward_with_sr(mcore_results):
    seeds = mcore_results["seeds"]  # (draws after a no-grad forward, after a grad forward)
    assert seeds["sr"] == (0, 1)
    assert seeds["no_sr"] == (0, 0)


def test_sr_forward_refuses_under_cuda_graph_capture(mcore_results):
    capture = mcore_results["seeds"]["capture"]
    assert capture["sr"].startswith("stochastic rounding inside a CUDA graph: its seed is a host")
    assert capture["no_sr"] is None  # RTNE everywhere: nothing drawn, nothing refused


@pytest.mark.parametrize("model", ("", "moe_", "moe_grouped_"))  # dense; SequentialMLP; grouped
def test_restoring_sr_seed_state_resumes_bit_exactly(mcore_results, model):
    seeds = mcore_results["seeds"]
    assert seeds[model + "resumed"] == 0.0
    assert seeds[model + "fresh"] > 0.0  # without the saved state, step 2 draws other SR bits

"""A tiny GPT (2 layers, hidden 64) and a tiny MoE GPT (4 experts, top-2, shared expert), fp32
parameters, one forward/backward, compared across parallel layouts on 2 gloo ranks, all
starting from the same full weights.

Tolerances (relative L2 norm over all gradients; losses compared absolutely):
- bf16 (Megatron's own linears): loss bitwise, grads 1e-6 (fp32 summation order only).
- e2m1 / ufp4 under TP=2 (+SP): loss 1e-6, grads 5e-3. SR bits are those of TP=1 (layer tests
  show the layer is exact); what remains is fp32 summation order in reductions flipping an
  occasional rounding decision downstream (observed 2e-7 for ufp4, 4e-4 for e2m1). A different
  SR seed moves the gradients by ~0.13 (test_sr_noise_is_far_above_tp_tolerance).
- EP=2 vs EP=1: forward quantization is per token, so the loss stays within 1e-6; an EP=2
  expert keys both ranks' tokens as one segment while EP=1 replicas key theirs per DP rank,
  so quantized gradients agree only to SR-noise level (< 0.3, against ~0.13 between two
  seeds); bf16 grads 1e-6.
- grouped experts vs SequentialMLP (ufp4, TP=1): both hosts key SR per expert alike and draw
  one seed per role and forward (so every other linear's seed agrees too): the whole model's
  loss and gradients are bitwise equal.
"""

import pytest

pytestmark = pytest.mark.distributed

QUANT_TOL = 5e-3


def _rel(a: dict, b: dict) -> float:
    num = sum(((a[k].double() - b[k].double()) ** 2).sum() for k in b)
    den = sum((b[k].double() ** 2).sum() for k in b)
    assert a.keys() == b.keys()
    return float((num / den).sqrt())


CASES = [
    (m, r, lay)
    for r in ("bf16", "e2m1", "ufp4")
    for m, lay in (("dense", "tp2"), ("dense", "tp2sp"), ("moe", "tp2sp"))
]
# SwiGLU's fc1 is partitioned with stride 2 ([gate_r; up_r] per rank): SR keys per chunk
CASES += [("dense_glu", r, "tp2sp") for r in ("bf16", "ufp4")]


@pytest.mark.parametrize("model,recipe,layout", CASES)
def test_tp2_matches_tp1(mcore_results, model, recipe, layout):
    runs = mcore_results["models"]
    ref, run = runs[(model, recipe, "tp1")], runs[(model, recipe, layout)]
    tol = 1e-6 if recipe == "bf16" else QUANT_TOL
    assert abs(run["loss"] - ref["loss"]) <= 1e-6 * ref["loss"]
    assert _rel(run["grads"], ref["grads"]) < tol


@pytest.mark.parametrize("recipe", ("bf16", "e2m1", "ufp4"))
def test_moe_ep2_matches_ep1(mcore_results, recipe):
    runs = mcore_results["models"]
    ref, run = runs[("moe", recipe, "tp1")], runs[("moe", recipe, "ep2")]
    assert abs(run["loss"] - ref["loss"]) <= 1e-6 * ref["loss"]
    assert _rel(run["grads_dp"], ref["grads_dp"]) < (1e-6 if recipe == "bf16" else 0.3)


def test_sr_noise_is_far_above_tp_tolerance(mcore_results):
    runs = mcore_results["models"]
    other_seed = _rel(
        runs[("dense", "ufp4", "tp1_seed8")]["grads"], runs[("dense", "ufp4", "tp1")]["grads"]
    )
    assert other_seed > 20 * QUANT_TOL


def test_quantized_recipes_change_the_gradients(mcore_results):
    runs = mcore_results["models"]
    for recipe in ("e2m1", "ufp4"):
        assert (
            _rel(runs[("dense", recipe, "tp1")]["grads"], runs[("dense", "bf16", "tp1")]["grads"])
            > 1e-3
        )


def test_grouped_experts_model_matches_sequential(mcore_results):
    runs = mcore_results["models"]
    grouped, seq = runs[("moe", "ufp4", "tp1_grouped")], runs[("moe", "ufp4", "tp1")]
    assert abs(grouped["loss"] - seq["loss"]) <= 1e-6 * seq["loss"]
    assert _rel(grouped["grads"], seq["grads"]) == 0.0  # same SR bits, same products (CPU)
    assert grouped["modules"]["decoder.layers.0.mlp.experts"] == "TEGroupedMLP"
    assert (
        grouped["modules"]["decoder.layers.0.mlp.experts.linear_fc1"]
        == "UFP4ColumnParallelGroupedLinear"
    )


@pytest.mark.parametrize("layout", ("tp2sp", "ep2"))
def test_grouped_experts_model_tp_and_ep_invariance(mcore_results, layout):
    runs = mcore_results["models"]
    ref, run = runs[("moe", "ufp4", "tp1_grouped")], runs[("moe", "ufp4", f"{layout}_grouped")]
    assert abs(run["loss"] - ref["loss"]) <= 1e-6 * ref["loss"]
    if layout == "tp2sp":
        assert _rel(run["grads"], ref["grads"]) < QUANT_TOL
    else:
        assert _rel(run["grads_dp"], ref["grads_dp"]) < 0.3


def test_lm_head_router_embeddings_stay_megatron_bf16(mcore_results):
    modules = mcore_results["models"][("moe", "ufp4", "tp1")]["modules"]
    assert modules["output_layer"] == "ColumnParallelLinear"
    assert modules["embedding.word_embeddings"] == "VocabParallelEmbedding"
    for layer in (0, 1):
        assert modules[f"decoder.layers.{layer}.mlp.router"] == "TopKRouter"
    ufp4 = {n for n, t in modules.items() if t.startswith("UFP4")}
    expected = {
        f"decoder.layers.{i}.{s}"
        for i in (0, 1)
        for s in (
            "self_attention.linear_qkv",
            "self_attention.linear_proj",
            "mlp.experts",
            "mlp.shared_experts.linear_fc1",
            "mlp.shared_experts.linear_fc2",
        )
    }
    expected |= {
        f"decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc{k}"
        for i in (0, 1)
        for e in range(4)
        for k in (1, 2)
    }
    assert ufp4 == expected


def test_first_and_last_layers_stay_bf16(mcore_results):
    modules = mcore_results["bf16_layers"]
    ufp4_layers = {n.split(".")[2] for n, t in modules.items() if t.startswith("UFP4")}
    assert ufp4_layers == {"1"}
    assert modules["decoder.layers.0.self_attention.linear_qkv"] == "ColumnParallelLinear"
    assert modules["decoder.layers.2.mlp.experts"] == "SequentialMLP"


@pytest.mark.parametrize("model", ("dense", "moe"))
def test_megatron_lm_entry_point_builds_ufp4_model_from_env(mcore_results, model):
    entry = mcore_results["entry_point"]  # UFP4_RECIPE=e2m1
    assert entry["policy"] == "e2m1"
    linears = entry[model]
    assert "decoder.layers.1.self_attention.linear_qkv" in linears
    assert all(
        "recipe=e2m1" in desc
        for name, desc in linears.items()
        if name.rsplit(".", 1)[-1].startswith("linear_")
    )
    if model == "moe":
        assert "decoder.layers.0.mlp.shared_experts.linear_fc2" in linears

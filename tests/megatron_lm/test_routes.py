"""Which linears pretrain_gpt.py's model gets, route by route (probe.py, through the real
parse_and_validate_args -> gpt_config_from_args -> GPTModelBuilder.build_model).

Contracts (model: the documented 4-layer GPT, 17 parallel linears = 4 per layer + LM head):
- stock Megatron-LM: no --spec builds Megatron's own linears (0/17 UFP4); `--spec ufp4_megatron.
  megatron.spec ufp4_gpt_spec` builds 16/17 with the recipe of UFP4_RECIPE (default ufp4, a
  preset, bf16 = stock, a JSON policy), MoE experts too; an unknown recipe and a TE impl
  without TE fail with their reason; the --fp4-* flags do not exist there.
- patched (patches/0001): no flag = stock; --fp4-recipe ufp4 builds 16/17 with exactly the
  recipe of the matching preset (e1m2 = ufp4, int4 = ufp4_int4, e2m1 = e2m1) and every knob
  is the plugin's ablation override; args.fp4 / TransformerConfig.fp4 stay unset (no TE FP4
  path); every invalid combination stops at parsing or validation naming the flag.
- both routes build the same model for the same recipe.
"""

import pytest
from conftest import CHECKOUT, FLAGS, NEEDS_CHECKOUT, PATCHED, base_argv, run_probe

from ufp4_megatron import get_recipe

UFP4_LINEARS = 16
LINEARS = 17


def _recipes(result) -> dict[str, str | None]:
    return {path: v[1] for path, v in result["linears"].items()}


def _describe(result) -> set[str]:
    """The recipe description of the UFP4 linears, without the name line."""
    return {"\n".join(v[2].splitlines()[1:]) for v in result["linears"].values() if v[2]}


def _body(recipe) -> str:
    return "\n".join(recipe.describe().splitlines()[1:])


def test_probe_runs_the_megatron_under_test(stock_results, patched_results):
    for results in (stock_results, patched_results):
        meta = results["_meta"]
        assert meta["megatron_core"].split("+")[0] == ("0.19.1" if CHECKOUT else "0.19.2")
        assert meta["pretrain_gpt"] is (CHECKOUT is not None)
    assert "patched" in patched_results["_meta"]["megatron_core_file"]


@NEEDS_CHECKOUT
def test_checkout_is_core_r0_19_0_and_imports_pretrain_gpt(stock_results):
    assert stock_results["_meta"]["megatron_core_file"].startswith(str(CHECKOUT))


def test_stock_without_spec_builds_megatron_linears(stock_results):
    r = stock_results["bf16"]
    assert r["stage"] == "ok" and r["builder"] == "GPTModelBuilder" and r["spec"] is None
    assert len(r["linears"]) == LINEARS and r["ufp4"] == 0
    assert {v[0] for v in r["linears"].values()} == {"ColumnParallelLinear", "RowParallelLinear"}


@pytest.mark.parametrize(
    "case, recipe", [("spec-ufp4", "ufp4"), ("spec-default", "ufp4"), ("spec-e2m1", "e2m1")]
)
def test_spec_route_on_stock_builds_ufp4_linears(stock_results, case, recipe):
    r = stock_results[case]
    assert r["stage"] == "ok" and r["spec"] == "ufp4_gpt_spec"
    assert len(r["linears"]) == LINEARS and r["ufp4"] == UFP4_LINEARS
    recipes = _recipes(r)
    assert recipes.pop("output_layer") is None  # the LM head stays BF16
    assert set(recipes.values()) == {recipe}
    assert _describe(r) == {_body(get_recipe(recipe))}


def test_spec_route_bf16_is_the_stock_model(stock_results):
    assert stock_results["spec-bf16"]["linears"] == stock_results["bf16"]["linears"]


def test_spec_route_reads_a_json_policy(stock_results):
    recipes = _recipes(stock_results["spec-json"])  # layer 0 bf16, then every fc2 e2m1
    assert all(
        recipes[f"decoder.layers.0.{p}"] is None
        for p in (
            "self_attention.linear_qkv",
            "self_attention.linear_proj",
            "mlp.linear_fc1",
            "mlp.linear_fc2",
        )
    )
    for i in (1, 2, 3):
        assert recipes[f"decoder.layers.{i}.mlp.linear_fc2"] == "e2m1"
        assert recipes[f"decoder.layers.{i}.mlp.linear_fc1"] == "ufp4"


def test_spec_route_builds_ufp4_experts(stock_results):
    r = stock_results["spec-moe"]
    assert r["stage"] == "ok"
    experts = {p: v for p, v in r["linears"].items() if ".mlp.experts." in p}
    assert len(experts) == 4 * 4 * 2 and {v[1] for v in experts.values()} == {"ufp4"}
    assert r["ufp4"] == 4 * (2 + 4 * 2)  # attention qkv/proj + 4 experts x fc1/fc2 per layer


@pytest.mark.parametrize(
    "case, stage, message",
    [
        ("spec-unknown", "build", "unknown recipe 'ufp5'; valid: bf16, e2m1, ufp4"),
        (
            "spec-te-absent",
            "build",
            "needs TransformerEngine, which is not installed: pass --transformer-impl local",
        ),
        ("stock-refuses-flags", "parse", "argument --fp4-recipe: invalid choice: 'ufp4'"),
    ],
)
def test_stock_refusals(stock_results, case, stage, message):
    r = stock_results[case]
    assert r["stage"] == stage and message in r["error"], r


def test_patched_without_flags_is_stock(patched_results, stock_results):
    r = patched_results["plain"]
    assert r["stage"] == "ok" and r["spec"] is None
    assert r["linears"] == stock_results["bf16"]["linears"]


@pytest.mark.parametrize(
    "case, fmt, preset",
    [
        ("flags-ufp4", "e1m2", "ufp4"),
        ("flags-int4", "int4", "ufp4_int4"),
        ("flags-e2m1", "e2m1", "e2m1"),
    ],
)
def test_flags_build_the_preset_of_their_format(patched_results, case, fmt, preset):
    r = patched_results[case]
    assert r["stage"] == "ok" and r["ufp4"] == UFP4_LINEARS and len(r["linears"]) == LINEARS
    assert set(_recipes(r).values()) == {preset, None}
    assert _describe(r) == {_body(get_recipe(preset))}
    # the format left args.fp4, so Megatron's TE FP4 paths never see it
    assert r["args"] == {"fp4": None, "fp4_recipe": "ufp4", "ufp4_format": fmt}
    assert r["config_fp4"] is None


@pytest.mark.parametrize(
    "case, preset, overrides",
    [
        ("rht-none", "ufp4", {"rht": ()}),
        ("rht-wgrad", "ufp4", {"rht": ("wgrad",)}),
        ("rht-dgrad-wgrad", "ufp4", {"rht": ("dgrad", "wgrad")}),
        ("rht-fprop-wgrad", "ufp4", {"rht": ("fprop", "wgrad")}),
        ("block-32", "ufp4", {"block": 32}),
        ("no-sr", "ufp4", {"sr": ()}),
        ("e2m1-all", "e2m1", {"rht": ("fprop", "dgrad", "wgrad"), "block": 32, "sr": ()}),
    ],
)
def test_flag_knobs_are_the_plugins_ablations(patched_results, case, preset, overrides):
    r = patched_results[case]
    assert r["stage"] == "ok" and r["ufp4"] == UFP4_LINEARS
    assert _describe(r) == {_body(get_recipe(preset, **overrides))}


def test_flags_build_ufp4_experts(patched_results, stock_results):
    assert patched_results["flags-moe"]["linears"] == stock_results["spec-moe"]["linears"]


def test_both_routes_build_the_same_model(patched_results, stock_results):
    assert patched_results["flags-ufp4"]["linears"] == stock_results["spec-ufp4"]["linears"]
    assert patched_results["flags-e2m1"]["linears"] == stock_results["spec-e2m1"]["linears"]
    assert patched_results["spec-on-patched"]["linears"] == stock_results["spec-e2m1"]["linears"]


REFUSED = {  # case: (stage, message)
    "bad-format": ("parse", "argument --fp4-format: invalid choice: 'e3m0'"),
    "bad-rht": ("parse", "argument --fp4-rht: invalid choice: 'bprop'"),
    "e1m2-without-ufp4": ("validate", "--fp4-format e1m2 needs --fp4-recipe ufp4"),
    "int4-without-ufp4": ("validate", "--fp4-format int4 needs --fp4-recipe ufp4"),
    "knob-without-ufp4": ("validate", "--fp4-block: only with --fp4-recipe ufp4"),
    "rht-without-ufp4": ("validate", "--fp4-rht: only with --fp4-recipe ufp4"),
    "ufp4-without-format": ("validate", "--fp4-recipe ufp4 needs --fp4-format"),
    "block-zero": ("validate", "--fp4-block 0: a block length is a positive integer"),
    "rht-none-and-gemm": ("validate", "--fp4-rht none fprop: give distinct GEMMs"),
    "rht-twice": ("validate", "--fp4-rht fprop fprop: give distinct GEMMs"),
    "param-gather": ("validate", "--fp4-param-gather is not supported with --fp4-recipe ufp4"),
    "with-fp8": ("validate", "--fp4-recipe ufp4 and --fp8-format cannot be combined"),
    "with-spec": ("validate", "drop --spec, or drop the --fp4-* flags"),
    "with-env": ("validate", "UFP4_RECIPE=e2m1 is set, but --fp4-recipe ufp4 takes its recipe"),
    "te-absent": (
        "validate",
        "needs TransformerEngine, which is not installed: pass --transformer-impl local",
    ),
    "inference-impl": ("validate", "--transformer-impl inference_optimized: UFP4 rewrites"),
    "nvfp4-needs-te": ("validate", "--fp4-format requires Transformer Engine >= 2.7.0.dev0"),
}


def test_every_refusal_case_is_checked():
    assert set(REFUSED) == {n for n in PATCHED if n not in _BUILT}


_BUILT = {
    "plain",
    "flags-ufp4",
    "flags-int4",
    "flags-e2m1",
    "rht-none",
    "rht-wgrad",
    "rht-dgrad-wgrad",
    "rht-fprop-wgrad",
    "block-32",
    "no-sr",
    "e2m1-all",
    "flags-moe",
    "spec-on-patched",
}


def test_hybrid_models_refuse_the_flags(patched_results):
    r = patched_results["hybrid-refuses-flags"]
    assert r["stage"] == "config" and "hybrid models have no UFP4 spec" in r["error"], r


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_patched_refusals_name_the_flag(patched_results, case):
    stage, message = REFUSED[case]
    r = patched_results[case]
    assert r["stage"] == stage and message in r["error"], r


def test_flags_without_the_plugin_say_how_to_install_it(patched_root, tmp_path):
    shadow = tmp_path / "shadow" / "ufp4_megatron"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'ufp4_megatron'\")\n"
    )
    r = run_probe(
        "validate",
        patched_root,
        [{"name": "no-plugin", "argv": base_argv() + FLAGS + ["e1m2"]}],
        tmp_path,
        pythonpath=(shadow.parent,),
    )["no-plugin"]
    assert r["stage"] == "validate"
    assert (
        "needs the ufp4-megatron plugin, which does not import (No module named "
        "'ufp4_megatron'): pip install ufp4-megatron" in r["error"]
    )

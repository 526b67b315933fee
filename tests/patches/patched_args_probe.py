"""Run with the patched scratch copy of Megatron first on sys.path (see test_patches.py).

Parses and validates Megatron-LM command lines with the patched megatron.training.arguments,
builds TransformerConfig from them, and builds the layer spec through the patched
gpt_builders; prints one JSON object {case: outcome}. One process, because importing
megatron.training takes tens of seconds.
"""
import json
import os
import sys
import typing

if sys.version_info < (3, 12):  # megatron/training uses typing.override (3.12); same object
    import typing_extensions
    typing.override = typing_extensions.override

import warnings

warnings.filterwarnings("ignore")

import megatron.training.arguments as arguments  # noqa: E402
from megatron.training.arguments import parse_args, validate_args  # noqa: E402
from megatron.training.argument_utils import core_transformer_config_from_args  # noqa: E402

BASE = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "64", "--max-position-embeddings", "64", "--micro-batch-size", "1",
        "--global-batch-size", "2", "--train-iters", "2", "--lr", "1e-4", "--mock-data",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", "128",
        "--transformer-impl", "local"]

CASES = {
    "plain": [],
    "ufp4_defaults": ["--fp4-recipe", "ufp4", "--fp4-format", "e1m2"],
    "ufp4_knobs": ["--fp4-recipe", "ufp4", "--fp4-format", "int4", "--fp4-block", "32",
                   "--fp4-rht", "fprop", "wgrad", "--no-fp4-sr-dy"],
    "ufp4_e2m1_baseline": ["--fp4-recipe", "ufp4", "--fp4-format", "e2m1", "--fp4-rht", "wgrad"],
    "ufp4_no_rht": ["--fp4-recipe", "ufp4", "--fp4-format", "e1m2", "--fp4-rht", "none"],
    "bad_format_choice": ["--fp4-recipe", "ufp4", "--fp4-format", "e3m0"],
    "bad_rht_choice": ["--fp4-recipe", "ufp4", "--fp4-format", "e1m2", "--fp4-rht", "bprop"],
    "e1m2_without_ufp4": ["--fp4-format", "e1m2"],
    "knob_without_ufp4": ["--fp4-format", "e2m1", "--fp4-block", "32"],
    "ufp4_without_format": ["--fp4-recipe", "ufp4"],
    "ufp4_block_zero": ["--fp4-recipe", "ufp4", "--fp4-format", "e1m2", "--fp4-block", "0"],
    "ufp4_rht_none_and_gemm": ["--fp4-recipe", "ufp4", "--fp4-format", "e1m2",
                               "--fp4-rht", "none", "fprop"],
    "ufp4_param_gather": ["--fp4-recipe", "ufp4", "--fp4-format", "e1m2", "--fp4-param-gather",
                          "--use-distributed-optimizer"],
    "ufp4_with_te_impl": ["--fp4-recipe", "ufp4", "--fp4-format", "e1m2",
                          "--transformer-impl", "transformer_engine"],
    "nvfp4_needs_te": ["--fp4-format", "e2m1"],
}


def run(extra):
    sys.argv = ["pretrain_gpt.py", *BASE, *extra]
    try:
        args = parse_args()
    except SystemExit as e:
        return {"stage": "parse", "error": f"SystemExit({e.code})"}
    try:
        validate_args(args)
    except (ValueError, AssertionError) as e:
        return {"stage": "validate", "error": str(e)}
    try:
        config = core_transformer_config_from_args(args)
    except (ValueError, AssertionError) as e:
        return {"stage": "config", "error": str(e)}
    keys = ("fp4", "fp4_recipe", "fp4_block", "fp4_rht", "fp4_sr_dy")
    return {"stage": "ok", "config": {k: getattr(config, k) for k in keys}, "_config": config,
            "_args": args}


results = {name: run(extra) for name, extra in CASES.items()}

# TransformerConfig validates the same without the command line (library users).
from megatron.core.transformer import TransformerConfig  # noqa: E402

for name, kwargs in {"config_e1m2_without_ufp4": {"fp4": "e1m2"},
                     "config_knob_without_ufp4": {"fp4": "e2m1", "fp4_rht": ["wgrad"]},
                     "config_ufp4": {"fp4": "int4", "fp4_recipe": "ufp4", "fp4_block": 8}}.items():
    try:
        TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, **kwargs)
        results[name] = {"stage": "ok"}
    except ValueError as e:
        results[name] = {"stage": "config", "error": str(e)}

out = {name: {k: v for k, v in res.items() if not k.startswith("_")}
       for name, res in results.items()}
# The routing (patch 0002) needs Megatron-LM's gpt_builders.py (not in the wheel).
if not os.path.exists("gpt_builders.py"):
    print("PROBE_JSON " + json.dumps(out))
    sys.exit(0)

# gpt_builders picks the plugin's spec for --fp4-recipe ufp4.
import torch.distributed as dist  # noqa: E402
from megatron.core import parallel_state as ps  # noqa: E402

import socket  # noqa: E402

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
ps.initialize_model_parallel()
import gpt_builders  # noqa: E402

built = {}
gpt_builders.GPTModel = lambda **kw: kw  # capture the spec instead of building the model
for name in ("ufp4_knobs", "ufp4_defaults", "plain"):
    res = results[name]
    res["_args"].padded_vocab_size = 128
    kw = gpt_builders.gpt_builder(res["_args"], True, True, config=res["_config"])
    spec = kw["transformer_layer_spec"]
    linears = []
    for layer in getattr(spec, "layer_specs", []):
        qkv = layer.submodules.self_attention.submodules.linear_qkv
        binding = qkv.keywords.get("ufp4") if hasattr(qkv, "keywords") else None
        linears.append(None if binding is None else binding.recipe.describe())
    built[name] = {"type": type(spec).__name__, "qkv_recipes": linears}

# --spec with a callable builder (ufp4_gpt_spec reads UFP4_RECIPE, default "ufp4").
args = results["plain"]["_args"]
args.spec = ["ufp4_megatron.megatron.spec", "ufp4_gpt_spec"]
kw = gpt_builders.gpt_builder(args, True, True, config=results["plain"]["_config"])
spec = kw["transformer_layer_spec"]
qkv = spec.layer_specs[0].submodules.self_attention.submodules.linear_qkv
built["spec_callable"] = {"type": type(spec).__name__,
                          "qkv_recipes": [qkv.keywords["ufp4"].recipe.name]}

out["built"] = built
print("PROBE_JSON " + json.dumps(out))

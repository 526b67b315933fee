"""docs/megatron-lm.md's TransformerEngine route: the commands gpu/te_check.sh runs, as stock
Megatron-LM parses them, on CPU.

Each `<!-- megatron-lm-te-run: NAME -->` block, after the `common` block, is expanded by bash;
every pretrain_gpt.py argv goes through Megatron-LM's own parse_args (the megatron-core
wheel's megatron/training, or MEGATRON_LM_DIR's): TE's layers, Megatron's custom FP4 recipe,
and a quantizer factory that Megatron-Core's resolver turns into the plugin's factory for the
named recipe. Whether TE then trains with it is for gpu/te_check.sh on a GPU (validate_args
needs TransformerEngine installed); how that script judges its runs is checked here on made-up
logs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

from conftest import HERE, ROOT, te_documented_commands

PARSE = """
import json, sys, typing, warnings
if sys.version_info < (3, 12):
    import typing_extensions
    typing.override = typing_extensions.override
warnings.filterwarnings("ignore")
from megatron.training.arguments import parse_args
out = []
for argv in json.load(open(sys.argv[1])):
    sys.argv = ["pretrain_gpt.py", *argv]
    a = parse_args()
    out.append({k: getattr(a, k, None) for k in ("transformer_impl", "fp4", "fp4_recipe",
                "fp4_quantizer_factory", "save", "load", "exit_interval", "spec",
                "num_experts", "moe_grouped_gemm")})
print("PARSED " + json.dumps(out))
"""


def _te_tool():
    sys.path.insert(0, str(ROOT / "gpu"))
    spec = importlib.util.spec_from_file_location(
        "gpu_te_megatron_lm", ROOT / "gpu" / "te_megatron_lm.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_te_route_commands_parse_as_megatron_lm_reads_them(tmp_path):
    from megatron.core.fp8_utils import _resolve_callable_from_python_import_path as resolve

    from ufp4_megatron.quant.recipe import PRESETS

    runs = _te_tool().te_runs()  # what gpu/te_megatron_lm.py runs
    assert [n for n, _ in runs] == ["te-ufp4", "te-bf16", "te-e2m1", "te-resume", "te-moe-resume"]
    cmds = [(c["run"], c) for c in te_documented_commands()]
    assert [n for n, _ in cmds] == [
        "te-ufp4",
        "te-bf16",
        "te-e2m1",
        "te-resume",
        "te-resume",
        "te-moe-resume",
        "te-moe-resume",
    ]
    argvs = [c["argv"][c["argv"].index("pretrain_gpt.py") + 1 :] for _, c in cmds]
    path = tmp_path / "argv.json"
    path.write_text(json.dumps(argvs))
    root = os.environ.get("MEGATRON_LM_DIR", "")
    res = subprocess.run(
        [sys.executable, "-c", PARSE, str(path)],
        cwd=root or HERE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, str(ROOT)]))},
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("PARSED ")]
    assert res.returncode == 0 and lines, res.stderr[-3000:]
    parsed = dict(zip(range(len(cmds)), json.loads(lines[0][len("PARSED ") :])))
    for i, (name, _) in enumerate(cmds):
        a = parsed[i]
        moe = name == "te-moe-resume"
        assert a["transformer_impl"] == "transformer_engine", (name, a)
        assert a["spec"] == (
            ["ufp4_megatron.megatron.te_experts", "te_gpt_spec"] if moe else None
        ), (name, a)
        assert (a["num_experts"], a["moe_grouped_gemm"]) == ((4, True) if moe else (None, False))
        if name == "te-bf16":
            assert a["fp4"] is None
            continue
        assert (a["fp4"], a["fp4_recipe"]) == ("e2m1", "custom"), (name, a)
        recipe = "e2m1" if name == "te-e2m1" else "ufp4"
        assert resolve(a["fp4_quantizer_factory"]).recipe is PRESETS[recipe]
    for first, second in ((parsed[3], parsed[4]), (parsed[5], parsed[6])):
        assert first["exit_interval"] == 20 and second["exit_interval"] is None
        assert first["save"] == first["load"] == second["load"]
    assert parsed[5]["save"] != parsed[3]["save"]


def _run(loss, probes, rc=0, log=""):
    return {"rc": rc, "loss": dict(loss), "ms": {}, "probes": probes, "log": log, "wall_s": 1}


def test_te_check_judges_the_runs():
    """gpu/te_megatron_lm.py's verdicts on made-up logs: what passes, and each way to fail."""
    tool = _te_tool()
    its = range(1, 31)
    base = {i: 7.0 - 0.01 * i for i in its}
    te = [{"linears": 1, "ufp4": 0, "te_linears": 16, "te_ufp4": 16, "te_recipes": {"ufp4": 16}}]
    local = [{"linears": 17, "ufp4": 16, "te_linears": 0, "te_ufp4": 0, "te_recipes": {}}]
    ufp4 = {i: v + 0.01 for i, v in base.items()}
    resumed = tool.mlm.logged_after_restart(ufp4, 20)
    results = {
        "te-ufp4": _run(ufp4, te),
        "te-bf16": _run(
            base, [{"linears": 1, "ufp4": 0, "te_linears": 16, "te_ufp4": 0, "te_recipes": {}}]
        ),
        "te-e2m1": _run(
            {i: v + 0.02 for i, v in base.items()}, [dict(te[0], te_recipes={"e2m1": 16})]
        ),
        "te-resume": _run(
            {i: resumed[i] for i in range(21, 31)},
            te + te,
            log="successfully loaded checkpoint from /c at iteration 20",
        ),
        "spec-te-ufp4": _run({i: v + (0.01 if i == 1 else 0.011) for i, v in base.items()}, local),
        "spec-te-ufp4-sr1": _run({i: v + 0.012 for i, v in base.items()}, local),
        "te-moe-resume": _run(
            base, te + te, log="successfully loaded checkpoint from /m at iteration 20"
        ),
    }
    results["te-resume"]["loss"].update({i: ufp4[i] for i in range(1, 21)})
    checks = tool.evaluate(results, 30)
    assert all(ok for _, ok, _ in checks), [c for c in checks if not c[1]]
    bad = dict(results, **{"te-ufp4": _run({i: v + 0.2 for i, v in base.items()}, te)})
    failed = {name for name, ok, _ in tool.evaluate(bad, 30) if not ok}
    assert any("within 3x the SR yardstick" in n for n in failed)
    assert any("at iteration 1" in n for n in failed)
    assert any(n.startswith("te-resume") for n in failed)
    missing = dict(
        results, **{"te-ufp4": _run(ufp4, [dict(te[0], te_ufp4=15, te_recipes={"ufp4": 15})])}
    )
    failed = {name for name, ok, _ in tool.evaluate(missing, 30) if not ok}
    assert failed == {"te-ufp4: 17 linears, 16 quantized by ufp4_megatron.te (ufp4)"}
    # the MoE run's save failing (Megatron's allowlist refusing the custom recipe) stops it
    unsaved = dict(results, **{"te-moe-resume": _run({i: base[i] for i in range(1, 20)}, te, rc=1)})
    failed = {name for name, ok, _ in tool.evaluate(unsaved, 30) if not ok}
    assert {n.split(":")[0] for n in failed} == {"te-moe-resume"} and len(failed) == 2
    # an expert linear left out of the TE route's quantizers is named
    dense_experts = dict(
        results,
        **{
            "te-moe-resume": dict(
                results["te-moe-resume"], probes=[dict(te[0], te_ufp4=14, te_recipes={"ufp4": 14})]
            )
        },
    )
    failed = {name for name, ok, _ in tool.evaluate(dense_experts, 30) if not ok}
    assert failed == {"te-moe-resume: 17 linears, 16 quantized by ufp4_megatron.te (ufp4)"}


def test_te_check_compares_the_routes_over_seeds():
    """With --seeds, the routes' trajectories are judged against the SR-only spread of every
    seed: a route that tracks the local one as closely as another SR stream does passes; one
    shifted by more than the seeds' spread fails; one seed alone is not judged this way."""
    tool = _te_tool()
    its = range(1, 31)
    blocks = tool.seeded([("te-ufp4", "torchrun x \\\n    --a b\n"), ("te-bf16", "y\n")], [7])
    assert blocks == [("te-ufp4@7", "torchrun x \\\n    --a b --seed 7\n")]

    def trio(shift, wobble, tag=""):
        base = {i: 7.0 - 0.01 * i + 0.001 * wobble for i in its}
        at = f"@{tag}" if tag else ""
        return {
            f"te-ufp4{at}": {
                i: v + shift + 0.002 * ((i + wobble) % 3 - 1) for i, v in base.items()
            },
            f"spec-te-ufp4{at}": base,
            f"spec-te-ufp4-sr1{at}": {
                i: v + 0.002 * ((i + 2 * wobble) % 3 - 1) for i, v in base.items()
            },
        }

    close = trio(0.0, 0) | trio(0.0, 1, "1235") | trio(0.0, 2, "1236")
    name, ok, detail = tool.seed_comparison(close, 30)
    assert ok and "over 3 seeds" in name, detail
    shifted = trio(0.05, 0) | trio(0.05, 1, "1235") | trio(0.05, 2, "1236")
    assert not tool.seed_comparison(shifted, 30)[1]
    assert tool.seed_comparison(trio(0.0, 0), 30) is None

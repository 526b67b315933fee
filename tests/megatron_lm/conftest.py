"""Megatron-LM roots for the probe (probe.py), and the documented command lines.

The Megatron-LM code under test is a root holding `megatron/`: the checkout named by
MEGATRON_LM_DIR (Megatron-LM core_r0.19.0, commit f8837c04ef: pretrain_gpt.py and its 0.19.1
megatron/core), or else the installed megatron-core 0.19.2 wheel, which ships the same
megatron/training (arguments, argument_utils, GPTModelBuilder). Tests that need the checkout
itself (pretrain_gpt.py, the 0.19.1 core) skip without it, saying so. Fetched Megatron-LM code
is never committed to this repository.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PATCHES = sorted((ROOT / "patches").glob("[0-9][0-9][0-9][0-9]-*.patch"))
WHEEL = Path(importlib.util.find_spec("megatron.core").origin).resolve().parents[2]
CHECKOUT = Path(os.environ["MEGATRON_LM_DIR"]) if os.environ.get("MEGATRON_LM_DIR") else None
NEEDS_CHECKOUT = pytest.mark.skipif(
    CHECKOUT is None,
    reason="needs a Megatron-LM core_r0.19.0 checkout (pretrain_gpt.py, its "
    "0.19.1 megatron/core): set MEGATRON_LM_DIR; the other tests use the megatron-core wheel",
)


def _load_tool():
    spec = importlib.util.spec_from_file_location(
        "gpu_megatron_lm", ROOT / "gpu" / "megatron_lm.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_megatron_lm = _load_tool()


def run_probe(
    kind: str,
    root: Path | None = None,
    cases: list | None = None,
    tmp: Path | None = None,
    pythonpath: tuple[Path, ...] = (),
) -> dict:
    argv = [sys.executable, str(HERE / "probe.py"), kind]
    if cases is not None:
        path = tmp / f"cases-{root.name}.json"
        path.write_text(json.dumps(cases))
        argv.append(str(path))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(map(str, [*pythonpath, *([root] if root else [])])),
        "HOME": str(tmp or HERE),
    }
    res = subprocess.run(
        argv, cwd=root or HERE, env=env, capture_output=True, text=True, timeout=600
    )
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("PROBE_JSON ")]
    refused = [ln for ln in res.stderr.splitlines() if ln.startswith("error: ")]
    if res.returncode == 2 and refused:  # the machine cannot run it: its one line, at once
        pytest.fail(f"probe {kind}: {refused[-1]}", pytrace=False)
    assert res.returncode == 0 and lines, res.stdout[-3000:] + res.stderr[-6000:]
    return json.loads(lines[-1][len("PROBE_JSON ") :])


@pytest.fixture(scope="session")
def stock_root() -> Path:
    return CHECKOUT if CHECKOUT is not None else WHEEL


@pytest.fixture(scope="session")
def patched_root(tmp_path_factory, stock_root) -> Path:
    """The root's megatron/ (and pretrain_gpt.py & co. of a checkout), mtimes kept, with
    patches/*.patch applied by `git apply`, as a user does."""
    root = tmp_path_factory.mktemp("patched") / "megatron-lm"
    root.mkdir()
    shutil.copytree(
        stock_root / "megatron",
        root / "megatron",
        copy_function=shutil.copy2,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for name in ("pretrain_gpt.py", "gpt_builders.py", "model_provider.py"):
        if (stock_root / name).exists():
            shutil.copy2(stock_root / name, root / name)
    for patch in PATCHES:
        res = subprocess.run(["git", "apply", str(patch)], cwd=root, capture_output=True, text=True)
        assert res.returncode == 0, f"{patch.name}: {res.stderr}"
    return root


def te_documented_commands() -> list[dict]:
    """The TransformerEngine route's commands (`<!-- megatron-lm-te-run: NAME -->` blocks,
    gpu/te_megatron_lm.py), expanded after the `common` block: name, argv, environment."""
    import re

    common, _ = gpu_megatron_lm.documented_runs()
    blocks = re.findall(
        r"<!-- megatron-lm-te-run: (\S+) -->\s*\n```bash\n(.*?)```",
        gpu_megatron_lm.DOC.read_text(),
        re.S,
    )
    return [
        {"run": name, "argv": cmd["argv"], "env": cmd["env"]}
        for name, block in blocks
        for cmd in _bash_captured(common + "\n" + block)
    ]


def _bash_captured(script: str) -> list[dict]:
    """Runs a documented bash block with `torchrun` replaced by a recorder: the argv and
    UFP4_* environment of every command, as bash itself expands them."""
    recorder = (
        'torchrun() { python3 -c \'import json, os, sys; print("CMD " + json.dumps('
        '{"argv": sys.argv[1:], "env": {k: v for k, v in os.environ.items() '
        'if k.startswith("UFP4_")}}))\' "$@"; }\n'
    )
    res = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + recorder + script],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"]},
    )
    assert res.returncode == 0, res.stderr
    return [json.loads(ln[4:]) for ln in res.stdout.splitlines() if ln.startswith("CMD ")]


def documented_commands() -> list[dict]:
    """Every torchrun command of docs/megatron-lm.md's marked blocks: name, checkout,
    torchrun options, pretrain_gpt.py arguments, environment."""
    common, runs = gpu_megatron_lm.documented_runs()
    out = []
    for name, checkout, block in runs:
        for i, cmd in enumerate(_bash_captured(common + "\n" + block)):
            cut = cmd["argv"].index("pretrain_gpt.py")
            out.append(
                {
                    "name": f"doc-{name}-{i}",
                    "run": name,
                    "checkout": checkout,
                    "torchrun": cmd["argv"][:cut],
                    "argv": cmd["argv"][cut + 1 :],
                    "env": cmd["env"],
                }
            )
    return out


def base_argv() -> list[str]:
    """The documented common flags (the ARGS array), as bash expands them."""
    common, _ = gpu_megatron_lm.documented_runs()
    return _bash_captured(common + '\ntorchrun pretrain_gpt.py "${ARGS[@]}"')[0]["argv"][1:]


# ----------------------------------------------------------------------------- the cases
SPEC = ["--spec", "ufp4_megatron.megatron.spec", "ufp4_gpt_spec"]
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-token-dispatcher-type", "allgather"]
FLAGS = ["--fp4-recipe", "ufp4", "--fp4-format"]


def stock_cases(tmp: Path) -> list[dict]:
    rules = tmp / "policy.json"
    rules.write_text(
        json.dumps(
            {"recipe": "ufp4", "rules": {"decoder.layers.0.*": "bf16", "*.linear_fc2": "e2m1"}}
        )
    )
    cases = [
        ("bf16", [], {}),
        ("spec-ufp4", SPEC, {"UFP4_RECIPE": "ufp4"}),
        ("spec-default", SPEC, {}),
        ("spec-e2m1", SPEC, {"UFP4_RECIPE": "e2m1"}),
        ("spec-bf16", SPEC, {"UFP4_RECIPE": "bf16"}),
        ("spec-json", SPEC, {"UFP4_RECIPE": str(rules)}),
        ("spec-unknown", SPEC, {"UFP4_RECIPE": "ufp5"}),
        ("spec-moe", SPEC + MOE, {"UFP4_RECIPE": "ufp4"}),
        ("spec-te-absent", SPEC + ["--transformer-impl", "transformer_engine"], {}),
        ("stock-refuses-flags", FLAGS + ["e1m2"], {}),
    ]
    return [{"name": n, "argv": base_argv() + a, "env": e} for n, a, e in cases]


PATCHED = {  # name: (extra args, env)
    "plain": ([], {}),
    "flags-ufp4": (FLAGS + ["e1m2"], {}),
    "flags-int4": (FLAGS + ["int4"], {}),
    "flags-e2m1": (FLAGS + ["e2m1"], {}),
    "rht-none": (FLAGS + ["e1m2", "--fp4-rht", "none"], {}),
    "rht-wgrad": (FLAGS + ["e1m2", "--fp4-rht", "wgrad"], {}),
    "rht-dgrad-wgrad": (FLAGS + ["e1m2", "--fp4-rht", "dgrad", "wgrad"], {}),
    "rht-fprop-wgrad": (FLAGS + ["e1m2", "--fp4-rht", "fprop", "wgrad"], {}),
    "block-32": (FLAGS + ["e1m2", "--fp4-block", "32"], {}),
    "no-sr": (FLAGS + ["e1m2", "--no-fp4-sr-dy"], {}),
    "e2m1-all": (
        FLAGS
        + ["e2m1", "--fp4-rht", "fprop", "dgrad", "wgrad", "--fp4-block", "32", "--no-fp4-sr-dy"],
        {},
    ),
    "flags-moe": (FLAGS + ["e1m2"] + MOE, {}),
    "spec-on-patched": (SPEC, {"UFP4_RECIPE": "e2m1"}),
    # refused, each with the flag to change
    "bad-format": (FLAGS + ["e3m0"], {}),
    "bad-rht": (FLAGS + ["e1m2", "--fp4-rht", "bprop"], {}),
    "e1m2-without-ufp4": (["--fp4-format", "e1m2"], {}),
    "int4-without-ufp4": (["--fp4-format", "int4"], {}),
    "knob-without-ufp4": (["--fp4-block", "32"], {}),
    "rht-without-ufp4": (["--fp4-format", "e2m1", "--fp4-rht", "wgrad"], {}),
    "ufp4-without-format": (["--fp4-recipe", "ufp4"], {}),
    "block-zero": (FLAGS + ["e1m2", "--fp4-block", "0"], {}),
    "rht-none-and-gemm": (FLAGS + ["e1m2", "--fp4-rht", "none", "fprop"], {}),
    "rht-twice": (FLAGS + ["e1m2", "--fp4-rht", "fprop", "fprop"], {}),
    "param-gather": (FLAGS + ["e1m2", "--fp4-param-gather", "--use-distributed-optimizer"], {}),
    "with-fp8": (FLAGS + ["e1m2", "--fp8-format", "hybrid"], {}),
    "with-spec": (FLAGS + ["e1m2"] + SPEC, {}),
    "with-env": (FLAGS + ["e1m2"], {"UFP4_RECIPE": "e2m1"}),
    "te-absent": (FLAGS + ["e1m2", "--transformer-impl", "transformer_engine"], {}),
    "inference-impl": (FLAGS + ["e1m2", "--transformer-impl", "inference_optimized"], {}),
    "nvfp4-needs-te": (["--fp4-format", "e2m1"], {}),  # stock behaviour, kept
}


def patched_cases() -> list[dict]:
    cases = [{"name": n, "argv": base_argv() + a, "env": e} for n, (a, e) in PATCHED.items()]
    return cases + [
        {
            "name": "hybrid-refuses-flags",
            "argv": base_argv() + FLAGS + ["e1m2"],
            "env": {},
            "hybrid": True,
        }
    ]


@pytest.fixture(scope="session")
def stock_results(stock_root, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("stock")
    docs = [c for c in documented_commands() if c["checkout"] == "stock"]
    return run_probe("routes", stock_root, stock_cases(tmp) + docs, tmp)


@pytest.fixture(scope="session")
def patched_results(patched_root, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("patched-probe")
    docs = [c for c in documented_commands() if c["checkout"] == "patched"]
    return run_probe("routes", patched_root, patched_cases() + docs, tmp)

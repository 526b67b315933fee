"""patches/ against Megatron-LM core_r0.19.0, checked on CPU (`make patch-check`).

- test_patches_apply_check: every patch passes `git apply --check` on pristine files: 0001 on
  the installed megatron-core 0.19.2 wheel (identical to core_r0.19.0 for these files), 0002 on
  Megatron-LM's gpt_builders.py, which the wheel lacks: from a Megatron-LM core_r0.19.0
  checkout named by MEGATRON_LM_DIR. Without it, 0002's checks are skipped (say so: fetched
  Megatron-LM code is not committed to this repository).
- The rest run one probe (patched_args_probe.py) against a scratch copy with the patches
  applied for real: the new flags parse into TransformerConfig, every invalid combination is
  refused with a clear message at the right stage, unpatched behaviour is kept, and
  gpt_builders builds the plugin's spec with the recipe the flags describe.
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PATCHES = sorted((ROOT / "patches").glob("[0-9][0-9][0-9][0-9]-*.patch"))
# site-packages/megatron (a namespace package: tests/megatron/ would join megatron.__path__)
INSTALLED = Path(importlib.util.find_spec("megatron.core").origin).resolve().parents[1]
MEGATRON_LM = Path(os.environ["MEGATRON_LM_DIR"]) if os.environ.get("MEGATRON_LM_DIR") else None
NEEDS_LM = pytest.mark.skipif(
    MEGATRON_LM is None, reason="patch 0002 targets Megatron-LM's gpt_builders.py, which the "
    "megatron-core wheel lacks: set MEGATRON_LM_DIR to a core_r0.19.0 checkout")


def _applicable(patches):
    """0001 applies to the wheel's megatron/; patches touching repo-root files need Megatron-LM."""
    if MEGATRON_LM is not None:
        return list(patches)
    return [p for p in patches if all(line[len("--- a/"):].startswith("megatron/")
                                      for line in p.read_text().splitlines()
                                      if line.startswith("--- a/"))]


def git_apply(patch: Path, cwd: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "apply", *flags, str(patch)], cwd=cwd, capture_output=True,
                          text=True)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """site-packages/megatron and gpt_builders.py copied (mtimes kept, so the cached bytecode
    of untouched files stays valid), with every patch applied."""
    root = tmp_path_factory.mktemp("megatron-lm")
    shutil.copytree(INSTALLED, root / "megatron", copy_function=shutil.copy2)
    if MEGATRON_LM is not None:
        shutil.copy2(MEGATRON_LM / "gpt_builders.py", root / "gpt_builders.py")
    for patch in _applicable(PATCHES):
        res = git_apply(patch, root)
        assert res.returncode == 0, f"{patch.name}: {res.stderr}"
    return root


@pytest.fixture(scope="module")
def probe(scratch) -> dict:
    res = subprocess.run([sys.executable, str(Path(__file__).parent / "patched_args_probe.py")],
                         cwd=scratch, env={"PYTHONPATH": str(scratch), "PATH": "/usr/bin:/bin",
                                           "UFP4_RECIPE": "ufp4", "OMP_NUM_THREADS": "1"},
                         capture_output=True, text=True, timeout=240)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("PROBE_JSON ")]
    assert res.returncode == 0 and lines, res.stdout[-2000:] + res.stderr[-4000:]
    return json.loads(lines[-1][len("PROBE_JSON "):])


def test_patch_set_is_numbered_and_documented():
    assert [p.name[:4] for p in PATCHES] == [f"{i:04d}" for i in range(1, len(PATCHES) + 1)]
    readme = (ROOT / "patches" / "README.md").read_text()
    for patch in PATCHES:
        assert patch.name in readme


def test_patches_apply_check(tmp_path):
    pristine = tmp_path / "pristine"
    (pristine / "megatron").mkdir(parents=True)
    for patch in _applicable(PATCHES):
        for line in patch.read_text().splitlines():
            if line.startswith("--- a/"):
                rel = line[len("--- a/"):]
                src = INSTALLED.parent / rel if rel.startswith("megatron/") else MEGATRON_LM / rel
                (pristine / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, pristine / rel)
    assert _applicable(PATCHES), "no patch applies to the installed megatron-core"
    for patch in _applicable(PATCHES):
        res = git_apply(patch, pristine, "--check", "--verbose")
        assert res.returncode == 0, f"{patch.name}: {res.stderr}"


def test_patched_flags_reach_transformer_config(probe):
    assert probe["plain"]["stage"] == "ok"
    assert probe["plain"]["config"] == {"fp4": None, "fp4_recipe": "nvfp4", "fp4_block": None,
                                        "fp4_rht": None, "fp4_sr_dy": None}
    assert probe["ufp4_defaults"]["config"] == {"fp4": "e1m2", "fp4_recipe": "ufp4",
                                                "fp4_block": None, "fp4_rht": None,
                                                "fp4_sr_dy": None}
    assert probe["ufp4_knobs"]["config"] == {"fp4": "int4", "fp4_recipe": "ufp4",
                                             "fp4_block": 32, "fp4_rht": ["fprop", "wgrad"],
                                             "fp4_sr_dy": False}
    assert probe["ufp4_e2m1_baseline"]["stage"] == "ok"
    assert probe["ufp4_no_rht"]["config"]["fp4_rht"] == ["none"]
    assert probe["config_ufp4"]["stage"] == "ok"


@pytest.mark.parametrize("case, stage, message", [
    ("bad_format_choice", "parse", "SystemExit(2)"),
    ("bad_rht_choice", "parse", "SystemExit(2)"),
    ("e1m2_without_ufp4", "validate", "--fp4-format e1m2 needs --fp4-recipe ufp4"),
    ("knob_without_ufp4", "validate", "--fp4-block: only with --fp4-recipe ufp4"),
    ("config_e1m2_without_ufp4", "config", "fp4='e1m2' needs fp4_recipe='ufp4'"),
    ("config_knob_without_ufp4", "config", "fp4_rht apply to fp4_recipe='ufp4' only"),
    ("ufp4_without_format", "config", "needs fp4 (--fp4-format)"),
    ("ufp4_block_zero", "config", "fp4_block must be a positive integer"),
    ("ufp4_rht_none_and_gemm", "config", "'none' alone"),
    ("ufp4_param_gather", "config", "not supported with fp4_recipe='ufp4'"),
    ("ufp4_with_te_impl", "validate", "--transformer-impl local"),
    ("nvfp4_needs_te", "validate", "Transformer Engine >= 2.7.0.dev0"),  # unpatched behaviour
])
def test_patched_validation_refuses(probe, case, stage, message):
    assert probe[case]["stage"] == stage, probe[case]
    assert message in probe[case]["error"]


@NEEDS_LM
def test_gpt_builder_routes_ufp4_to_plugin(probe):
    built = probe["built"]
    knobs = built["ufp4_knobs"]
    assert knobs["type"] == "TransformerBlockSubmodules" and len(knobs["qkv_recipes"]) == 2
    desc = knobs["qkv_recipes"][0]
    assert "recipe ufp4-int4" in desc
    assert "fprop: x=int4/1x32/fp32/rtne w=int4/1x32/fp32/rtne rht=16" in desc
    assert "dgrad: dy=int4/1x32/fp32/rtne w=int4/1x32/fp32/rtne rht=off" in desc  # no SR on dY
    assert "wgrad: dy=int4/1x32/fp32/rtne x=int4/1x32/fp32/rtne rht=16" in desc
    default = built["ufp4_defaults"]["qkv_recipes"][0]
    assert "dgrad: dy=e1m2/1x16/fp32/sr w=e1m2/1x16/fp32/rtne rht=16" in default
    assert built["plain"]["type"] == "ModuleSpec"  # stock local spec without --fp4-recipe ufp4
    assert built["spec_callable"] == {"type": "TransformerBlockSubmodules",
                                      "qkv_recipes": ["ufp4"]}

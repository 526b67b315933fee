"""Precision YAMLs name a preset plus overrides; the preset (recipe.py) owns every other fact.

test_every_precision_yaml_is_its_preset_plus_stated_overrides   YAML == preset, pinned
test_a_yaml_that_omits_rht_runs_its_presets_rht    a user's YAML (--config-dir style)
test_config_yaml_of_an_older_run_still_resumes     switches stated in full: same identity
test_preset_switches_state_every_preset_and_refuse_what_they_cannot
test_ablations_are_named_recipe_overrides          launcher overrides == recipe.ABLATIONS
test_switch_overrides_refuse_what_has_no_switch
test_trainer_refuses_bad_precision_input           real CLI: one `error:` line, exit 2
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from _cli import run
from hydra import compose
from omegaconf import OmegaConf

from ufp4_megatron.cli import launch as launch_cli
from ufp4_megatron.configs import CONFIG_DIR
from ufp4_megatron.quant.recipe import (
    ABLATION_PRESET,
    ABLATIONS,
    PRESETS,
    GemmSpec,
    OperandSpec,
    Recipe,
    ablation,
    get_recipe,
)
from ufp4_megatron.train.precision import ABLATION_OVERRIDES, recipe_from_config, switch_overrides
from ufp4_megatron.train.precision_resolvers import preset_switches
from ufp4_megatron.train.rundir import identity
from ufp4_megatron.train.rundir.resume_check import plan_start

PRECISION_DIR = Path(CONFIG_DIR) / "precision"
# Each shipped precision YAML: (its preset, the overrides it states as get_recipe arguments).
# A new YAML needs a row here; a YAML that restates its preset's switches fails below.
SHIPPED = {
    "bf16": ("bf16", {}),
    "e2m1": ("e2m1", {}),
    "ufp4": ("ufp4", {}),
    "ufp4_int4": ("ufp4_int4", {}),
    "nvfp4": ("nvfp4", {}),
    "mxfp4": ("mxfp4", {}),
}


pytestmark = pytest.mark.usefixtures("hydra_configs")  # tests/conftest.py


def load(*overrides: str):
    return OmegaConf.to_object(compose("config", overrides=["model=tiny", *overrides]))


def test_every_precision_yaml_is_its_preset_plus_stated_overrides():
    assert sorted(p.stem for p in PRECISION_DIR.glob("*.yaml")) == sorted(SHIPPED)
    for name, (preset, overrides) in SHIPPED.items():
        raw = OmegaConf.to_container(OmegaConf.load(PRECISION_DIR / f"{name}.yaml"))
        # named after itself, and after what an override changes (train/precision_resolvers.py)
        assert raw["recipe"] == preset and raw["name"] == f"${{ufp4.ablation_name:{name}}}"
        assert set(raw) - {"name", "recipe"} == set(overrides), (name, raw)
        cfg = load(f"precision={name}").precision
        assert cfg.name == name
        assert recipe_from_config(cfg) == get_recipe(preset, **overrides) == PRESETS[preset]
        # the switches the preset supplies are resolved, so config.yaml records each one
        stated = preset_switches(PRESETS[preset])
        assert (
            OmegaConf.to_container(
                compose("config", overrides=[f"precision={name}"]).precision, resolve=True
            )["rht"]
            == stated["rht"]
        )
        assert vars(cfg.sr) == stated["sr"]


def test_a_yaml_that_omits_rht_runs_its_presets_rht(tmp_path):
    own = tmp_path / "precision"
    own.mkdir()
    (own / "mine.yaml").write_text("name: mine\nrecipe: ufp4\n")
    (own / "mine_nofprop.yaml").write_text(
        "name: mine_nofprop\nrecipe: ufp4\nrht: {fprop: false}\n"
    )
    path = f"hydra.searchpath=[file://{tmp_path}]"
    r = recipe_from_config(load(path, "precision=mine").precision)
    assert r == get_recipe("ufp4") and (r.fprop.rht, r.dgrad.rht, r.wgrad.rht) == (16, 16, 16)
    assert r.operand("wgrad", "dy").rounding == "sr"
    r = recipe_from_config(load(path, "precision=mine_nofprop").precision)
    assert (r.fprop.rht, r.dgrad.rht, r.wgrad.rht) == (None, 16, 16)
    # the preset follows precision.recipe, also when the command line changes it
    r = recipe_from_config(load("precision=ufp4", "precision.recipe=e2m1").precision)
    assert r == get_recipe("e2m1")


def test_config_yaml_of_an_older_run_still_resumes(tmp_path):
    """Before the YAMLs named only a preset, each stated every switch; such a config.yaml has
    the identity (and run dir) of today's command and resumes."""
    new = compose("config", overrides=["model=tiny", "precision=ufp4"])
    old = OmegaConf.to_container(new, resolve=True)
    old["precision"] = {
        "name": "ufp4",
        "recipe": "ufp4",
        "grid": None,
        "block": None,
        "scale": None,
        "block_2d": None,
        "overrides": {},
        "rht": {"fprop": True, "dgrad": True, "wgrad": True, "size": 16, "seed": 0},
        "sr": {"x": False, "w": False, "dy": True},
        "bf16_layers": {"start": 0, "end": 0},
    }
    assert identity.differences(old, new) == [] and identity.run_id(old) == identity.run_id(new)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(old)))
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 5.0}) + "\n")
    plan = plan_start(OmegaConf.to_object(new), run_dir)  # refuses another run's dir
    assert plan.step == 0 and not plan.changes
    other = compose(
        "config", overrides=["model=tiny", "precision=ufp4", "precision.rht.fprop=false"]
    )
    # the ablation is named after its change (train/precision_resolvers.py)
    assert identity.differences(old, other) == ["precision.name", "precision.rht.fprop"]


def test_preset_switches_state_every_preset_and_refuse_what_they_cannot():
    assert preset_switches(PRESETS["ufp4"]) == {
        "rht": {"fprop": True, "dgrad": True, "wgrad": True, "size": 16, "seed": 0},
        "sr": {"x": False, "w": False, "dy": True},
    }
    assert preset_switches(PRESETS["e2m1"])["rht"] == {
        "fprop": False,
        "dgrad": False,
        "wgrad": True,
        "size": 16,
        "seed": 0,
    }
    assert preset_switches(PRESETS["bf16"])["sr"] == {"x": False, "w": False, "dy": False}
    op, sr = OperandSpec(grid="e1m2"), OperandSpec(grid="e1m2", rounding="sr")
    with pytest.raises(ValueError, match=r"uses RHT sizes \[16, 32\]"):
        preset_switches(
            Recipe(
                name="r", fprop=GemmSpec(x=op, w=op, rht=16), wgrad=GemmSpec(dy=op, x=op, rht=32)
            )
        )
    with pytest.raises(ValueError, match="rounds dy stochastically in some GEMMs only"):
        preset_switches(Recipe(name="r", dgrad=GemmSpec(dy=sr, w=op), wgrad=GemmSpec(dy=op, x=op)))


def test_ablations_are_named_recipe_overrides():
    assert launch_cli.ABLATIONS is ABLATION_OVERRIDES
    # the command lines ufp4-launch and the studies have always run for them
    assert dict(ABLATION_OVERRIDES) == {
        "ufp4_rht_none": (
            "precision.rht.fprop=false",
            "precision.rht.dgrad=false",
            "precision.rht.wgrad=false",
        ),
        "ufp4_rht_wgrad": ("precision.rht.fprop=false", "precision.rht.dgrad=false"),
        "ufp4_rht_dgrad_wgrad": ("precision.rht.fprop=false",),
        "ufp4_rht_fprop_wgrad": ("precision.rht.dgrad=false",),
        "ufp4_no_sr": ("precision.sr.dy=false",),
    }
    for name in ABLATIONS:
        cfg = load(
            f"precision={ABLATION_PRESET}", f"precision.name={name}", *ABLATION_OVERRIDES[name]
        ).precision
        assert recipe_from_config(cfg) == ablation(name) != PRESETS[ABLATION_PRESET], name
    assert ablation("ufp4_rht_fprop_wgrad").dgrad.rht is None
    with pytest.raises(ValueError, match="unknown ablation 'ufp4_rht'; valid: ufp4_rht_none"):
        ablation("ufp4_rht")


@pytest.mark.parametrize(
    "overrides,match",
    [
        ({"grid": "int4"}, "override grid='int4' has no precision switch"),
        ({"rht": True}, "override rht=True has no precision switch"),
        ({"sr": ("dx",)}, r"unknown names \['dx'\]; valid: x, w, dy"),
        ({"rht": ("bprop",)}, r"unknown names \['bprop'\]; valid: fprop, dgrad, wgrad"),
    ],
)
def test_switch_overrides_refuse_what_has_no_switch(overrides, match):
    with pytest.raises(ValueError, match=match):
        switch_overrides("ufp4", overrides)


def _trainer(tmp_path, *overrides: str, flags: tuple[str, ...] = ()):
    cmd = [
        sys.executable,
        "-m",
        "ufp4_megatron.train",
        *flags,
        "model=tiny",
        "logging.wandb.mode=disabled",
        f"hydra.run.dir={tmp_path / 'run'}",
        f"data.cache_dir={tmp_path / 'cache'}",
        *overrides,
    ]
    return run(cmd, tmp_path)


@pytest.mark.parametrize(
    "overrides,fragment",
    [
        # unknown preset, named by a user's YAML
        (["precision=typo"], "precision.recipe='ufp5' is not a recipe; valid: bf16, e2m1, ufp4"),
        # unknown override keys
        (
            ["+precision.overrides.fprop.x.gird=e2m1"],
            "precision config 'ufp4-overrides.fprop.x.gird=e2m1': override 'fprop.x.gird': unknown "
            "field 'gird'; valid:",
        ),
        (
            ["+precision.overrides.rhtt=1"],
            "precision config 'ufp4-overrides.rhtt=1': unknown recipe override 'rhtt'",
        ),
        # bad override values
        (["precision.grid=e3m3"], "precision config 'ufp4-grid=e3m3': unknown grid 'e3m3'; valid:"),
        (
            ["+precision.overrides.wgrad.rht=17"],
            "override wgrad.rht=17: rht size must be one of 16, 32, 64, 128 or None, got 17",
        ),
        (["precision.rht.size=17"], "rht size must be one of 16, 32, 64, 128 or None, got 17"),
    ],
    ids=["unknown-preset", "unknown-field", "unknown-key", "bad-grid", "bad-rht", "bad-size"],
)
def test_trainer_refuses_bad_precision_input(tmp_path, overrides, fragment):
    own = tmp_path / "own" / "precision"
    own.mkdir(parents=True)
    (own / "typo.yaml").write_text("name: typo\nrecipe: ufp5\n")
    r = _trainer(tmp_path, *overrides, flags=("--config-dir", str(tmp_path / "own")))
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    assert not (tmp_path / "run").exists()

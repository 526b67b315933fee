"""An override ablation is named after what it changes (train/precision_resolvers.py).

test_presets_keep_their_names            every shipped precision YAML, no overrides
test_an_override_names_the_ablation      rht / sr switches, grid, dotted overrides, BF16
                                         layers; sorted; a switch set to the preset's own
                                         value changes nothing
test_a_given_name_is_kept                precision.name=... beside the overrides
test_the_name_reaches_wandb_and_compare  W&B run name; compare's label from config.yaml
test_hostile_values_stay_one_path_component   separators, `..`, control characters, a
                                         very long override: one short, distinct name
"""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from ufp4_megatron.train.footprint import load_config
from ufp4_megatron.train.logs.wandb_run import run_name
from ufp4_megatron.train.precision_resolvers import ablation_name
from ufp4_megatron.train.rundir import names

SHIPPED = ("bf16", "e2m1", "mxfp4", "nvfp4", "ufp4", "ufp4_int4")


def _name(*overrides: str) -> str:
    return load_config(["model=tiny", *overrides]).precision.name


@pytest.mark.parametrize("preset", SHIPPED)
def test_presets_keep_their_names(preset):
    assert _name(f"precision={preset}") == preset


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["precision.rht.fprop=false"], "ufp4-rht.fprop=false"),
        (
            ["precision.sr.dy=false", "precision.rht.fprop=false"],
            "ufp4-rht.fprop=false,sr.dy=false",
        ),
        (["precision=e2m1", "precision.rht.fprop=true"], "e2m1-rht.fprop=true"),
        (["precision.grid=e2m1"], "ufp4-grid=e2m1"),
        (["+precision.overrides.fprop.x.grid=e2m1"], "ufp4-overrides.fprop.x.grid=e2m1"),
        (["precision.bf16_layers.end=1"], "ufp4-bf16_layers.end=1"),
        (["precision.rht.fprop=true"], "ufp4"),  # the preset's own value: not an ablation
    ],
)
def test_an_override_names_the_ablation(overrides, expected):
    assert _name(*overrides) == expected


def test_a_given_name_is_kept():
    assert _name("precision.name=no_fprop_rht", "precision.rht.fprop=false") == "no_fprop_rht"


def test_the_name_reaches_wandb_and_compare(tmp_path):
    from ufp4_megatron.report.runs import load_run

    cfg = load_config(["model=tiny", "precision.rht.fprop=false", "train.seed=3"])
    assert run_name(cfg) == "tiny-ufp4-rht.fprop=false-s3"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(dataclasses.asdict(cfg)))
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0, "tokens": 64}\n')
    run = load_run(str(run_dir))
    assert run.recipe == run.label == "ufp4-rht.fprop=false"


@pytest.mark.parametrize("value", ["../../etc", "a/b\\c", "x\ny", "$(rm -rf ~)"])
def test_hostile_values_stay_one_path_component(value):
    name = ablation_name("ufp4", {"recipe": "ufp4", "overrides": {"x": value}})
    assert names.name_problem("precision.name", name) is None, name
    assert "/" not in name and "\\" not in name and "\n" not in name


def test_long_ablations_are_cut_and_stay_distinct():
    a = ablation_name("ufp4", {"recipe": "ufp4", "overrides": {f"k{i}": i for i in range(40)}})
    b = ablation_name("ufp4", {"recipe": "ufp4", "overrides": {f"k{i}": i for i in range(41)}})
    assert a != b and len(a) <= len("ufp4-") + 64
    assert names.name_problem("precision.name", a) is None

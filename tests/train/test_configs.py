"""Config contract: every model x precision composes into the typed schema and a Recipe;
paper configs have the paper's parameter counts; bad overrides fail naming the key.

    test_every_model_and_precision_composes     36 compositions -> Config + Recipe
    test_paper_models_within_5_percent          Dense 1.5B, MoE 7.9B (1.3B), MoE 124B (5.1B)
    test_precision_overrides_reach_the_recipe   rht / sr / grid switches -> get_recipe
    test_bf16_layers_reach_megatron_config      precision.bf16_layers -> TransformerConfig
    test_invalid_overrides_name_the_key         typos, wrong types, unknown options
    test_every_config_and_documented_layout_passes_validation   no false refusals
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ufp4_megatron.configs import CONFIG_DIR
from ufp4_megatron.quant.recipe import list_recipes
from ufp4_megatron.train.footprint import count_params
from ufp4_megatron.train.precision import recipe_from_config
from ufp4_megatron.train.schema import Config
from ufp4_megatron.train.validate import check_config

MODELS = sorted(p.stem for p in (Path(CONFIG_DIR) / "model").glob("*.yaml"))
PRECISIONS = sorted(p.stem for p in (Path(CONFIG_DIR) / "precision").glob("*.yaml"))


pytestmark = pytest.mark.usefixtures("hydra_configs")  # tests/conftest.py


def load(*overrides: str) -> Config:
    return OmegaConf.to_object(compose("config", overrides=list(overrides)))


def test_config_groups_cover_the_issue():
    assert (
        sorted(["tiny", "small", "moe_small", "dense_1p5b", "moe_7p9b", "moe_124b", "study11m"])
        == MODELS
    )
    assert sorted(list_recipes()) == PRECISIONS


@pytest.mark.parametrize("model", MODELS)
def test_every_model_and_precision_composes(model):
    for precision in PRECISIONS:
        cfg = load(f"model={model}", f"precision={precision}")
        assert isinstance(cfg, Config) and cfg.model.name == model
        recipe = recipe_from_config(cfg.precision)
        assert recipe.name == precision and recipe.quantized == (precision != "bf16")


@pytest.mark.parametrize(
    "model,total,active",
    [("dense_1p5b", 1.5e9, 1.5e9), ("moe_7p9b", 7.9e9, 1.3e9), ("moe_124b", 124e9, 5.1e9)],
)
def test_paper_models_within_5_percent(model, total, active):
    c = count_params(load(f"model={model}").model)
    assert abs(c.total / total - 1) < 0.05, c
    assert abs(c.active / active - 1) < 0.05, c


def test_small_is_about_125m():
    assert abs(count_params(load("model=small").model).total / 125e6 - 1) < 0.05


def test_precision_overrides_reach_the_recipe():
    r = recipe_from_config(load("precision=ufp4").precision)
    assert (r.fprop.rht, r.dgrad.rht, r.wgrad.rht) == (16, 16, 16)
    assert r.operand("dgrad", "dy").rounding == "sr" and r.operand("fprop", "x").rounding == "rtne"
    r = recipe_from_config(
        load(
            "precision=ufp4",
            "precision.rht.fprop=false",
            "precision.sr.dy=false",
            "precision.grid=int4",
        ).precision
    )
    assert r.fprop.rht is None and r.dgrad.rht == 16
    assert r.operand("wgrad", "dy").rounding == "rtne"
    assert r.operand("fprop", "w").grid == "int4"
    r = recipe_from_config(load("precision=e2m1", "precision.rht.fprop=true").precision)
    assert (r.fprop.rht, r.dgrad.rht, r.wgrad.rht) == (16, None, 16)
    r = recipe_from_config(
        load(
            "precision=ufp4",
            "+precision.overrides.fprop.x.grid=e2m1",
            "+precision.overrides.wgrad.rht=null",
        ).precision
    )
    assert r.operand("fprop", "x").grid == "e2m1" and r.operand("fprop", "w").grid == "e1m2"
    assert r.wgrad.rht is None and r.fprop.rht == 16


def test_bf16_layers_reach_megatron_config():
    from ufp4_megatron.train.model import transformer_config

    cfg = load("model=tiny", "precision.bf16_layers.end=1")
    tc = transformer_config(cfg, torch.float32, torch.device("cpu"))
    assert tc.first_last_layers_bf16 and tc.num_layers_at_end_in_bf16 == 1
    assert tc.num_layers_at_start_in_bf16 == 0


def test_cross_entropy_fusion_reaches_megatron_config():
    from ufp4_megatron.train.model import transformer_config

    off = transformer_config(load("model=tiny"), torch.float32, torch.device("cpu"))
    on = transformer_config(
        load("model=tiny", "model.cross_entropy_fusion=true"), torch.float32, torch.device("cpu")
    )
    assert not off.cross_entropy_loss_fusion  # Megatron's default, the studies' runs
    assert on.cross_entropy_loss_fusion and on.cross_entropy_fusion_impl == "native"


@pytest.mark.parametrize(
    "override,named",
    [
        ("train.stepz=3", "stepz"),  # typo in a key
        ("model.cross_entropy_fusion=maybe", "model.cross_entropy_fusion"),
        ("train.steps=many", "train.steps"),  # wrong type
        ("precision.rht.fprop=maybe", "precision.rht.fprop"),
        ("parallel.tp=1.5", "parallel.tp"),
        ("model=huge", "huge"),  # unknown group option
    ],
)
def test_invalid_overrides_name_the_key(override, named):
    with pytest.raises((HydraException, OmegaConfBaseException)) as e:
        load(override)
    assert named in str(e.value)


def test_invalid_recipe_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match="valid: bf16, e2m1, ufp4"):
        recipe_from_config(load("precision.recipe=fp3").precision)


# Layouts the docs, README and GPU scripts use; train/validate.py must accept every one
# (the invalid ones are in tests/train/test_validate.py, through the CLI).
DOCUMENTED_LAYOUTS = [
    ("moe_124b", ["parallel.tp=4", "parallel.ep=8", "parallel.pp=4", "parallel.dp=8"]),
    ("moe_124b", ["parallel.tp=4", "parallel.ep=8"]),
    ("moe_7p9b", ["parallel.tp=2", "parallel.ep=8", "parallel.dp=8"]),
    (
        "dense_1p5b",
        ["parallel.tp=2", "parallel.sp=true", "train.global_batch=256", "train.seq_len=4096"],
    ),
    ("dense_1p5b", ["parallel.tp=8"]),  # tp above num_query_groups=4: key/value heads replicated
    ("tiny", ["parallel.tp=2", "parallel.sp=true", "train.seq_len=32"]),
    ("moe_small", ["parallel.tp=2", "parallel.ep=2", "parallel.sp=true"]),
]


def test_every_config_and_documented_layout_passes_validation():
    for model in MODELS:
        for precision in PRECISIONS:
            check_config(load(f"model={model}", f"precision={precision}", "train.seq_len=512"))
    for model, overrides in DOCUMENTED_LAYOUTS:
        cfg = load(f"model={model}", *overrides)
        world = None if cfg.parallel.dp else cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.ep
        check_config(cfg, world_size=world)

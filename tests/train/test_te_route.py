"""model.transformer_impl=transformer_engine: the config Megatron gets, and what is refused.

    test_te_route_config_is_megatron_lms_custom_fp4     fp4/fp4_recipe/fp4_quantizer_factory as
                                                        --fp4-format e2m1 --fp4-recipe custom
                                                        --fp4-quantizer-factory set them; the
                                                        path resolves to the recipe's factory
    test_trainer_refuses_te_route_cases                 the real CLI, one line, exit 2, nothing
                                                        written: no TE on this machine, SP,
                                                        TP with SR, SR on w, diagnostics, a typo
Training through TE (and the step times against the local route) needs a GPU and TE:
gpu/te_check.sh.
"""

from __future__ import annotations

import sys

import pytest
import torch
from _cli import run
from hydra import compose
from omegaconf import OmegaConf

TINY = [
    "model=tiny",
    "train.seq_len=32",
    "train.micro_batch=2",
    "train.global_batch=2",
    "logging.wandb.mode=disabled",
]
TE = "model.transformer_impl=transformer_engine"


@pytest.mark.usefixtures("hydra_configs")
@pytest.mark.parametrize(
    "overrides,path",
    [
        (["precision=ufp4"], "ufp4_megatron.te.ufp4"),
        (["precision=e2m1"], "ufp4_megatron.te.e2m1"),
        (
            ["precision=ufp4", "precision.rht.fprop=false", "precision.rht.dgrad=false"],
            "ufp4_megatron.te.ufp4_rht_wgrad",
        ),
        (["precision=ufp4", "+precision.overrides.fprop.x.grid=e2m1"], "ufp4_megatron.te.recipe_"),
        (["precision=bf16"], None),
    ],
)
def test_te_route_config_is_megatron_lms_custom_fp4(overrides, path):
    from megatron.core.fp8_utils import _resolve_callable_from_python_import_path as resolve

    from ufp4_megatron.train.model import transformer_config
    from ufp4_megatron.train.precision import recipe_from_config

    cfg = OmegaConf.to_object(compose("config", overrides=["model=tiny", TE, *overrides]))
    recipe = recipe_from_config(cfg.precision)
    tc = transformer_config(cfg, torch.float32, torch.device("cpu"), recipe)
    if path is None:  # BF16: Megatron's TE spec without FP4
        assert tc.fp4 is None
        return
    assert (tc.fp4, tc.fp4_recipe) == ("e2m1", "custom")
    assert tc.fp4_quantizer_factory.startswith(path)
    assert resolve(tc.fp4_quantizer_factory).recipe == recipe
    local = OmegaConf.to_object(compose("config", overrides=["model=tiny", *overrides]))
    assert transformer_config(local, torch.float32, torch.device("cpu"), recipe).fp4 is None


CASES = [  # (overrides, a fragment of the one-line message)
    (
        [TE, "precision=ufp4"],
        "model.transformer_impl=transformer_engine needs "
        "TransformerEngine >= 2.19, which is not installed here; install it",
    ),
    ([TE, "precision=bf16"], "needs TransformerEngine"),  # the TE spec without FP4: TE all the same
    ([TE, "precision=ufp4", "parallel.tp=2"], "tensor parallelism (TP=2) with recipe 'ufp4'"),
    (
        [TE, "precision=ufp4", "parallel.tp=2", "parallel.sp=true"],
        "model.transformer_impl=transformer_engine with parallel.sp=true",
    ),
    ([TE, "precision=e2m1", "precision.sr.w=true"], "rounds the weight stochastically"),
    (
        [TE, "precision=ufp4", "logging.wandb.diagnostics_interval=5"],
        "diagnostics hook the local route's linears",
    ),
    (
        ["model.transformer_impl=te"],
        "model.transformer_impl='te'; valid: local, transformer_engine",
    ),
]


@pytest.mark.parametrize("overrides,fragment", CASES, ids=["+".join(o) for o, _ in CASES])
def test_trainer_refuses_te_route_cases(tmp_path, overrides, fragment):
    r = run(
        [
            sys.executable,
            "-m",
            "ufp4_megatron.train",
            *TINY,
            f"hydra.run.dir={tmp_path / 'run'}",
            f"data.cache_dir={tmp_path / 'cache'}",
            *overrides,
        ],
        tmp_path,
    )
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert fragment in lines[0], lines[0]
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


@pytest.mark.usefixtures("hydra_configs")
def test_te_route_takes_grouped_experts_with_a_4bit_recipe():
    """Grouped MoE experts run through TE with the custom recipe: the TE route's spec gives
    them linears that can checkpoint it (megatron/te_experts.py)."""
    from _config import typed_default

    from ufp4_megatron.train.te_route import check_config

    for recipe in ("ufp4", "e2m1", "bf16"):
        check_config(typed_default("model=moe_small", TE, f"precision={recipe}"))

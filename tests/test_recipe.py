"""Recipes: presets match the paper's Table 1 and NVIDIA's NVFP4; overrides reach any field.

Contracts: ufp4 = E1M2, 1x16, FP32 scales, RHT16 on fprop/dgrad/wgrad, SR on dY only; the
E2M1 baseline = E2M1 with RHT16 on wgrad only; nvfp4 = E4M3 scales, 16x16 weight tiles;
mxfp4 = 1x32 E8M0; overrides make every ablation; bad names list the valid ones.
"""

import dataclasses

import pytest

from ufp4_megatron import Recipe, get_recipe, list_recipes
from ufp4_megatron.quant.recipe import GEMMS, OPERANDS


def _ops(r):
    return [(g, n, r.operand(g, n)) for g in GEMMS for n in OPERANDS[g]]


def test_presets_exist():
    assert list_recipes() == ["bf16", "e2m1", "ufp4", "ufp4_int4", "nvfp4", "mxfp4"]
    assert not get_recipe("bf16").quantized


def test_ufp4_is_table_1():
    r = get_recipe("ufp4")
    assert all(getattr(r, g).rht == 16 for g in GEMMS)
    for _g, n, op in _ops(r):
        assert (op.grid, op.block, op.scale, op.block_2d) == ("e1m2", 16, "fp32", False)
        assert op.rounding == ("sr" if n == "dy" else "rtne")


def test_e2m1_baseline_and_nvidia_presets():
    e = get_recipe("e2m1")
    assert [getattr(e, g).rht for g in GEMMS] == [None, None, 16]
    assert {op.grid for _, _, op in _ops(e)} == {"e2m1"}
    nv = get_recipe("nvfp4")
    assert {op.scale for _, _, op in _ops(nv)} == {"e4m3"}
    assert [op.block_2d for _, n, op in _ops(nv)] == [n == "w" for _, n, _ in _ops(nv)]
    mx = get_recipe("mxfp4")
    assert {(op.block, op.scale) for _, _, op in _ops(mx)} == {(32, "e8m0")}


def test_overrides_build_the_paper_ablations():
    no_rht = get_recipe("ufp4", rht=False)
    assert all(getattr(no_rht, g).rht is None for g in GEMMS)
    fw = get_recipe("ufp4", rht=("fprop", "wgrad"))
    assert [getattr(fw, g).rht for g in GEMMS] == [16, None, 16]
    no_sr = get_recipe("ufp4", sr=())
    assert {op.rounding for _, _, op in _ops(no_sr)} == {"rtne"}
    one = get_recipe("ufp4", **{"fprop.x.grid": "e2m1", "dgrad.rht": None, "wgrad": None})
    assert one.fprop.x.grid == "e2m1" and one.fprop.w.grid == "e1m2"
    assert one.dgrad.rht is None and one.wgrad is None
    capped = get_recipe("e2m1", grid=(0, 0.5, 1, 1.5, 2))  # the paper's capped-E2M1 ablation
    assert capped.fprop.x.grid == (0, 0.5, 1, 1.5, 2)
    assert get_recipe("ufp4", block=32, rht_size=32).fprop.rht == 32


def test_recipes_are_frozen_values():
    r = get_recipe("ufp4")
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.name = "x"
    assert get_recipe("ufp4") == r and isinstance(r, Recipe)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: get_recipe("fp4"), "valid: bf16, e2m1, ufp4"),
        (lambda: get_recipe("ufp4", grdi="e2m1"), "unknown recipe override 'grdi'"),
        (lambda: get_recipe("ufp4", grid="e3m0"), "valid: e2m1"),
        (lambda: get_recipe("ufp4", scale="fp8"), "valid: fp32, e4m3, e8m0"),
        (lambda: get_recipe("ufp4", sr=("dx",)), "valid: x, w, dy"),
        (lambda: get_recipe("ufp4", rht=("bprop",)), "valid: fprop, dgrad, wgrad"),
        (lambda: get_recipe("ufp4", **{"fprop.dy.grid": "e2m1"}), "operand in"),
        (lambda: get_recipe("ufp4", **{"fprop.x.colour": 1}), "unknown field"),
        (lambda: get_recipe("ufp4", rht_size=24), "rht size"),
    ],
)
def test_bad_overrides_say_what_is_valid(call, match):
    with pytest.raises(ValueError, match=match):
        call()

"""The TransformerEngine route's factories and refusals, on CPU (no TransformerEngine here).

    test_every_recipe_name_is_one_factory          presets, ablations, `factory`: one object per
                                                   name, pickled by name (TE pickles the recipe)
    test_megatron_resolves_the_factory_path        megatron-core's own resolver of
                                                   --fp4-quantizer-factory, and its typo message
    test_factory_path_of_any_recipe                named recipes by name, others registered
    test_env_factory_reads_ufp4_recipe             a name, a JSON file, and what it refuses
    test_te_before_2_19_is_refused                 the version gate (out/accumulate were dropped)
    test_tensor_parallel_sr_is_refused             TP > 1 only without SR
    test_sr_on_weights_is_refused                  TE reuses a step's quantized weight
    test_the_package_imports_without_te            nothing but te/quantizers.py imports TE
What TE does with the quantizers (the GEMMs, main_grad, SP's requantization) needs a GPU:
gpu/te_check.sh.
"""

from __future__ import annotations

import ast
import importlib
import json
import pathlib
import pickle
import subprocess
import sys

import pytest

import ufp4_megatron.te as te
from ufp4_megatron.quant.recipe import ABLATIONS, PRESETS, ablation, get_recipe
from ufp4_megatron.te.checks import check_parallel, check_recipe, check_te_version
from ufp4_megatron.te.factories import recipe_from_env

PKG = pathlib.Path(te.__file__).resolve().parents[1]


@pytest.mark.parametrize("name", [*PRESETS, *ABLATIONS, "factory"])
def test_every_recipe_name_is_one_factory(name):
    f = getattr(te, name)
    assert f is getattr(importlib.import_module("ufp4_megatron.te"), name)  # one per process
    assert pickle.loads(pickle.dumps(f)) is f
    if name in PRESETS:
        assert f.recipe is PRESETS[name]
    elif name in ABLATIONS:
        assert f.recipe == ablation(name)


def test_factory_names_are_not_module_names():
    """A module of ufp4_megatron.te must not shadow a factory (nor the reverse)."""
    modules = {p.stem for p in pathlib.Path(te.__file__).parent.glob("*.py")}
    assert not modules & {*PRESETS, *ABLATIONS, "factory"}
    code = "from ufp4_megatron.te import seeds, layouts; print(seeds.draw, layouts.LAYOUTS)"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_unknown_names():
    with pytest.raises(
        ValueError,
        match=r"no quantizer factory 'ufp44'; valid: bf16, e2m1, "
        r"ufp4, .*ufp4_no_sr, factory",
    ):
        te.ufp44  # noqa: B018
    with pytest.raises(AttributeError):  # dunders and privates stay AttributeErrors
        te.__wrapped__  # noqa: B018
    assert not hasattr(te, "_anything")


def test_megatron_resolves_the_factory_path():
    from megatron.core.fp8_utils import _resolve_callable_from_python_import_path as resolve

    assert resolve("ufp4_megatron.te.ufp4") is te.ufp4
    assert resolve("ufp4_megatron.te.ufp4_rht_none") is te.ufp4_rht_none
    with pytest.raises(ValueError, match="no quantizer factory 'uf4'; valid:"):
        resolve("ufp4_megatron.te.uf4")  # our list, not Megatron's "Attribute not found"


def test_factory_path_of_any_recipe():
    assert te.factory_path(PRESETS["e2m1"]) == "ufp4_megatron.te.e2m1"
    assert te.factory_path(get_recipe("ufp4", sr=())) == "ufp4_megatron.te.ufp4_no_sr"
    mixed = get_recipe("ufp4", **{"fprop.x.grid": "e2m1"})
    path = te.factory_path(mixed)
    assert path.startswith("ufp4_megatron.te.recipe_") and path == te.factory_path(mixed)
    mod, attr = path.rsplit(".", 1)
    assert getattr(importlib.import_module(mod), attr).recipe == mixed


def test_env_factory_reads_ufp4_recipe(tmp_path, monkeypatch):
    monkeypatch.delenv(te.ENV, raising=False)
    assert recipe_from_env() is PRESETS["ufp4"]
    monkeypatch.setenv(te.ENV, "ufp4_rht_wgrad")
    assert recipe_from_env() == ablation("ufp4_rht_wgrad")
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"recipe": "ufp4", "overrides": {"wgrad.rht": None}}))
    monkeypatch.setenv(te.ENV, str(path))
    assert recipe_from_env() == get_recipe("ufp4", **{"wgrad.rht": None})
    path.write_text(json.dumps({"recipe": "ufp4", "rules": {"*.linear_fc2": "e2m1"}}))
    with pytest.raises(ValueError, match=r"takes \{\"recipe\": name, \"overrides\".*\['rules'\]"):
        recipe_from_env()
    path.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read it as JSON"):
        recipe_from_env()
    monkeypatch.setenv(te.ENV, "ufp5")
    with pytest.raises(ValueError, match="UFP4_RECIPE='ufp5' is not a recipe"):
        recipe_from_env()


@pytest.mark.parametrize(
    "version,ok",
    [
        ("2.18.0", False),
        ("2.9.0", False),
        ("1.13", False),
        ("2.19.0", True),
        ("2.20.2", True),
        ("2.20.0.dev0+d0067d0", True),
        ("3.0", True),
    ],
)
def test_te_before_2_19_is_refused(version, ok):
    if ok:
        check_te_version(version)
    else:
        with pytest.raises(
            ValueError,
            match=rf"needs TransformerEngine >= 2.19 \(found "
            rf"{version}\): .*gradient-accumulation fusion",
        ):
            check_te_version(version)


def test_tensor_parallel_sr_is_refused():
    check_parallel(PRESETS["ufp4"], 1)
    check_parallel(ablation("ufp4_no_sr"), 4)  # RTNE everywhere: TP changes nothing
    with pytest.raises(
        ValueError,
        match=r"TP=2\) with recipe 'e2m1', which rounds dgrad.dy, "
        r"wgrad.dy stochastically",
    ):
        check_parallel(PRESETS["e2m1"], 2)


def test_sr_on_weights_is_refused():
    check_recipe(get_recipe("ufp4", sr=("dy", "x")))
    with pytest.raises(ValueError, match=r"rounds the weight stochastically \(fprop.w\)"):
        check_recipe(get_recipe("ufp4", sr=("dy", "w")))
    with pytest.raises(ValueError, match="rounds the weight stochastically"):
        te.factory_path(get_recipe("ufp4", sr=("w",)))


def test_the_package_imports_without_te():
    """`import ufp4_megatron.te` and resolving a factory import no TransformerEngine, and only
    two modules of ufp4_megatron/te name it (the test reads every import of the package)."""
    code = (
        "import sys, ufp4_megatron.te as t; t.ufp4; t.factory_path(t.ufp4.recipe)\n"
        "assert not [m for m in sys.modules if m.startswith('transformer_engine')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    importers = set()
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            if any(n == "transformer_engine" or n.startswith("transformer_engine.") for n in names):
                importers.add(path.relative_to(PKG).as_posix())
    # the quantizers, and the question whether TE loads here (asked by the trainer)
    assert importers == {"te/quantizers.py", "te/installed.py"}

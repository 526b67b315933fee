"""Imports flow one way: numerics <- kernels <- ops <- megatron <- data <- train <- report <- cli.

Contract: the numerics, recipe, ops and diagnostics modules import without Megatron, Hydra,
W&B or Triton; no lower layer imports a higher one (checked on the source's import lines).
"""
import ast
import pathlib
import subprocess
import sys

PKG = pathlib.Path(__file__).resolve().parents[1] / "ufp4_megatron"
LAYER = {"numerics": 0, "recipe": 0, "configs": 0, "kernels": 1, "fake_quant": 2, "ops": 2,
         "grouped_ops": 2,
         "diagnostics": 2, "megatron": 3, "data": 4, "train": 5, "report": 6}
# everything else is a command-line entry point (describe, demo, compare, launch, bench, ...)


def _layer(mod: str) -> int:
    return LAYER.get(mod, 7)


def test_core_imports_without_megatron_hydra_wandb_triton():
    code = ("import sys, ufp4_megatron, ufp4_megatron.ops, ufp4_megatron.diagnostics\n"
            "bad = [m for m in ('megatron', 'hydra', 'wandb', 'triton') if m in sys.modules]\n"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_no_module_imports_a_higher_layer():
    offenders = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).parts
        own = _layer(rel[0].removesuffix(".py"))
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom):
                if node.level == 0 and (node.module or "").startswith("ufp4_megatron"):
                    names = [(node.module or "").split(".")[1:2]]
                elif node.level >= 1:
                    base = list(rel[:-1])[: len(rel) - node.level] if node.level > 1 else list(rel[:-1])
                    target = (base + (node.module or "").split("."))[:1] if node.module else base[:1]
                    names = [target or [n.name for n in node.names][:1]]
            elif isinstance(node, ast.Import):
                names = [a.name.split(".")[1:2] for a in node.names if a.name.startswith("ufp4_megatron.")]
            for n in names:
                if n and _layer(n[0]) > own:
                    offenders.append(f"{'/'.join(rel)} imports {n[0]}")
    assert not offenders, offenders

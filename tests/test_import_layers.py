"""The package's import graph: every import points down a layer (or stays in its own), and no
module reaches itself through its imports.

    package data < numerics < kernels < quant (recipe/ops) < megatron/te < data < train
                 < report < study/bench < cli

The graph is read from the source (every `import` statement, those inside functions too: a
lazy import is still a dependency, and a circle hidden in a function is still a circle).
Nodes are modules; `from pkg import name` points at `pkg.name` where that is a module.
`study` (grids of training runs, their packing and resume) and `bench` (timed kernels, layers
and trainer steps) sit above report and below cli: both drive the trainer and read its
reports, and `cli` (launch, demo) drives the study. `te` (the TransformerEngine route's
quantizer factories) sits beside `megatron`: both are glue on the recipe and ops layer, and
neither imports the other. `quant` is the core (recipe, fake_quant, ops, grouped_ops,
weight_cache, diagnostics), the package's own `__init__` (the public API) in its layer.
docs/architecture.md draws the layers.
Contract besides: numerics and quant (recipe, ops, diagnostics) import without Megatron, Hydra,
W&B or Triton.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

PKG = pathlib.Path(__file__).resolve().parents[1] / "ufp4_megatron"

# Bottom first. A top-level name of the package (module or subpackage) belongs to one layer;
# a new one must be placed here (test_every_module_has_a_layer).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("configs", "scripts"),  # package data (Hydra YAMLs, launch scripts): imports nothing
    ("numerics",),
    ("kernels",),
    ("quant", "__init__"),  # the core: recipe, fake_quant, ops, grouped_ops, weight_cache, ...
    ("megatron", "te"),
    ("data",),
    ("train",),
    ("report",),
    ("study", "bench"),
    ("cli",),
)
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}

# (importing module, imported module) pairs excused from the layer rule, each with the change
# that removes it. None today: the last one (study/grid.py -> cli/launch.py for ABLATIONS) went
# when the ablations moved beside the presets (quant/recipe.py, train/precision.py).
KNOWN_UPWARD: set[tuple[str, str]] = set()


def module_names(root: pathlib.Path, package: str) -> dict[str, pathlib.Path]:
    """Dotted name -> file of every module under root (a package's own name for __init__)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join((package, *parts))] = path
    return names


def _type_checking_imports(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (annotations only, never run)."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (
            (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
            or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
        ):
            ids |= {
                id(n)
                for stmt in node.body
                for n in ast.walk(stmt)
                if isinstance(n, (ast.Import, ast.ImportFrom))
            }
    return ids


def import_graph(
    root: pathlib.Path,
    package: str,
    missing: list[str] | None = None,
    *,
    type_checking: bool = True,
) -> dict[str, dict[str, int]]:
    """module -> {imported module of this package: line of the first such import}; an import
    of a module of the package that does not exist is appended to `missing`. With
    type_checking=False, imports under `if TYPE_CHECKING:` are left out: they never run, so
    they close no circle at import time (import-linter's `exclude_type_checking_imports`); the
    layer rule still counts them."""
    modules = module_names(root, package)

    def resolve(name: str) -> str | None:  # the longest prefix that is one of our modules
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {}
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        here = mod.split(".") if is_pkg else mod.split(".")[:-1]  # the package `.` names
        edges = graph.setdefault(mod, {})
        tree = ast.parse(path.read_text(), str(path))
        skip = set() if type_checking else _type_checking_imports(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(
                        here[: len(here) - node.level + 1] + ([node.module] if node.module else [])
                    )
                else:
                    base = node.module or ""
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                    for a in node.names
                ]
            for t in targets:
                if t == package or t.startswith(package + "."):
                    if t not in modules and missing is not None:
                        missing.append(f"{mod} (line {node.lineno}) imports {t}: no such module")
                    dst = resolve(t)
                    if dst and dst != mod:
                        edges.setdefault(dst, node.lineno)
    return graph


def layer_of(mod: str) -> int | None:
    parts = mod.split(".")
    return LAYER.get(parts[1] if len(parts) > 1 else "__init__")


def upward_imports(graph: dict[str, dict[str, int]], layer=layer_of) -> list[str]:
    """`a imports b (line n)` for every edge from a lower layer to a higher one."""
    return [
        f"{src} imports {dst} (line {line}): layer {layer(src)} < {layer(dst)}"
        for src, edges in graph.items()
        for dst, line in edges.items()
        if layer(src) is not None
        and layer(dst) is not None
        and layer(dst) > layer(src)
        and (src, dst) not in KNOWN_UPWARD
    ]


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Every strongly connected component of more than one module, as one circle through it
    (Tarjan's algorithm, iterative: the graph is small but recursion limits are not ours)."""
    index, low, on_stack, stack, comps, counter = {}, {}, set(), [], [], [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        x = stack.pop()
                        on_stack.discard(x)
                        comp.append(x)
                        if x == v:
                            break
                    if len(comp) > 1:
                        comps.append(comp)
            elif w not in index:
                index[w] = low[w] = counter[0]
                counter[0] += 1
                stack.append(w)
                on_stack.add(w)
                work.append((w, iter(graph.get(w, {}))))
            elif w in on_stack:
                low[v] = min(low[v], index[w])
    return [_circle(graph, set(c)) for c in comps]


def _circle(graph, comp: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside it."""
    first = min(comp)
    paths, seen = [[first]], {first}
    while paths:
        path = paths.pop(0)
        for nxt in graph.get(path[-1], {}):
            if nxt == first:
                return path + [first]
            if nxt in comp and nxt not in seen:
                seen.add(nxt)
                paths.append(path + [nxt])
    return sorted(comp)


def _graph(type_checking: bool = True):
    graph = import_graph(PKG, "ufp4_megatron", type_checking=type_checking)
    for src, dst in KNOWN_UPWARD:  # a known upward edge would also close a circle
        graph.get(src, {}).pop(dst, None)
    return graph


def test_core_imports_without_megatron_hydra_wandb_triton():
    code = (
        "import sys, ufp4_megatron, ufp4_megatron.quant.ops, ufp4_megatron.quant.diagnostics\n"
        "bad = [m for m in ('megatron', 'hydra', 'wandb', 'triton') if m in sys.modules]\n"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in module_names(PKG, "ufp4_megatron") if layer_of(m) is None)
    assert not unplaced, f"place these in LAYERS (tests/test_import_layers.py): {unplaced}"


def test_every_import_names_a_module():
    """A moved module leaves no import behind (a lazy one would fail only when called)."""
    missing = []
    import_graph(PKG, "ufp4_megatron", missing)
    assert not missing


def test_no_module_imports_a_higher_layer():
    assert not upward_imports(_graph())


def test_no_import_cycle():
    """Imports for type annotations count too: train/precision.py's TYPE_CHECKING import of
    the schema and the schema's lazy import of precision's resolver would be a circle that
    no import-time error shows (so the resolver has its own module)."""
    assert not import_cycles(_graph(type_checking=True))


def test_known_upward_imports_still_exist():
    """An entry of KNOWN_UPWARD whose import is gone must be deleted, not left to excuse a
    future one."""
    graph = import_graph(PKG, "ufp4_megatron")
    stale = [e for e in KNOWN_UPWARD if e[1] not in graph.get(e[0], {})]
    assert not stale, f"delete from KNOWN_UPWARD: {stale}"


# The checker itself, on a synthetic package: it must see what it is there to see.


def _write(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_checker_finds_a_synthetic_cycle(tmp_path):
    root = _write(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            "a.py": "from .b import f\n",
            "b.py": "def f():\n    from .sub import c  # lazy: still an edge\n",
            "sub/__init__.py": "",
            "sub/c.py": "import pkg.a\n",
            "d.py": "from . import a\n",  # points into the circle, not part of it
        },
    )
    graph = import_graph(root, "pkg")
    assert graph["pkg.sub.c"] == {"pkg.a": 1} and graph["pkg.b"] == {"pkg.sub.c": 2}
    assert graph["pkg.d"] == {"pkg.a": 1}
    assert import_cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]
    (root / "sub/c.py").write_text("import os\n")
    assert import_cycles(import_graph(root, "pkg")) == []


def test_type_checking_imports_close_no_circle_but_still_count_for_layers(tmp_path):
    """A back-import under `if TYPE_CHECKING:` never runs: no circle at import time. A lazy
    import inside a function does run, so it still closes one."""
    root = _write(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            "a.py": "def f():\n    from .b import g\n",
            "b.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from .a import f\ndef g(x: 'f'): ...\n"
            ),
        },
    )
    assert import_graph(root, "pkg")["pkg.b"] == {"pkg.a": 3}  # the layer rule sees it
    assert import_cycles(import_graph(root, "pkg", type_checking=False)) == []
    (root / "b.py").write_text("def g():\n    from .a import f\n")
    assert import_cycles(import_graph(root, "pkg", type_checking=False)) == [
        ["pkg.a", "pkg.b", "pkg.a"]
    ]


def test_checker_finds_a_synthetic_upward_import(tmp_path):
    root = _write(
        tmp_path / "ufp4_megatron",
        {
            "__init__.py": "",
            "numerics/__init__.py": "",
            "numerics/grids.py": "import torch\nfrom ..train.loop import run\n",
            "train/__init__.py": "",
            "train/loop.py": "from ufp4_megatron.numerics import grids\nrun = 0\n",
        },
    )
    graph = import_graph(root, "ufp4_megatron")
    assert upward_imports(graph) == [
        "ufp4_megatron.numerics.grids imports ufp4_megatron.train.loop (line 2): layer 1 < 6"
    ]
    assert import_cycles(graph) == [
        ["ufp4_megatron.numerics.grids", "ufp4_megatron.train.loop", "ufp4_megatron.numerics.grids"]
    ]


def test_checker_finds_an_import_of_a_module_that_is_gone(tmp_path):
    root = _write(
        tmp_path / "ufp4_megatron",
        {
            "__init__.py": "",
            "bench/__init__.py": "",
            "bench/step.py": "def flops():\n    from ..describe import count_params\n",
        },
    )
    missing = []
    import_graph(root, "ufp4_megatron", missing)
    assert missing == [
        "ufp4_megatron.bench.step (line 2) imports ufp4_megatron.describe: no such module"
    ]


@pytest.mark.parametrize(
    "line, target",
    [
        ("from .. import ops", "ufp4_megatron.ops"),
        ("from ..recipe import Recipe", "ufp4_megatron.recipe"),
        ("from . import launch", "ufp4_megatron.kernels.launch"),
        ("import ufp4_megatron.kernels.launch as k", "ufp4_megatron.kernels.launch"),
        ("from ufp4_megatron import recipe, ops", "ufp4_megatron.recipe"),
    ],
)
def test_checker_resolves_relative_and_absolute_imports(tmp_path, line, target):
    root = _write(
        tmp_path / "ufp4_megatron",
        {
            "__init__.py": "",
            "ops.py": "",
            "recipe.py": "",
            "kernels/__init__.py": "",
            "kernels/launch.py": "",
            "kernels/x.py": line + "\n",
        },
    )
    assert target in import_graph(root, "ufp4_megatron")["ufp4_megatron.kernels.x"]

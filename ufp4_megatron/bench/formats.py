"""Recipe table: each recipe's QDQ pass of each GEMM operand, against the copy roofline.

The kernel table (kernels.py) times UFP4's format alone. The recipes differ in what their
operands take: E2M1's binade rounding, MXFP4's 1x32 blocks with e8m0 scales (the generic
kernel along rows, the 16-tensor kernel along columns: each column row is timed through the
generic kernel too, the same values, so the table shows what that kernel gains), NVFP4's
e4m3 block scales under a tensor scale and its weights' 16x16 tiles (the generic kernel in
both layouts). Per recipe and (GEMM, operand), one quantize_view of a
bf16 tensor in the layout and format that GEMM uses (recipe.operand: grid, block, scale, RHT,
rounding; a column layout is the transposed view, as ops.py passes it), timed like the kernel
table: bytes = one read and one write of the tensor, "% copy" = its share of a device copy's
bandwidth in the same run. The e4m3 tensor amax is taken before timing and passed in: its
own pass is the amax table's (amax.py). A recipe's rows against UFP4's say where its step's
QDQ time goes beyond UFP4's (docs/performance.md, the CUDA-graph rows).
"""

from __future__ import annotations

import torch

from ..kernels import quantize_view, tensor_amax
from ..kernels.dispatch import TILES
from ..numerics.hadamard import as_rht
from ..quant.recipe import GEMMS, get_recipe, reduction_dim
from .timing import median_ms, rotating

SHAPE = (8192, 8192)
RECIPES = ("ufp4", "e2m1", "nvfp4", "mxfp4")
SEED = 1234


def operand_formats(recipe_name: str):
    """(gemm, operand, OperandFormat, along_rows) of every operand `recipe_name` quantizes."""
    recipe = get_recipe(recipe_name)
    out = []
    for gemm in GEMMS:
        spec = getattr(recipe, gemm)
        if spec is None:
            continue
        rht = as_rht(spec.rht, recipe.rht_seed)
        for name, op in recipe.operands(gemm):
            if op is not None:
                out.append((gemm, name, op.format(rht), reduction_dim(gemm, name) == 0))
    return out


def _call(fmt, along_rows: bool, amax, tiles=None):
    def run(x):
        view = x.t() if along_rows else x
        return quantize_view(view, fmt=fmt, seed=SEED, tensor_amax=amax, tiles=tiles)

    return run


def _two_kernels(fmt, along_rows: bool) -> bool:
    """Whether a layout has both a 16-tensor and a generic kernel worth comparing: 1x32
    column blocks (MXFP4's), new to the 16-tensor kernel."""
    return along_rows and fmt.block == 32 and not fmt.block_2d


def format_rows(
    log=print, *, shape=SHAPE, recipes=RECIPES, device="cuda", timer=median_ms
) -> list[dict]:
    """The table's rows; `timer(fn, inputs)` -> ms (CUDA events; the CPU test passes its own)."""
    n = shape[0] * shape[1]
    inputs = rotating(lambda: torch.randn(shape, device=device, dtype=torch.bfloat16), 2 * n)
    out = torch.empty_like(inputs[0])
    copy_ms = timer(lambda x: out.copy_(x), inputs)
    copy_bw = 4 * n / copy_ms / 1e9
    rows = []

    def add(recipe, what, ms):
        rows.append(dict(shape=shape, recipe=recipe, what=what, ms=ms, tbs=4 * n / ms / 1e9))
        log(rows[-1])

    add("-", "copy (roofline)", copy_ms)
    for recipe in recipes:
        for gemm, name, fmt, along_rows in operand_formats(recipe):
            view = inputs[0].t() if along_rows else inputs[0]
            amax = tensor_amax(view, fmt) if fmt.scale == "e4m3" else None
            ms = timer(_call(fmt, along_rows, amax), inputs)
            layout = "col" if along_rows else "row"
            what = f"{gemm} {name}: {layout}, {describe(fmt)}"
            add(recipe, what, ms)
            if _two_kernels(fmt, along_rows):
                ms = timer(_call(fmt, along_rows, amax, {"col": TILES["col"]}), inputs)
                add(recipe, f"{what}, generic kernel", ms)
    for r in rows:
        r["pct"] = 100 * r["tbs"] / copy_bw
    return rows


def describe(fmt) -> str:
    """A format in a few words: grid, block, scale, RHT, rounding."""
    block = f"{fmt.block}x{fmt.block}" if fmt.block_2d else f"1x{fmt.block}"
    rht = f", RHT{fmt.rht.size}" if fmt.rht is not None else ""
    return f"{fmt.grid} {block} {fmt.scale}{rht}, {fmt.rounding}"


def format_table(rows: list[dict]) -> str:
    lines = [
        "| recipe | operand: layout, format | ms (median) | TB/s (read+write) | % of copy BW |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['recipe']} | {r['what']} | {r['ms']:.4f} | {r['tbs']:.2f} | {r['pct']:.0f}% |"
        )
    return "\n".join(lines)

"""Tensor-amax table: NVFP4's e4m3 tensor scales, one pass per layout against one pass for two.

NVFP4 quantizes x for fprop (1x16 blocks along K) and for wgrad (1x16 along the tokens, after
RHT16), dY for dgrad and wgrad alike, and w for fprop and dgrad (16x16 tiles, the same tiles in
both layouts); each of those quantizations needs the tensor amax of its layout first, a read
of the whole operand. `kernels.tensor_amax_pair` takes both layouts' amax from one read
(ops.tensor_amaxes): the 16-tensor pair kernel for x and dY, one pass of the amax kernel for
w; the column layout alone (grouped experts) takes the 16-tensor amax kernel. Per shape and
operand: the two single passes, the pair pass (for x and dY also the generic pair kernel the
16-tensor one replaced, and the column pass on the generic kernel: the same values), and the
read bandwidth each reaches (2 bytes per bf16 element read per pass) as a share of a
device-to-device copy's (read and write) measured in the same run.
"""

from __future__ import annotations

import torch

from ..kernels import tensor_amax, tensor_amax_pair
from ..numerics.hadamard import RHT
from ..numerics.quantize import OperandFormat
from .timing import median_ms, rotating

SHAPES = ((4096, 2048), (4096, 6144), (16384, 2048), (8192, 8192))  # rows x columns
ROW = OperandFormat("e2m1", block=16, scale="e4m3")  # fprop's x, dgrad's dY
COL = OperandFormat("e2m1", block=16, scale="e4m3", rht=RHT(16, 0))  # wgrad's x and dY
TILES = OperandFormat("e2m1", block=16, scale="e4m3", block_2d=True)  # w, fprop and dgrad
# operand: (row layout's format, its pass's name, column layout's, its pass's name)
PASSES = {
    "x, dY": (ROW, "row pass (fprop x, dgrad dY)", COL, "column pass, RHT16 (wgrad)"),
    "w": (TILES, "w row pass, 16x16 (fprop)", TILES, "w column pass, 16x16 (dgrad)"),
}
GENERIC = {"x, dY"}  # operands whose pair the generic pair kernel is also timed for


def _passes(row, col, generic: bool) -> list:
    """The timed passes of one operand: its row layout, its column layout, the pair, and with
    `generic` the generic pair kernel's pair and the column layout on the generic kernel."""
    fns = [
        lambda x: tensor_amax(x, row),
        lambda x: tensor_amax(x.t(), col),
        lambda x: tensor_amax_pair(x, row, col),
    ]
    if generic:
        fns.append(lambda x: tensor_amax_pair(x, row, col, generic=True))
        fns.append(lambda x: tensor_amax(x.t(), col, generic=True))
    return fns


def amax_rows(log=print, *, shapes=SHAPES, device="cuda", timer=median_ms) -> list[dict]:
    """The table's rows; `timer(fn, inputs)` -> ms (CUDA events; the CPU test passes its own)."""
    rows = []
    for shape in shapes:
        n = shape[0] * shape[1]
        inputs = rotating(lambda: torch.randn(shape, device=device, dtype=torch.bfloat16), 2 * n)
        out = torch.empty_like(inputs[0])
        copy_ms = timer(lambda x: out.copy_(x), inputs)
        copy_bw = 4 * n / copy_ms / 1e9
        for operand, (row, row_name, col, col_name) in PASSES.items():
            generic = operand in GENERIC
            fns = _passes(row, col, generic)
            names = [row_name, col_name, f"both ({operand}), one pair pass"]
            if generic:
                names += [f"both ({operand}), generic pair kernel", f"{col_name}, generic kernel"]
            x = inputs[0]  # every pair is each single pass's amax, bit for bit
            singles = torch.stack([fns[0](x), fns[1](x)])
            for name, fn in zip(names[2:4], fns[2:4]):
                assert torch.equal(fn(x), singles), (operand, name, fn(x), singles)
            if generic:  # the column layout through the generic kernel: the same value
                assert torch.equal(fns[4](x), singles[1]), (operand, names[4])
            ms = [timer(fn, inputs) for fn in fns]
            two = ms[0] + ms[1]
            reads = (1,) * len(ms) + (2,)  # the passes' reads of the operand
            for what, t, k in zip((*names, f"both ({operand}), two passes"), (*ms, two), reads):
                bw = k * 2 * n / t / 1e9
                pct = 100 * bw / copy_bw
                rows.append(dict(shape=shape, what=what, ms=t, tbs=bw, pct=pct, vs_two=t / two))
                log(rows[-1])
    return rows


def amax_table(rows: list[dict]) -> str:
    lines = [
        "| shape | amax of | ms | read TB/s | % copy | x two passes |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape'][0]}x{r['shape'][1]} | {r['what']} | {r['ms']:.4f} | "
            f"{r['tbs']:.2f} | {r['pct']:.0f}% | {r['vs_two']:.2f} |"
        )
    return "\n".join(lines)

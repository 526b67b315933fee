"""Tensor-amax table: NVFP4's e4m3 tensor scales, one pass per layout against one pass for two.

NVFP4 quantizes x for fprop (1x16 blocks along K) and for wgrad (1x16 along the tokens, after
RHT16), and dY for dgrad and wgrad alike; each of those quantizations needs the tensor amax
of its layout first, a read of the whole operand. `kernels.tensor_amax_pair` takes both
layouts' amax from one read (ops.tensor_amaxes). Per shape: the two single passes, the pair
pass, and the read bandwidth each reaches (2 bytes per bf16 element read per pass) as a share
of a device-to-device copy's (read and write) measured in the same run.
"""

from __future__ import annotations

import torch

from ..kernels import tensor_amax, tensor_amax_pair
from ..numerics.hadamard import RHT
from ..numerics.quantize import OperandFormat
from .timing import median_ms, rotating

SHAPES = ((4096, 2048), (4096, 6144), (16384, 2048), (8192, 8192))  # tokens x features
ROW = OperandFormat("e2m1", block=16, scale="e4m3")  # fprop's x, dgrad's dY
COL = OperandFormat("e2m1", block=16, scale="e4m3", rht=RHT(16, 0))  # wgrad's x and dY


def amax_rows(log=print, *, shapes=SHAPES, device="cuda", timer=median_ms) -> list[dict]:
    """The table's rows; `timer(fn, inputs)` -> ms (CUDA events; the CPU test passes its own)."""
    rows = []
    for shape in shapes:
        n = shape[0] * shape[1]
        inputs = rotating(lambda: torch.randn(shape, device=device, dtype=torch.bfloat16), 2 * n)
        out = torch.empty_like(inputs[0])
        copy_ms = timer(lambda x: out.copy_(x), inputs)
        copy_bw = 4 * n / copy_ms / 1e9
        x = inputs[0]  # the pair is each single pass's amax, bit for bit
        pair = tensor_amax_pair(x, ROW, COL)
        singles = torch.stack([tensor_amax(x, ROW), tensor_amax(x.t(), COL)])
        assert torch.equal(pair, singles), (pair, singles)
        timed = {
            "row pass (fprop x, dgrad dY)": lambda x: tensor_amax(x, ROW),
            "column pass, RHT16 (wgrad)": lambda x: tensor_amax(x.t(), COL),
            "both, one pair pass": lambda x: tensor_amax_pair(x, ROW, COL),
        }
        ms = {what: timer(fn, inputs) for what, fn in timed.items()}
        two = ms["row pass (fprop x, dgrad dY)"] + ms["column pass, RHT16 (wgrad)"]
        for what, t in [*ms.items(), ("both, two passes", two)]:
            reads = 2 if what == "both, two passes" else 1
            bw = reads * 2 * n / t / 1e9
            rows.append(
                dict(shape=shape, what=what, ms=t, tbs=bw, pct=100 * bw / copy_bw, vs_two=t / two)
            )
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

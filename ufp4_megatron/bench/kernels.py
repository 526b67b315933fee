"""Kernel table: fused QDQ vs the copy roofline, the naive torch reference and its compile.

Bytes moved by one layout: the input read once plus the output written once (2 + 2 bytes
per bf16 element). The roofline is a
device-to-device copy of the same tensor, timed the same way; "% copy" = copy bandwidth
share achieved = (bytes / time) / (copy bytes / copy time).
"""

from __future__ import annotations

import torch

from ..kernels import quantize_view
from ..numerics.hadamard import RHT
from ..numerics.quantize import quantize_view as reference
from .timing import median_ms, rotating

SHAPES = ((8192, 8192), (16384, 2048), (8192, 5632))
GRID = "e1m2"


def _spec(rounding: str, rht: bool) -> dict:
    return dict(grid=GRID, rounding=rounding, rht=RHT(16, 0) if rht else None, seed=1234)


def _runner(layout: str, spec: dict):
    if layout == "row":
        return lambda x: quantize_view(x, **spec)
    return lambda x: quantize_view(x.t(), **spec)


def kernel_rows(compile_shapes=((8192, 8192),), log=print) -> list[dict]:
    rows = []
    for shape in SHAPES:
        n = shape[0] * shape[1]
        inputs = rotating(lambda: torch.randn(shape, device="cuda", dtype=torch.bfloat16), 2 * n)
        outs = [torch.empty_like(inputs[0])]
        copy_ms = median_ms(lambda x: outs[0].copy_(x), inputs)  # noqa: F821 - called before the del below
        copy_bw = 4 * n / copy_ms / 1e9
        rows.append(dict(shape=shape, what="copy (roofline)", ms=copy_ms, tbs=copy_bw, pct=100.0))
        log(rows[-1])
        for layout in ("row", "col"):
            for rounding in ("rtne", "sr"):
                for rht in (False, True):
                    ms = median_ms(_runner(layout, _spec(rounding, rht)), inputs)
                    bw = 4 * n / ms / 1e9
                    rows.append(
                        dict(
                            shape=shape,
                            what=f"triton {layout} {rounding}{' rht16' if rht else ''}",
                            ms=ms,
                            tbs=bw,
                            pct=100 * bw / copy_bw,
                        )
                    )
                    log(rows[-1])
        for rht in (False, True):
            spec = _spec("rtne", rht)
            ms = median_ms(lambda x: reference(x, **spec), inputs[:2], warmup_ms=5, rep_ms=50)
            rows.append(
                dict(
                    shape=shape,
                    what=f"torch reference row rtne{' rht16' if rht else ''}",
                    ms=ms,
                    tbs=4 * n / ms / 1e9,
                    pct=100 * 4 * n / ms / 1e9 / copy_bw,
                )
            )
            log(rows[-1])
            if shape in compile_shapes and not rht:  # one compile: each costs ~1 min
                try:
                    compiled = torch.compile(lambda x: reference(x, **spec), dynamic=False)
                    compiled(inputs[0])
                    ms = median_ms(compiled, inputs)
                except Exception as e:  # report, keep benchmarking the rest
                    log(dict(shape=shape, what="torch.compile failed", error=repr(e)[:300]))
                    continue
                rows.append(
                    dict(
                        shape=shape,
                        what=f"torch.compile(reference) row rtne{' rht16' if rht else ''}",
                        ms=ms,
                        tbs=4 * n / ms / 1e9,
                        pct=100 * 4 * n / ms / 1e9 / copy_bw,
                    )
                )
                log(rows[-1])
        del inputs, outs
        torch.cuda.empty_cache()
    return rows


def kernel_table(rows: list[dict]) -> str:
    out = [
        "| shape | kernel | ms (median) | TB/s (read+write) | % of copy BW |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        out.append(
            f"| {r['shape'][0]}x{r['shape'][1]} | {r['what']} | {r['ms']:.4f} | "
            f"{r['tbs']:.2f} | {r['pct']:.0f}% |"
        )
    return "\n".join(out)

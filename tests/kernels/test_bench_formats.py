"""python -m ufp4_megatron.bench --suite formats (bench/formats.py): its code path here with a
stand-in timer. Every recipe's six operand quantizations are timed, each the call the GEMM's
operand preparation makes: the kernels' output equals the reference's for that format, with
the e4m3 tensor amax the bench passes in."""

import torch

from ufp4_megatron.bench import formats
from ufp4_megatron.quant.fake_quant import quantize_view as fake_quant

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_format_rows_time_each_recipes_operands_as_the_reference_quantizes_them():
    checked = []
    rows_of = {r: formats.operand_formats(r) for r in formats.RECIPES}

    def timer(fn, inputs):
        out = fn(inputs[0])
        if len(checked) == 0:  # the copy
            checked.append("copy")
            return 2.0
        recipe = next(r for r in formats.RECIPES if len(rows_of[r]) > 0)
        gemm, name, fmt, along_rows = rows_of[recipe].pop(0)
        view = inputs[0].t() if along_rows else inputs[0]
        want = fake_quant(view, fmt=fmt, seed=formats.SEED, backend="torch")
        assert torch.equal(out, want), (recipe, gemm, name)
        checked.append((recipe, gemm, name))
        return 4.0

    rows = formats.format_rows(log=lambda r: None, shape=(64, 96), device=DEVICE, timer=timer)
    assert len(rows) == 1 + 6 * len(formats.RECIPES) == len(checked)
    assert rows[0]["what"] == "copy (roofline)" and rows[0]["pct"] == 100.0
    assert all(r["pct"] == 50.0 for r in rows[1:])  # twice the copy's time, the same bytes
    nv = [r["what"] for r in rows if r["recipe"] == "nvfp4"]
    assert "fprop w: row, e2m1 16x16 e4m3, rtne" in nv
    assert "wgrad dy: col, e2m1 1x16 e4m3, RHT16, sr" in nv
    table = formats.format_table(rows)
    assert "| mxfp4 | dgrad w: col, e2m1 1x32 e8m0, rtne |" in table

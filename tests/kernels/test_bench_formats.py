"""python -m ufp4_megatron.bench --suite formats (bench/formats.py): its code path here with a
stand-in timer. Every recipe's six operand quantizations are timed, each the call the GEMM's
operand preparation makes: the kernels' output equals the reference's for that format, with
the e4m3 tensor amax the bench passes in. MXFP4's three column operands are timed twice: the
16-tensor kernel, then the generic one (the same values)."""

import torch

from ufp4_megatron.bench import formats
from ufp4_megatron.quant.fake_quant import quantize_view as fake_quant

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_format_rows_time_each_recipes_operands_as_the_reference_quantizes_them(monkeypatch):
    import ufp4_megatron.kernels.dispatch as dispatch

    launched = []
    real = dispatch.launch
    monkeypatch.setattr(
        dispatch, "launch", lambda k, *a, **kw: launched.append(k.fn.__name__) or real(k, *a, **kw)
    )
    checked = []
    calls = [("copy", None, None, None, False)]
    for r in formats.RECIPES:
        for gemm, name, fmt, along_rows in formats.operand_formats(r):
            calls.append((r, gemm, name, (fmt, along_rows), False))
            if r == "mxfp4" and along_rows:
                calls.append((r, gemm, name, (fmt, along_rows), True))

    def timer(fn, inputs):
        launched.clear()
        out = fn(inputs[0])
        recipe, gemm, name, op, generic = calls[len(checked)]
        if recipe == "mxfp4" and op[1]:  # a column layout: which kernel the row timed
            assert launched == ["_qdq_kernel" if generic else "_col16_kernel"], (name, generic)
        checked.append((recipe, gemm, name, generic))
        if recipe == "copy":
            return 2.0
        fmt, along_rows = op
        view = inputs[0].t() if along_rows else inputs[0]
        want = fake_quant(view, fmt=fmt, seed=formats.SEED, backend="torch")
        assert torch.equal(out, want), (recipe, gemm, name, generic)
        return 4.0

    rows = formats.format_rows(log=lambda r: None, shape=(64, 96), device=DEVICE, timer=timer)
    assert len(rows) == 1 + 6 * len(formats.RECIPES) + 3 == len(checked) == len(calls)
    assert rows[0]["what"] == "copy (roofline)" and rows[0]["pct"] == 100.0
    assert all(r["pct"] == 50.0 for r in rows[1:])  # twice the copy's time, the same bytes
    nv = [r["what"] for r in rows if r["recipe"] == "nvfp4"]
    assert "fprop w: row, e2m1 16x16 e4m3, rtne" in nv
    assert "wgrad dy: col, e2m1 1x16 e4m3, RHT16, sr" in nv
    table = formats.format_table(rows)
    assert "| mxfp4 | dgrad w: col, e2m1 1x32 e8m0, rtne |" in table
    assert "| mxfp4 | dgrad w: col, e2m1 1x32 e8m0, rtne, generic kernel |" in table
    assert sum(r["what"].endswith("generic kernel") for r in rows) == 3

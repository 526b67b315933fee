"""The kernels on the GPU at larger shapes, bit for bit against the reference run on the same
GPU (and, for the UFP4 operand specs, on the CPU too). Run with `make test-gpu`.

| test                                        | what                                           |
| gpu_ufp4_operands_match_reference           | e1m2 rht16 rtne/sr, row/col (16-tensor and generic kernels), 4096x6144 and odd 3000x2000, vs GPU and CPU reference |
| gpu_mxfp4_columns_match_reference           | MXFP4's three column passes (1x32, e8m0; RHT16 and SR on wgrad's), 16-tensor vs generic kernel vs GPU reference, and the wgrad pair |
| gpu_all_grids_and_scales_match              | 5 grids x 3 scales, SR + rht16 (the longest path), row, 1024x1536 |
| gpu_block_options_and_special_values_match  | blocks 16/32, 2D tiles, keep_padding, NaN/Inf/zero/subnormal rows, row fp32 and col e8m0+rht32 |
| gpu_pair_matches_reference                  | the pair kernel (both operands of fprop/dgrad/wgrad in one launch), UFP4 specs, 4096x6144 and odd shapes, vs GPU reference |
| gpu_e4m3_nan_and_fp16_rht                   | e4m3 (1x16 and 16x16) with NaN/Inf blocks staying local; fp16 + RHT16 near fp16's max -> finite fp32 |

Few kernel variants on purpose: each compiles for seconds (run with -n 8 to compile in parallel).
"""

import pytest
import torch
from kernel_assertions import assert_bitwise

from ufp4_megatron import kernels
from ufp4_megatron.kernels.dispatch import TILES
from ufp4_megatron.numerics.hadamard import RHT
from ufp4_megatron.numerics.quantize import quantize_view as reference

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _data(rows, cols, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, cols, device="cuda", generator=g)
    return (x * torch.rand(rows, 1, device="cuda", generator=g).mul(6).exp2()).bfloat16()


@needs_cuda
@pytest.mark.parametrize("shape", [(4096, 6144), (3000, 2000)])
@pytest.mark.parametrize("rounding", ["rtne", "sr"])
def test_gpu_ufp4_operands_match_reference(shape, rounding):
    x = _data(*shape, seed=shape[1])
    spec = dict(grid="e1m2", rounding=rounding, rht=RHT(16, 3), seed=2**45 + 11)
    col_spec = dict(spec, seed=5, origin=(4, 64))
    row, col = kernels.quantize_view(x, **spec), kernels.quantize_view(x.t(), **col_spec)
    assert_bitwise(row, reference(x, **spec), "row")
    assert_bitwise(col, reference(x.t(), **col_spec), "col")
    # the generic tile kernel (forced by tiles) on the same specs
    assert_bitwise(kernels.quantize_view(x, tiles=TILES, **spec), row, "generic row")
    assert_bitwise(kernels.quantize_view(x.t(), tiles=TILES, **col_spec), col, "generic col")
    small = x[:256, :512]
    assert_bitwise(kernels.quantize_view(small, **spec), reference(small.cpu(), **spec), "cpu")


@needs_cuda
@pytest.mark.parametrize("shape", [(4096, 6144), (3000, 2000)])
def test_gpu_mxfp4_columns_match_reference(shape):
    x, dy = _data(*shape, seed=3), _data(shape[0], shape[1] // 2, seed=4)
    mx = dict(grid="e2m1", block=32, scale="e8m0")
    sr = dict(mx, rounding="sr", rht=RHT(16, 2), seed=2**40 + 3, origin=(0, 64))
    for name, view, kw in (
        ("dgrad w", x.t(), mx),
        ("wgrad dy", dy.t(), sr),
        ("wgrad x", x.t(), dict(mx, rht=RHT(16, 2))),
    ):  # column layouts: transposed views of row-major tensors
        got = kernels.quantize_view(view, **kw)
        assert_bitwise(got, reference(view, **kw), name)
        assert_bitwise(kernels.quantize_view(view, tiles=TILES, **kw), got, f"{name} generic")
    x_kw = dict(mx, rht=RHT(16, 2))
    qa, qb = kernels.quantize_pair(dy.t(), sr, x.t(), x_kw)  # one launch
    assert_bitwise(qa, reference(dy.t(), **sr), "pair dy")
    assert_bitwise(qb, reference(x.t(), **x_kw), "pair x")


@needs_cuda
@pytest.mark.parametrize("scale", ["fp32", "e4m3", "e8m0"])
@pytest.mark.parametrize(
    "grid", ["e2m1", "e1m2", "int4", "int4_asym", tuple(float(v) for v in range(16))], ids=str
)
def test_gpu_all_grids_and_scales_match(grid, scale):
    x = _data(1024, 1536, seed=1)
    kw = dict(scale=scale, rounding="sr", rht=RHT(16, 1), seed=9)
    if kernels.supports(x, grid, **kw):
        assert_bitwise(kernels.quantize_view(x, grid, **kw), reference(x, grid, **kw), f"{kw}")
    else:
        assert scale == "e4m3" and grid == "int4_asym"


@needs_cuda
@pytest.mark.parametrize("block,block_2d", [(16, False), (32, False), (16, True)])
def test_gpu_block_options_and_special_values_match(block, block_2d):
    x = _data(999, 1000, seed=block).float()
    x[0, 5], x[1, 40], x[2], x[3] = float("nan"), float("-inf"), 0.0, x[3] * 1e-41
    for view, scale, rht in ((x, "fp32", None), (x.t(), "e8m0", RHT(32, 2))):
        kw = dict(
            block=block,
            block_2d=block_2d,
            scale=scale,
            rht=rht,
            keep_padding=True,
            rounding="sr",
            seed=1,
        )
        assert_bitwise(
            kernels.quantize_view(view, "e1m2", **kw), reference(view, "e1m2", **kw), f"{kw}"
        )


@needs_cuda
@pytest.mark.parametrize("shape", [(4096, 6144), (3000, 2000)])
def test_gpu_pair_matches_reference(shape):
    x = _data(*shape, seed=7)
    w = _data(shape[1] // 2, shape[1], seed=8)
    dy = _data(shape[0], shape[1] // 2, seed=9)
    rtne = dict(grid="e1m2", rht=RHT(16, 0), keep_padding=True)
    sr = dict(rtne, rounding="sr", seed=2**50 + 5, origin=(0, 64))
    for name, a, a_kw, b, b_kw in (
        ("fprop", x, rtne, w, rtne),
        ("dgrad", dy, sr, w.t(), rtne),
        ("wgrad", dy.t(), sr, x.t(), rtne),
    ):
        qa, qb = kernels.quantize_pair(a, a_kw, b, b_kw)
        assert_bitwise(qa, reference(a, **a_kw), f"{name} a")
        assert_bitwise(qb, reference(b, **b_kw), f"{name} b")


@needs_cuda
def test_gpu_e4m3_nan_and_fp16_rht():
    x = _data(1000, 1024, seed=10).float()
    x[0, 5], x[500, 700] = float("nan"), float("inf")
    for block_2d in (False, True):
        for view in (x, x.t()):
            kw = dict(scale="e4m3", block_2d=block_2d, rounding="sr", seed=3)
            got = kernels.quantize_view(view, "e2m1", **kw)
            assert_bitwise(got, reference(view, "e2m1", **kw), f"e4m3 2d={block_2d}")
            assert int(torch.isnan(got).sum()) == 2 * (256 if block_2d else 16)
    h = (x.nan_to_num(0.0, 0.0, 0.0) * 100).clamp(-60000, 60000)
    big = 16400.0 * RHT(16, 0).signs.cuda()  # rotates to 65600 > fp16's max
    h[0, :16], h[:16, 20] = big, big  # one block for each layout
    h = h.half()
    for view in (h, h.t()):
        got = kernels.quantize_view(view, "e1m2", rht=RHT(16, 0))
        assert got.dtype == torch.float32 and torch.isfinite(got).all()
        assert_bitwise(got, reference(view, "e1m2", rht=RHT(16, 0)), "fp16 rht")

"""Kernel vs reference, bit for bit: ufp4_megatron.kernels against numerics.quantize.

Runs on a GPU when there is one, else in Triton's CPU interpreter (conftest.py), at small
odd shapes. Every comparison is torch.equal on the values (NaN positions must match too).
1x16 blocks with RHT16 or none go through the 16-tensor kernels (quantize16_triton), the
rest through the generic tile kernel (quantize_triton); both are covered, and the generic
kernel on 1x16 blocks too (forced by `tiles`). In the
interpreter the kernels divide with div_rn (its fma is not fused); the fast exact division
is covered by the GPU tests (test_quantize_triton_gpu.py).

Coverage matrix (each row one test; x: every value of the axis is crossed with the others)
| test                                   | grids      | scale  | rounding | block/2D | RHT        | layout        |
| matches_reference_bitwise              | all 6   x  | all  x | both x   | 16       | 16         | row, col      |
| block_options_match                    | e1m2       | fp32   | both     | 16/32 x 2D, keep_padding | none/16/32/64 | row, col x |
| dtypes_match                           | e2m1       | fp32   | rtne     | 16       | 16         | row; in x out dtype |
| special_values_match                   | e2m1, e1m2, int4_asym, 16-level x | all x | both | 16, 32 2D | none/16 | row, col x |
| e2m1_binade_rounding_matches_tables_at_ties | e2m1 (binade path) | fp32 | both x | 16 | none | row, col x; 16-tensor and generic kernels |
| generic_kernel_matches_on_16_blocks    | e1m2,int4  | fp32/e8m0 | sr    | 16       | none/16    | row, col (generic kernel) |
| pair_matches_two_single_launches       | e1m2,e2m1,int4_asym,codebook | fp32/e4m3/e8m0 | both | 16 (+32, 2D: two launches) | none/16 | row+row, row+col, col+col |
| e4m3_nan_stays_in_its_block            | e2m1       | e4m3   | both     | 16, 16 2D | none/16   | row, col      |
| fp16_rht_is_float32_and_finite         | e1m2       | fp32   | rtne     | 16       | 16         | row, col, pair |
| rht_near_fp32_max_is_finite            | e1m2, e2m1 | fp32, e4m3 | both | 16, 32 | 16, 32, 64 | row, col      |
| non_contiguous_inputs_match            | e1m2       | fp32   | both     | 16, 32 2D | none/16   | slices, offsets, expanded, permuted |
| sr_shard_reproduces_full_tensor_bits   | e1m2       | fp32   | sr       | 16       | 16         | row, col      |
| supports_refuses_what_is_not_built     | -
| quantized_linear_triton_matches_torch  | ufp4, nvfp4, mxfp4, e2m1 recipes, bf16 and fp16, forward and backward
| triton_backend_refuses_what_it_lacks   | backend="triton" says what the kernels do not implement
"""

import pytest
import torch
from kernel_assertions import assert_bitwise

from ufp4_megatron import get_recipe, kernels, quantize, quantized_linear
from ufp4_megatron.kernels.dispatch import TILES
from ufp4_megatron.numerics.hadamard import RHT
from ufp4_megatron.numerics.quantize import OperandFormat
from ufp4_megatron.numerics.quantize import quantize_view as reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The interpreter runs kernels in numpy, which warns on the NaN/Inf the special-value tests
# feed in on purpose.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
GRIDS = [
    "e2m1",
    "e1m2",
    "int4",
    "int4_asym",
    (0.0, 0.5, 1.0, 3.0),
    tuple(float(v) for v in range(16)),
]


def _data(rows, cols, seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * torch.rand(rows, 1, generator=g).mul(4).exp2()
    return x.to(dtype).to(DEVICE)


def _check(x, grid, layout="row", **kw):
    """Kernel vs reference on x (row) or on x^T as a transposed view (col)."""
    view = x if layout == "row" else x.t().contiguous().t()
    if not kernels.supports(view, grid, **kw):
        return False
    assert_bitwise(
        kernels.quantize_view(view, grid, **kw),
        reference(view, grid, **kw),
        f"{grid} {layout} {kw}",
    )
    return True


@pytest.mark.parametrize("rounding", ["rtne", "sr"])
@pytest.mark.parametrize("scale", ["fp32", "e4m3", "e8m0"])
@pytest.mark.parametrize("grid", GRIDS, ids=str)
def test_quantize_triton_matches_reference_bitwise(grid, scale, rounding):
    x = _data(37, 70, seed=len(str(grid)) + 7 * len(scale))
    for layout in ("row", "col"):
        ran = _check(x, grid, layout, scale=scale, rounding=rounding, rht=RHT(16, 5), seed=99)
        assert ran == (not (scale == "e4m3" and grid == "int4_asym"))


@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize(
    "block,block_2d,rht",
    [
        (16, False, None),
        (16, False, 32),
        (32, False, None),
        (32, False, 16),
        (16, True, None),
        (16, True, 16),
        (32, True, None),
        (32, True, 64),
    ],
)
def test_block_options_match(block, block_2d, rht, layout):
    x = _data(41, 50, seed=block + rht if rht else block)
    for rounding, keep_padding in (("rtne", False), ("sr", True)):
        assert _check(
            x,
            "e1m2",
            layout,
            block=block,
            block_2d=block_2d,
            rounding=rounding,
            rht=RHT(rht, 1) if rht else None,
            seed=3,
            keep_padding=keep_padding,
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("out_dtype", [None, torch.float32, torch.bfloat16])
def test_dtypes_match(dtype, out_dtype):
    assert _check(_data(19, 48, seed=1, dtype=dtype), "e2m1", rht=RHT(16, 2), out_dtype=out_dtype)


def _special(rows=12, cols=64):
    """Rows: NaN block, Inf block, all-zero row, subnormals (scale underflow), huge values,
    exact RTNE ties for e1m2/int4 (amax 7 -> s = 1 for int4) and for e2m1 (amax 6). With
    e4m3 scales the NaN and Inf blocks stay NaN in themselves (the tensor amax skips them).
    x[0, 3] and x[8, 32] lead their blocks in one layout each (the 16-tensor kernels zero SR's
    row counter where a block's first element is NaN: quantize16_triton._row_counter_like)."""
    x = _data(rows, cols, seed=11, dtype=torch.float32).cpu()
    x[0, 3] = float("nan")
    x[8, 32] = float("nan")
    x[1, 20] = float("inf")
    x[2] = 0.0
    x[3] = x[3] * 1e-41
    x[4] = x[4] * 1e37
    x[5, :16] = torch.tensor([7.0, 0.5, 1.5, 2.5, 3.5, -4.5, 5.5, 6.5] * 2)
    x[6, :16] = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, -5.0] * 2)
    x[7, 16:32] = -0.0
    return x.to(DEVICE)


@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("scale", ["fp32", "e4m3", "e8m0"])
@pytest.mark.parametrize(
    "grid", [g for g in GRIDS if g not in ("int4", (0.0, 0.5, 1.0, 3.0))], ids=str
)
def test_special_values_match(grid, scale, layout):
    x = _special()
    for kw in (
        dict(rht=None),
        dict(rht=RHT(16, 0)),
        dict(rht=RHT(16, 0), rounding="sr", seed=5),
        dict(block=32, rht=RHT(16, 0), rounding="sr", seed=6),
        dict(block=32, block_2d=True, rounding="sr", seed=8),
    ):
        ran = _check(x, grid, layout, scale=scale, **kw)
        assert ran == (not (scale == "e4m3" and grid == "int4_asym"))


def _e2m1_ties() -> torch.Tensor:
    """fp32 blocks of 16 led by 6.0 (fp32 scale 1: v = |x| exactly), the other 15 cycling
    through every E2M1 level, tie, the fp32 neighbours of both, and subnormals: where
    rounding within v's binade (kernels' minifloat path) could part from the level tables."""
    lv = torch.tensor((0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0))
    mids = (lv[:-1] + lv[1:]) / 2
    lo, hi = torch.tensor(0.0), torch.tensor(6.0)
    pool = torch.cat(
        [
            lv,
            mids,
            torch.nextafter(mids, lo),
            torch.nextafter(mids, hi),
            torch.nextafter(lv[1:], lo),
            torch.nextafter(lv[:-1], hi),
            torch.tensor([1e-45, 1e-40, 1e-30]),
        ]
    )
    pool = torch.cat([pool, -pool])
    n = 15 * 8
    body = pool[torch.arange(n) % len(pool)].reshape(8, 15)
    x = torch.cat([torch.full((8, 1), 6.0), body], 1).repeat(2, 2).contiguous()  # [16, 32]
    return x.to(DEVICE)


@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("rounding", ["rtne", "sr"])
def test_e2m1_binade_rounding_matches_tables_at_ties(rounding, layout):
    x = _e2m1_ties()
    assert _check(x, "e2m1", layout, rounding=rounding, seed=3)  # the 16-tensor kernels
    view = x if layout == "row" else x.t().contiguous().t()
    kw = dict(rounding=rounding, seed=3)
    assert_bitwise(
        kernels.quantize_view(view, "e2m1", tiles=TILES, **kw),  # the generic one
        reference(view, "e2m1", **kw),
        f"generic e2m1 {layout}",
    )


@pytest.mark.parametrize("rht", [None, 16])
def test_generic_kernel_matches_on_16_blocks(rht):
    x = _data(45, 40, seed=4)
    r = RHT(rht, 7) if rht else None
    row = dict(grid="e1m2", rounding="sr", rht=r, seed=1, keep_padding=True)
    col = dict(grid="int4", scale="e8m0", rounding="sr", rht=RHT(16, 3), seed=2, origin=(8, 16))
    got_row = kernels.quantize_view(x, tiles=TILES, **row)  # tiles: the generic kernel
    got_col = kernels.quantize_view(x.t(), tiles=TILES, **col)
    assert_bitwise(got_row, reference(x, **row), "generic row")
    assert_bitwise(got_col, reference(x.t(), **col), "generic col")


PAIRS = {  # (a spec, b spec, a layout, b layout): the GEMMs of the presets and some harder
    "fprop ufp4": (
        dict(grid="e1m2", rht=RHT(16, 0)),
        dict(grid="e1m2", rht=RHT(16, 0)),
        "row",
        "row",
    ),
    "dgrad ufp4": (
        dict(grid="e1m2", rht=RHT(16, 0), rounding="sr", seed=2**40 + 3),
        dict(grid="e1m2", rht=RHT(16, 0)),
        "row",
        "col",
    ),
    "wgrad ufp4": (
        dict(grid="e1m2", rht=RHT(16, 0), rounding="sr", seed=5, origin=(8, 16)),
        dict(grid="e1m2", rht=RHT(16, 0), origin=(0, 32)),
        "col",
        "col",
    ),
    "mixed grids and scales": (
        dict(grid="e2m1", scale="e4m3", rounding="sr", seed=1),
        dict(grid="int4_asym", scale="e8m0", keep_padding=True, out_dtype=torch.float32),
        "col",
        "row",
    ),
    "codebook": (
        dict(grid=(0.0, 0.5, 1.0, 3.0), rht=RHT(16, 9)),
        dict(grid="e1m2", rounding="sr", seed=7),
        "row",
        "col",
    ),
    "mxfp4 wgrad (1x32 columns, one launch)": (
        dict(grid="e2m1", block=32, scale="e8m0", rht=RHT(16, 4), rounding="sr", seed=9),
        dict(grid="e2m1", block=32, scale="e8m0", rht=RHT(16, 4)),
        "col",
        "col",
    ),
    "mxfp4 dgrad (generic 1x32 rows, 16-tensor 1x32 columns)": (
        dict(grid="e2m1", block=32, scale="e8m0", rounding="sr", seed=9),
        dict(grid="e2m1", block=32, scale="e8m0"),
        "row",
        "col",
    ),
    "generic kernel (two launches)": (
        dict(grid="e1m2", block=32),
        dict(grid="e2m1", block_2d=True),
        "row",
        "col",
    ),
    "nvfp4 fprop (two launches, e4m3 tensor scales)": (
        dict(grid="e2m1", scale="e4m3"),
        dict(grid="e2m1", scale="e4m3", block_2d=True),
        "row",
        "row",
    ),
}


@pytest.mark.parametrize("name", list(PAIRS))
def test_pair_matches_two_single_launches(name):
    a_kw, b_kw, a_layout, b_layout = PAIRS[name]
    a, b = _special(38, 64), _data(45, 96, seed=6)
    views = [
        x if lay == "row" else x.t().contiguous().t() for x, lay in ((a, a_layout), (b, b_layout))
    ]
    qa, qb = kernels.quantize_pair(views[0], dict(a_kw), views[1], dict(b_kw))
    assert_bitwise(qa, reference(views[0], **a_kw), f"{name} a")
    assert_bitwise(qb, reference(views[1], **b_kw), f"{name} b")


MX = dict(grid="e2m1", block=32, scale="e8m0")


@pytest.mark.parametrize(
    "case,launched",
    [
        ("column", [("_col16_kernel", 2)]),
        ("column, row segments", [("_col16_kernel", 2)]),
        ("column, segments along the blocks", [("_col16_kernel", 2)]),
        ("column, a segment starting inside a block", [("_qdq_kernel", None)]),
        ("row", [("_qdq_kernel", None)]),
        ("wgrad pair", [("_pair16_kernel", (2, 2))]),
        ("dgrad pair", [("_qdq_kernel", None), ("_col16_kernel", 2)]),
        ("column, generic forced", [("_qdq_kernel", None)]),
    ],
)
def test_1x32_columns_take_the_16_tensor_kernel(monkeypatch, case, launched):
    """MXFP4's 1x32 blocks run the 16-tensor kernel in the column layout (two groups of 16 a
    block), unless a segment starts inside a block; rows take the generic kernel. Values:
    the reference, bit for bit, and the generic kernel's."""
    import ufp4_megatron.kernels.dispatch as dispatch
    from ufp4_megatron.numerics.segments import Segments

    seen = []
    real = dispatch.launch

    def spy(k, *a, **kw):
        name = getattr(k, "__name__", None) or k.fn.__name__
        groups = kw.get("GROUPS")
        if name == "_pair16_kernel":
            groups = (kw["A_GROUPS"], kw["B_GROUPS"])
        seen.append((name, groups))
        return real(k, *a, **kw)

    monkeypatch.setattr(dispatch, "launch", spy)
    x, y = _data(45, 40, seed=21), _data(38, 72, seed=22)
    col, row = x.t().contiguous().t(), y
    sr = dict(MX, rht=RHT(16, 3), rounding="sr", seed=4, origin=(2, 8))
    seg = dict(sr, origin=(0, 0))
    views = {  # (view, its quantize_view arguments, tiles)
        "column": (col, sr, None),
        "column, row segments": (col, dict(seg, segments=Segments(0, (0, 16), (5, 6))), None),
        "column, segments along the blocks": (
            col,
            dict(seg, segments=Segments(1, (0, 32), (5, 6))),
            None,
        ),
        "column, a segment starting inside a block": (
            col,
            dict(seg, segments=Segments(1, (0, 16), (5, 6))),
            None,
        ),
        "row": (row, sr, None),
        "column, generic forced": (col, sr, {"col": TILES["col"]}),
    }
    if case in views:
        view, kw, tiles = views[case]
        got = kernels.quantize_view(view, tiles=tiles, **kw)
        assert seen == launched
        assert_bitwise(got, reference(view, **kw), case)
        if tiles:
            assert_bitwise(got, kernels.quantize_view(view, **kw), "16-tensor vs generic")
    else:
        a = col if case == "wgrad pair" else row
        a_kw, b_kw = dict(sr), dict(MX, rht=sr["rht"])
        if case == "dgrad pair":
            a_kw.pop("rht")
        qa, qb = kernels.quantize_pair(a, dict(a_kw), col, dict(b_kw))
        assert seen == launched
        assert_bitwise(qa, reference(a, **a_kw), f"{case} a")
        assert_bitwise(qb, reference(col, **b_kw), f"{case} b")


SQUARE_TILES = {  # the format, and whether its column layout is the row layout's transpose
    "nvfp4 weight: e2m1 16x16 e4m3": (dict(grid="e2m1", scale="e4m3", block_2d=True), True),
    "e1m2 32x32 fp32": (dict(grid="e1m2", block=32, block_2d=True), True),
    "16x16, SR (keyed by view position)": (
        dict(grid="e2m1", scale="e4m3", block_2d=True, rounding="sr", seed=7),
        False,
    ),
    "16x16, RHT16 (rotates along one layout)": (
        dict(grid="e1m2", block_2d=True, rht=RHT(16, 2)),
        False,
    ),
    "1x16": (dict(grid="e2m1", scale="e4m3"), False),
}


@pytest.mark.parametrize("case", list(SQUARE_TILES))
def test_square_tiles_along_columns_take_the_row_layout(monkeypatch, case):
    """A transposed view in square unrotated RTNE tiles, every tile whole, is quantized in
    the row layout of the tensor under it (the same tiles: faster loads, the same bits):
    per-segment e4m3 amaxes (an expert stack's), a given tensor amax and origins carry over.
    SR, an RHT, 1D blocks or a tile cut by the edge keep the column layout. Values: the
    reference's, bit for bit, in every case."""
    import ufp4_megatron.kernels.dispatch as dispatch
    from ufp4_megatron.numerics.segments import Segments

    kw, flips = SQUARE_TILES[case]
    launched = []
    for name, kernel in (("generic", "_launch"), ("16-tensor", "_launch16")):
        real = getattr(dispatch, kernel)

        def spy(t, lay, along_rows, tile=None, name=name, real=real):
            launched.append((name, along_rows))
            return real(t, lay, along_rows, tile)

        monkeypatch.setattr(dispatch, kernel, spy)
    column = [("generic" if kw.get("block_2d") else "16-tensor", True)]
    x = _data(96, 64, seed=31)  # the view [64, 96]: whole 16x16 and 32x32 tiles
    view = x.t()
    calls = [dict(kw, origin=(32, 64))]
    if kw.get("scale") == "e4m3":  # an expert stack [E*N, K] along N: an amax per expert
        seg = Segments(1, (0, 32, 64), (1, 2, 3))
        fmt = OperandFormat(**{k: v for k, v in kw.items() if k != "seed"})
        calls += [
            dict(kw, segments=seg),
            dict(kw, segments=seg, tensor_amax=kernels.tensor_amax(view, fmt, segments=seg)),
            dict(kw, tensor_amax=kernels.tensor_amax(view, fmt)),
        ]
    for call in calls:
        launched.clear()
        got = kernels.quantize_view(view, **call)
        # the reference takes its own amax: a given one must be that value
        want = reference(view, **{k: v for k, v in call.items() if k != "tensor_amax"})
        assert_bitwise(got, want, f"{case} {sorted(call)}")
        assert launched == ([("generic", False)] if flips else column), sorted(call)
        assert got.shape == view.shape and got.stride() == view.stride()
    launched.clear()  # a tile cut by the edge: the column layout
    cut = _data(90, 64, seed=32).t()
    assert_bitwise(kernels.quantize_view(cut, **kw), reference(cut, **kw), f"{case} cut")
    assert launched == column


def test_pair_takes_each_e4m3_tensor_amax_once(monkeypatch):
    # a pair that falls back to two launches computed each operand's tensor amax twice
    # (nvfp4: 10 amax passes per linear forward+backward instead of 6)
    import ufp4_megatron.kernels.dispatch as dispatch

    calls = []
    real = dispatch._tensor_amax
    monkeypatch.setattr(dispatch, "_tensor_amax", lambda *a: calls.append(a) or real(*a))
    a, b = _data(32, 64, seed=3), _data(48, 64, seed=4)
    a_kw, b_kw = dict(grid="e2m1", scale="e4m3"), dict(grid="e2m1", scale="e4m3", block_2d=True)
    qa, qb = kernels.quantize_pair(a, dict(a_kw), b, dict(b_kw))
    assert len(calls) == 2
    assert_bitwise(qa, reference(a, **a_kw), "a")
    assert_bitwise(qb, reference(b, **b_kw), "b")


AMAX_CASES = {  # (block, block_2d, rht): nvfp4's operands (x, dY; 16x16 weights; wgrad RHT16)
    "1x16": (16, False, None),
    "16x16 tiles": (16, True, None),
    "1x16 rht16": (16, False, 16),
    "1x32 rht32": (32, False, 32),
    "32x32 tiles": (32, True, None),
    "1x16 rht64": (16, False, 64),
}


@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("case", list(AMAX_CASES))
def test_tensor_amax_kernel_is_the_reference_bit_for_bit(case, layout):
    from ufp4_megatron.numerics.quantize import e4m3_tensor_amax

    block, block_2d, rht = AMAX_CASES[case]
    rht = RHT(rht, 5) if rht else None
    specials = _special(12, 64)  # NaN and Inf blocks (left out), zeros, subnormals, huge
    shapes = {
        "special": specials.to(DEVICE),
        "ragged 37x70": _data(37, 70, seed=8),
        "one row": _data(1, 40, seed=9, dtype=torch.float16),
        "all NaN": torch.full((16, 32), float("nan"), device=DEVICE),
        "huge, fp32": _data(20, 48, seed=10, dtype=torch.float32) * 1e30,
        "column slice": _data(20, 128, seed=12)[:, ::2],
        "expanded rows": _data(1, 64, seed=13).expand(18, 64),
    }
    for name, x in shapes.items():
        view = x if layout == "row" else x.t().contiguous().t()
        fmt = OperandFormat("e2m1", block=block, block_2d=block_2d, scale="e4m3", rht=rht)
        got = kernels.tensor_amax(view, fmt)
        want = e4m3_tensor_amax(view, block=block, block_2d=block_2d, rht=rht)
        assert got.dtype == torch.float32 and got.shape == ()
        assert got.cpu().view(torch.int32).item() == want.cpu().float().view(torch.int32).item(), (
            f"{case} {layout} {name}: {got.item()} != {want.item()}"
        )


@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("block_2d", [False, True])
def test_e4m3_nan_stays_in_its_block(layout, block_2d):
    x = _data(32, 64, seed=12, dtype=torch.float32)
    x[0, 3] = float("nan")
    x[20, 40] = float("inf")
    for kw in (dict(rht=RHT(16, 2) if not block_2d else None), dict(rounding="sr", seed=4)):
        view = x if layout == "row" else x.t().contiguous().t()
        got = kernels.quantize_view(view, "e2m1", scale="e4m3", block_2d=block_2d, **kw)
        assert_bitwise(
            got, reference(view, "e2m1", scale="e4m3", block_2d=block_2d, **kw), f"{layout} {kw}"
        )
        nan = torch.isnan(got.cpu())  # only the two blocks (tiles) holding NaN / Inf
        assert int(nan.sum()) == 2 * (256 if block_2d else 16) and nan[0, 0] and nan[20, 40]


def test_fp16_rht_is_float32_and_finite():
    x = _data(16, 64, seed=13, dtype=torch.float32).cpu() * 100
    x[0, :16] = 16400.0 * RHT(16, 0).signs  # rotates to 65600 > fp16's max
    x = x.half().to(DEVICE)
    for view in (x, x.t().contiguous().t()):
        got = kernels.quantize_view(view, "e1m2", rht=RHT(16, 0))
        assert got.dtype == torch.float32 and torch.isfinite(got).all()
        assert_bitwise(got, reference(view, "e1m2", rht=RHT(16, 0)), "fp16 rht")
        assert_bitwise(got, reference(view.float(), "e1m2", rht=RHT(16, 0)), "fp32 ref")
    qa, qb = kernels.quantize_pair(
        x, dict(grid="e1m2", rht=RHT(16, 0)), x.t(), dict(grid="e1m2", rht=RHT(16, 0))
    )
    assert qa.dtype == qb.dtype == torch.float32 and torch.isfinite(qa).all()


@pytest.mark.parametrize("layout", ["row", "col"])
def test_rht_near_fp32_max_is_finite(layout):
    """Blocks of finite fp32 values up to fp32's max / sqrt(n): the rotation runs on x / n in
    both kernels and the reference (numerics/hadamard.py), so no sum overflows; the kernels
    agree with the reference bit for bit and nothing is NaN (RHT16 of values near 8e37 gave a
    NaN block). The 16-tensor kernel (1x16, RHT16) and the generic one (RHT32/64) both."""
    g = torch.Generator().manual_seed(21)
    big = torch.finfo(torch.float32).max / 64**0.5 * 0.99  # within range for every size
    x = (torch.rand(6, 64, generator=g) * 2 - 1) * big
    for size in (16, 32, 64):
        x[size // 16, :size] = RHT(size, 7).signs * big  # every sum of the block adds up
    x = x.to(DEVICE)
    for size, block, grid, scale, rounding in (
        (16, 16, "e1m2", "fp32", "rtne"),
        (32, 32, "e2m1", "e4m3", "sr"),
        (64, 16, "e1m2", "fp32", "sr"),
    ):
        kw = dict(block=block, scale=scale, rounding=rounding, rht=RHT(size, 7), seed=4)
        assert _check(x, grid, layout, **kw), (size, block, grid)
        q = kernels.quantize_view(x if layout == "row" else x.t().contiguous().t(), grid, **kw)
        assert torch.isfinite(q).all(), (size, block, grid, scale)


def test_non_contiguous_inputs_match():
    base = _data(20, 64, seed=14)
    views = {
        "column slice": base[:, ::2],
        "row slice": base[::3],
        "offset": base[1:, 16:],
        "transposed slice": base.t()[:48],
        "expanded rows": base[:1].expand(8, 64),
        "expanded cols": base[:, :1].expand(20, 32),
        "expanded, stride (1, 0)": base[:, 0].clone()[:, None].expand(20, 32),
        "permuted 3d": base.reshape(4, 5, 64).permute(1, 0, 2),
    }
    kws = (dict(rht=16, rounding="sr", seed=3), dict(dim=0, block=32, block_2d=True))
    for i, (name, x) in enumerate(views.items()):  # the 16-tensor and generic kernels in turn
        kw = kws[i % 2]
        assert_bitwise(
            quantize(x, "e1m2", backend="triton", **kw),
            quantize(x, "e1m2", backend="torch", **kw),
            f"{name} {kw}",
        )


def test_triton_backend_refuses_what_it_lacks():
    x = _data(4, 32, seed=0)
    with pytest.raises(
        ValueError, match="Triton kernels do not implement e4m3 scales on the two's-complement grid"
    ):
        quantize(x, "int4_asym", scale="e4m3", backend="triton")
    with pytest.raises(ValueError, match="do not implement dtype torch.float64"):
        quantize(x.double(), "e1m2", backend="triton")
    with pytest.raises(ValueError, match="do not implement block=64"):
        quantize(x.reshape(2, 64), "e1m2", block=64, backend="triton")
    assert quantize(x[:0], "e1m2", backend="triton").shape == (0, 32)  # nothing to launch
    # backend="auto" takes the reference for what the kernels lack, so the two agree
    assert_bitwise(
        quantize(x, "int4_asym", scale="e4m3"),
        quantize(x, "int4_asym", scale="e4m3", backend="torch"),
        "auto",
    )


@pytest.mark.parametrize("layout", ["row", "col"])
def test_sr_shard_reproduces_full_tensor_bits(layout):
    x = _data(40, 64, seed=9)
    view = x if layout == "row" else x.t().contiguous().t()
    kw = dict(rounding="sr", rht=RHT(16, 1), seed=2**40 + 17)
    full = kernels.quantize_view(view, "e1m2", **kw)
    shard = kernels.quantize_view(view[8:24, 32:], "e1m2", origin=(8, 32), **kw)
    assert_bitwise(shard, full[8:24, 32:], "shard")
    other_seed = kernels.quantize_view(view, "e1m2", **dict(kw, seed=1))
    assert not torch.equal(other_seed, full)  # the seed reaches the random bits


def test_supports_refuses_what_is_not_built():
    x = _data(4, 32, seed=0)
    assert kernels.supports(x, "e1m2", rht=RHT(16, 0), rounding="sr", seed=1)
    assert not kernels.supports(x, "e1m2", block=64)
    assert not kernels.supports(x.double(), "e1m2")
    assert not kernels.supports(x, "int4_asym", scale="e4m3")
    assert not kernels.supports(x, "e1m2", rounding="sr", origin=(0, 2))
    assert not kernels.supports(x[:0], "e1m2")


def test_quantize_dispatch_backends_agree():
    x = _data(15, 64, seed=2).reshape(3, 5, 64)
    for dim in (-1, 0):
        kw = dict(rht=16, rounding="sr", seed=4, dim=dim) if dim == -1 else dict(dim=dim)
        assert_bitwise(
            quantize(x, "e1m2", backend="triton", **kw),
            quantize(x, "e1m2", backend="torch", **kw),
            f"dim {dim}",
        )


@pytest.mark.parametrize(
    "name,dtype",
    [
        ("ufp4", torch.bfloat16),
        ("nvfp4", torch.bfloat16),
        ("mxfp4", torch.bfloat16),
        ("e2m1", torch.bfloat16),
        ("ufp4", torch.float16),
    ],
)
def test_quantized_linear_triton_matches_torch(name, dtype):
    recipe = get_recipe(name)
    x = _data(24, 64, seed=3, dtype=dtype)
    w = _data(48, 64, seed=4, dtype=dtype)
    dy = _data(24, 48, seed=5, dtype=dtype)
    outs = []
    for backend in ("torch", "triton"):
        xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = quantized_linear(xi, wi, None, recipe, seed=123, backend=backend)
        y.backward(dy)
        outs.append((y, xi.grad, wi.grad))
    for what, a, b in zip(("y", "dx", "dw"), *outs):
        assert_bitwise(b, a, f"{name} {what}")

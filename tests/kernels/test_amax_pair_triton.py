"""kernels.tensor_amax_pair against the reference, bit for bit: one read of a tensor gives the
e4m3 tensor amax of both its layouts (NVFP4's x for fprop and wgrad, dY for dgrad and wgrad,
w for fprop and dgrad), each equal to numerics.quantize.e4m3_tensor_amax of that layout's view. Runs on a GPU when
there is one, else in Triton's CPU interpreter (conftest.py)."""

import pytest
import torch

from ufp4_megatron import kernels
from ufp4_megatron.numerics.hadamard import RHT
from ufp4_megatron.numerics.quantize import OperandFormat, e4m3_tensor_amax

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _fmt(block=16, rht=None, **kw):
    return OperandFormat("e2m1", block=block, scale="e4m3", rht=rht and RHT(rht, 5), **kw)


def _data(rows, cols, seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * torch.rand(rows, 1, generator=g).mul(4).exp2()
    return x.to(dtype).to(DEVICE)


def _special():
    """NaN and Inf blocks (left out, in one layout's block each), a zero row, subnormals,
    huge values."""
    x = _data(40, 96, seed=11, dtype=torch.float32).cpu()
    x[0, 3] = float("nan")
    x[17, 40] = float("inf")
    x[2] = 0.0
    x[3] = x[3] * 1e-41
    x[33] = x[33] * 1e37
    return x.to(DEVICE)


def _nan_beside_the_max():
    """Three tiles of the 16-tensor pass across: the largest value sits in a tile whose other
    row block holds a NaN, the next in a tile with an Inf, the rest finite."""
    x = _data(70, 300, seed=12, dtype=torch.float32).cpu()
    x[40, 250], x[41, 140] = float("nan"), 1e6  # rows 32-63, columns 128-255: one tile
    x[5, 20], x[6, 40] = float("-inf"), -5e5
    return x.to(torch.bfloat16).to(DEVICE)


FORMATS = {  # (row layout, column layout): nvfp4's x and dY first
    "nvfp4": (_fmt(), _fmt(rht=16)),
    "1x16 / 1x16, no RHT": (_fmt(), _fmt()),
    "1x32 / 1x16 rht16": (_fmt(32), _fmt(rht=16)),
    "rht on rows": (_fmt(rht=16), _fmt()),
    "1x32 rht32 / 1x16": (_fmt(32, 32), _fmt()),
    "1x16 / 1x32 rht64": (_fmt(), _fmt(32, 64)),
}
TENSORS = {
    "special": _special,
    "ragged 37x70": lambda: _data(37, 70, seed=8),
    "one row": lambda: _data(1, 40, seed=9, dtype=torch.float16),
    "one column block": lambda: _data(70, 16, seed=10),
    "all NaN": lambda: torch.full((16, 32), float("nan"), device=DEVICE),
    "huge, fp32": lambda: _data(20, 48, seed=10, dtype=torch.float32) * 1e30,
    "expanded rows": lambda: _data(1, 64, seed=13).expand(18, 64),
    "row slice": lambda: _data(80, 64, seed=14)[7:61],
    "NaN beside the max": _nan_beside_the_max,
}


def _bits(t: torch.Tensor) -> int:
    return t.cpu().float().reshape(()).view(torch.int32).item()


@pytest.mark.parametrize("formats", [*FORMATS, "nvfp4 w: 16x16 tiles"])
def test_pair_is_each_layouts_reference_amax_bit_for_bit(formats):
    row, col = FORMATS.get(formats) or (_fmt(block_2d=True), _fmt(block_2d=True))
    for name, make in TENSORS.items():
        x = make()
        got = kernels.tensor_amax_pair(x, row, col)
        assert got is not None and got.dtype == torch.float32 and got.shape == (2,), name
        for i, (fmt, view) in enumerate(((row, x), (col, x.t()))):
            want = e4m3_tensor_amax(view, block=fmt.block, block_2d=fmt.block_2d, rht=fmt.rht)
            assert _bits(got[i]) == _bits(want), f"{formats} {name} layout {i}: {got} vs {want}"


@pytest.mark.parametrize(
    "formats, kernel",
    [
        ("nvfp4", "_tensor_amax_pair16_kernel"),
        ("1x32 / 1x16 rht16", "_tensor_amax_pair16_kernel"),
        ("rht on rows", "_tensor_amax_pair_kernel"),
        ("1x16 / 1x32 rht64", "_tensor_amax_pair_kernel"),
    ],
)
def test_pair_takes_the_16_tensor_pass_where_it_applies(monkeypatch, formats, kernel):
    """An unrotated row layout with a 1x16 column layout (NVFP4's x and dY) is read by the
    16-tensor pass, anything else by the generic pair kernel: the tests above cover both."""
    import ufp4_megatron.kernels.dispatch as dispatch

    launched = []
    real = dispatch.launch
    monkeypatch.setattr(
        dispatch, "launch", lambda k, *a, **kw: launched.append(k) or real(k, *a, **kw)
    )
    x = _data(37, 70, seed=8)
    auto = kernels.tensor_amax_pair(x, *FORMATS[formats])
    generic = kernels.tensor_amax_pair(x, *FORMATS[formats], generic=True)  # the bench's A/B
    names = [getattr(k, "__name__", None) or k.fn.__name__ for k in launched]
    assert names == [kernel, "_tensor_amax_pair_kernel"]
    assert torch.equal(auto, generic)


def test_pair_declines_what_it_does_not_cover():
    x = _data(32, 64, seed=3)
    fp32_scaled = OperandFormat("e1m2", block=16, scale="fp32")
    tiles_2d, tiles_2d_32 = _fmt(block_2d=True), _fmt(32, block_2d=True)
    pairs = [(fp32_scaled, _fmt()), (_fmt(), fp32_scaled), (_fmt(), tiles_2d)]
    pairs += [(tiles_2d, _fmt()), (tiles_2d, tiles_2d_32)]  # not the same blocks
    for row, col in pairs:
        assert kernels.tensor_amax_pair(x, row, col) is None
    assert kernels.tensor_amax_pair(x[:, ::2], _fmt(), _fmt()) is None  # strided columns
    assert kernels.tensor_amax_pair(x[0], _fmt(), _fmt()) is None  # not 2-D
    asym = OperandFormat("int4_asym", block=16, scale="e4m3")  # the kernels refuse it
    assert kernels.tensor_amax_pair(x, asym, _fmt()) is None


def test_single_tensor_amax_is_the_pairs_and_refuses_in_one_line():
    x = _data(32, 64, seed=4)
    row, col = _fmt(), _fmt(rht=16)
    singles = torch.stack([kernels.tensor_amax(x, row), kernels.tensor_amax(x.t(), col)])
    assert torch.equal(singles, kernels.tensor_amax_pair(x, row, col))
    with pytest.raises(ValueError, match=r"do not implement block=7 \(kernels cover blocks"):
        kernels.tensor_amax(x, OperandFormat("e2m1", block=7, scale="e4m3"))
    with pytest.raises(ValueError, match=r"do not implement a 1-D view \(kernels take 2D"):
        kernels.tensor_amax(x[0], row)
    with pytest.raises(ValueError, match=r"do not implement an empty tensor"):
        kernels.tensor_amax(x[:0], row)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_nvfp4_linear_reads_x_dy_and_w_once_for_their_two_amaxes(monkeypatch, dtype):
    """quantized_linear with NVFP4 on the kernels: x's amax for fprop and wgrad, and dY's for
    dgrad and wgrad, and w's for fprop and dgrad, each from one pair call (w's is one amax
    pass: its 16x16 tiles are the same in both layouts); outputs and gradients bit for bit
    those of one amax pass per quantization."""
    import ufp4_megatron.kernels.dispatch as dispatch
    from ufp4_megatron import get_recipe, quantized_linear
    from ufp4_megatron.quant import ops

    recipe = get_recipe("nvfp4")
    x, w = _data(40, 64, seed=3, dtype=dtype), _data(48, 64, seed=4, dtype=dtype)
    dy = _data(40, 48, seed=5, dtype=dtype)

    def run():
        xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = quantized_linear(xi, wi, None, recipe, seed=123, backend="triton")
        y.backward(dy)
        return y, xi.grad, wi.grad

    singles, pairs = [], []
    real_single, real_pair = dispatch._tensor_amax, kernels.tensor_amax_pair
    monkeypatch.setattr(dispatch, "_tensor_amax", lambda *a: singles.append(a) or real_single(*a))
    monkeypatch.setattr(kernels, "tensor_amax_pair", lambda *a: pairs.append(a) or real_pair(*a))
    shared = run()
    assert (len(singles), len(pairs)) == (1, 3)  # x, w (its single pass), dY

    monkeypatch.setattr(ops, "tensor_amaxes", lambda *a, **k: (None, None))
    singles.clear()
    own = run()
    assert len(singles) == 6
    for what, a, b in zip(("y", "dx", "dw"), shared, own):
        assert torch.equal(a, b), what


def test_amax_bench_rows_compare_the_passes():
    """python -m ufp4_megatron.bench --suite amax (bench/amax.py), its code path here with a
    stand-in timer: every pass runs, the pair equals the two single passes bit for bit."""
    from ufp4_megatron.bench.amax import amax_rows

    ran = []

    def timer(fn, inputs):
        fn(inputs[0])
        ran.append(fn)
        return 2.0 if len(ran) == 1 else 1.0  # the copy, then each pass

    rows = amax_rows(log=lambda r: None, shapes=((48, 64),), device=DEVICE, timer=timer)
    assert len(ran) == 9
    assert [r["what"] for r in rows] == [
        "row pass (fprop x, dgrad dY)",
        "column pass, RHT16 (wgrad)",
        "both (x, dY), one pair pass",
        "both (x, dY), generic pair kernel",
        "column pass, RHT16 (wgrad), generic kernel",
        "both (x, dY), two passes",
        "w row pass, 16x16 (fprop)",
        "w column pass, 16x16 (dgrad)",
        "both (w), one pair pass",
        "both (w), two passes",
    ]
    assert [r["vs_two"] for r in rows] == [0.5, 0.5, 0.5, 0.5, 0.5, 1.0, 0.5, 0.5, 0.5, 1.0]
    # the copy moves 4 bytes an element in 2 ms, a pass reads 2 in 1 ms: the same bandwidth
    assert rows[0]["pct"] == rows[-1]["pct"] == 100.0


@pytest.mark.parametrize(
    "fmt, kernel",
    [
        (_fmt(rht=16), "_tensor_amax16_kernel"),  # wgrad's x and dY alone (grouped experts)
        (_fmt(), "_tensor_amax16_kernel"),
        (_fmt(32), "_tensor_amax_kernel"),
        (_fmt(rht=32), "_tensor_amax_kernel"),
        (_fmt(block_2d=True), "_tensor_amax_kernel"),
    ],
)
def test_single_column_amax_takes_the_16_tensor_pass_where_it_applies(monkeypatch, fmt, kernel):
    """A column layout of 1x16 blocks, RHT16 or none, is read by the 16-tensor amax kernel:
    on every tensor above, the reference's value bit for bit and the generic kernel's."""
    import ufp4_megatron.kernels.dispatch as dispatch

    launched = []
    real = dispatch.launch
    monkeypatch.setattr(
        dispatch, "launch", lambda k, *a, **kw: launched.append(k) or real(k, *a, **kw)
    )
    for name, make in TENSORS.items():
        view = make().t()
        launched.clear()
        got = kernels.tensor_amax(view, fmt)
        generic = kernels.tensor_amax(view, fmt, generic=True)
        names = [getattr(k, "__name__", None) or k.fn.__name__ for k in launched]
        assert names == [kernel, "_tensor_amax_kernel"], name
        want = e4m3_tensor_amax(view, block=fmt.block, block_2d=fmt.block_2d, rht=fmt.rht)
        assert _bits(got) == _bits(want) == _bits(generic), f"{name}: {got} vs {want}"

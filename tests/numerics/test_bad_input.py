"""Bad input to the library: a one-line error that says what to change, or a documented
behaviour (docs/reliability.md, "Library", lists each case).

| case                                              | contract                                   | test |
| nvfp4 (e4m3) tensor amax with one NaN / Inf        | NaN stays in its block (and 2D tile)       | e4m3_nan_and_inf_stay_in_their_block, nvfp4_linear_nan_stays_in_its_rows |
| fp16 with RHT, |x| >= 16400                         | finite, fp32, = fp32 reference cast once   | fp16_rht_* (3 tests) |
| quantize(x, dim=2) on 2-D                          | IndexError naming the valid range          | out_of_range_dim_is_refused |
| quantized_linear with integer (or float8) tensors | TypeError                                  | linear_refuses_non_floating_tensors |
| codebook with inf / nan                            | ValueError                                 | codebook_refuses_non_finite_levels |
| seed=1.5, RHT.rotate of 0-dim / bad dim            | ValueError / IndexError                    | seeds_must_be_ints_in_range, rht_rotate_refuses_* |
| rht_seed="a", block_2d="yes", rht=16.0, sr=5       | ValueError                                 | option_types_are_checked |
| backend="triton" on CPU                            | ValueError (CUDA or TRITON_INTERPRET=1)    | triton_backend_on_cpu_says_what_to_do |
| bias of the wrong shape                            | ValueError in forward                      | linear_checks_bias_shape_in_forward |
| siblings: origin, grid types, weight dims, empty   | ValueError / documented dtype              | origin_is_checked, grid_values_are_checked, linear_checks_shapes, empty_* |
"""

import os
import subprocess
import sys

import pytest
import torch

from ufp4_megatron import (
    RHT,
    GemmSpec,
    OperandSpec,
    Recipe,
    get_grid,
    get_recipe,
    quantize,
    quantized_linear,
)
from ufp4_megatron.quant.ops import dgrad, fprop, wgrad

# ----------------------------------------------------------------- NaN in e4m3 (NVFP4)


@pytest.mark.parametrize("block_2d", [False, True])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_e4m3_nan_and_inf_stay_in_their_block(bad, block_2d):
    x = torch.randn(32, 64)
    x[0, 3] = bad  # block (row 0, cols 0..15); with 2D tiles rows 0..15 x cols 0..15
    clean = x.clone()
    tile = (slice(0, 16) if block_2d else slice(0, 1), slice(0, 16))
    clean[tile] = 0.0  # a zero block adds nothing to the tensor amax
    for rht in (None, 16):
        q = quantize(x, "e2m1", scale="e4m3", block_2d=block_2d, rht=rht)
        want = quantize(clean, "e2m1", scale="e4m3", block_2d=block_2d, rht=rht)
        assert torch.isnan(q[tile]).all()
        outside = torch.ones_like(q, dtype=torch.bool)
        outside[tile] = False
        assert torch.equal(q[outside], want[outside]) and torch.isfinite(q[outside]).all()


def test_e4m3_all_blocks_non_finite_gives_nan_not_an_error():
    x = torch.full((2, 32), float("nan"))
    assert torch.isnan(quantize(x, "e2m1", scale="e4m3")).all()


def test_nvfp4_linear_nan_stays_in_its_rows():
    x = torch.randn(8, 64)
    x[2, 5] = float("nan")
    w = torch.randn(16, 64)
    y = quantized_linear(x, w, None, get_recipe("nvfp4"), seed=1)
    assert torch.isnan(y[2]).all() and torch.isfinite(y[torch.arange(8) != 2]).all()


# ----------------------------------------------------------------- fp16 with an RHT


def _fp16(rows, cols, seed, scale=1.0, big_row=None, big_col=None):
    """Random fp16 with one block of +-16400 (along a row or down a column) matched to the
    signs of RHT(16, 0), the recipes' default: it rotates to 65600 > 65504, fp16's largest
    finite value."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * scale
    big = 16400.0 * RHT(16, 0).signs
    if big_row is not None:
        x[big_row, :16] = big
    if big_col is not None:
        x[:16, big_col] = big
    return x.half()


def test_fp16_rht_quantize_is_float32_and_equals_the_fp32_reference():
    x = _fp16(4, 64, 0, scale=100, big_row=0)
    q = quantize(x, "e1m2", rht=16)
    assert q.dtype == torch.float32 and torch.isfinite(q).all() and q.abs().max() > 65504
    assert torch.equal(q, quantize(x.float(), "e1m2", rht=16))
    assert torch.equal(quantize(x, "e1m2"), quantize(x.float(), "e1m2").half())  # no RHT: fp16
    r = RHT(16, 0)
    assert r.rotate(x).dtype == torch.float32 and torch.equal(r.rotate(x), r.rotate(x.float()))
    assert torch.equal(quantize(x, "e1m2", rht=r), quantize(r.rotate(x), "e1m2"))


def test_fp16_rht_gemms_are_finite_and_equal_the_fp32_reference_cast_once():
    r = get_recipe("ufp4")
    small_w = _fp16(48, 64, 1, scale=0.01)
    cases = {  # each GEMM with the 16400-block in the operand it quantizes along that block
        "fprop": (fprop, _fp16(32, 64, 2, scale=100, big_row=0), small_w),
        "dgrad": (dgrad, _fp16(32, 48, 3, scale=100, big_row=0), small_w),
        "wgrad": (wgrad, _fp16(32, 48, 4, scale=100, big_col=0), _fp16(32, 64, 5, scale=0.01)),
    }
    for name, (gemm, a, b) in cases.items():
        got = gemm(a, b, r, seed=3)
        assert got.dtype == torch.float16 and torch.isfinite(got).all(), name
        assert torch.equal(got, gemm(a.float(), b.float(), r, seed=3).half()), name


def test_fp16_rht_unquantized_rotated_operand_stays_finite():
    """A GEMM with one operand in high precision still rotates it (so the RHT cancels)."""
    r = get_recipe("ufp4", fprop=GemmSpec(x=OperandSpec(grid="e1m2"), w=None, rht=16))
    x = _fp16(16, 64, 6, scale=0.01)
    w = _fp16(32, 64, 7, scale=100, big_row=0)
    y = fprop(x, w, r)
    assert torch.isfinite(y).all() and torch.equal(y, fprop(x.float(), w.float(), r).half())


# ----------------------------------------------------------------- shapes, dims, dtypes


def test_out_of_range_dim_is_refused():
    x = torch.randn(4, 16)
    with pytest.raises(
        IndexError,
        match=r"dim 2 is out of range for a 2-D tensor: pass a dim "
        r"in \[-2, 1\]",
    ):
        quantize(x, "e1m2", dim=2)
    with pytest.raises(IndexError, match="out of range"):
        quantize(x, "e1m2", dim=-3)
    with pytest.raises(ValueError, match="dim must be an int"):
        quantize(x, "e1m2", dim=True)
    with pytest.raises(ValueError, match="no dimensions"):
        quantize(torch.tensor(1.0), "e1m2")
    assert torch.equal(quantize(x, "e1m2", dim=-2), quantize(x, "e1m2", dim=0))


def test_linear_refuses_non_floating_tensors():
    x, w, b = torch.randn(2, 16), torch.randn(4, 16), torch.randn(4)
    r = get_recipe("ufp4")
    with pytest.raises(
        TypeError, match="float32/bfloat16/float16/float64 tensors; x is torch.int32"
    ):
        quantized_linear(x.int(), w, None, r)
    with pytest.raises(TypeError, match="weight is torch.int64"):
        quantized_linear(x, w.long(), None, r)
    with pytest.raises(TypeError, match="bias is torch.int32"):
        quantized_linear(x, w, b.int(), r)
    with pytest.raises(TypeError, match="weight is list"):
        quantized_linear(x, [[1.0] * 16] * 4, None, r)
    with pytest.raises(TypeError, match="quantize takes float32/bfloat16/float16/float64"):
        quantize(torch.ones(4, 16, dtype=torch.int32), "e2m1")
    for fp8 in (torch.float8_e4m3fn, torch.float8_e5m2):  # would round the QDQ values again
        with pytest.raises(TypeError, match=f"x is {fp8}"):
            quantize(torch.randn(4, 16).to(fp8), "e2m1")
        with pytest.raises(TypeError, match=f"weight is {fp8}"):
            quantized_linear(x, w.to(fp8), None, r)


@pytest.mark.parametrize("shape", [(3,), (1,), (1, 4), ()])
def test_linear_checks_bias_shape_in_forward(shape):
    x, w = torch.randn(2, 16, requires_grad=True), torch.randn(4, 16, requires_grad=True)
    with pytest.raises(ValueError, match=r"bias must have shape \(4,\) \(out_features\)"):
        quantized_linear(x, w, torch.randn(shape), get_recipe("ufp4"), seed=0)


def test_linear_checks_shapes_seed_and_backend():
    r = get_recipe("ufp4")
    with pytest.raises(ValueError, match="weight \\[out_features, in_features\\]"):
        quantized_linear(torch.randn(2, 16), torch.randn(16), None, r)
    with pytest.raises(ValueError, match="x \\[..., in_features\\]"):
        quantized_linear(torch.tensor(1.0), torch.randn(4, 16), None, r)
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\^63\), got 1.5"):
        quantized_linear(torch.randn(2, 16), torch.randn(4, 16), None, r, seed=1.5)
    with pytest.raises(ValueError, match="unknown backend 'cuda'"):
        quantized_linear(torch.randn(2, 16), torch.randn(4, 16), None, r, backend="cuda")


def test_empty_tensors_keep_the_documented_dtype():
    assert quantize(torch.empty(0, 16, dtype=torch.float16), "e1m2", rht=16).dtype == torch.float32
    assert quantize(torch.empty(0, 16, dtype=torch.float16), "e1m2").dtype == torch.float16
    assert quantize(torch.empty(0), "e1m2").shape == (0,)
    x = torch.randn(32)  # 1-D: one row
    assert torch.equal(quantize(x, "e1m2"), quantize(x[None], "e1m2")[0])


# ----------------------------------------------------------------- values of options


def test_codebook_refuses_non_finite_levels():
    for levels in ((0, 1, float("inf")), (0, float("nan"), 2)):
        with pytest.raises(ValueError, match="codebook levels must be finite numbers"):
            quantize(torch.randn(2, 16), levels)
        with pytest.raises(ValueError, match="finite"):
            OperandSpec(grid=levels)


def test_grid_values_are_checked():
    with pytest.raises(ValueError, match="grid must be a grid name .* or a codebook tuple"):
        get_grid(5)
    with pytest.raises(ValueError, match="codebook levels must be numbers"):
        get_grid(("a", "b"))
    with pytest.raises(ValueError, match="codebook levels must be numbers"):
        get_grid((0, True))
    # a list (as YAML gives) becomes a tuple: the recipe stays a hashable value
    r = get_recipe("e2m1", grid=[0, 0.5, 1, 2])
    assert r.fprop.x.grid == (0.0, 0.5, 1.0, 2.0) and hash(r)
    quantized_linear(torch.randn(2, 16), torch.randn(4, 16), None, r, seed=0)


def test_seeds_must_be_ints_in_range():
    x = torch.randn(2, 16)
    for seed in (1.5, -1, 2**63, True, "1"):
        with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\^63\)"):
            quantize(x, "e1m2", rounding="sr", seed=seed)
        with pytest.raises(ValueError, match=r"RHT seed must be an int in \[0, 2\^63\)"):
            RHT(16, seed)
    assert torch.equal(
        quantize(x, "e1m2", rounding="sr", seed=2**63 - 1),
        quantize(x, "e1m2", rounding="sr", seed=2**63 - 1),
    )
    with pytest.raises(ValueError, match="RHT size must be one of"):
        RHT(16.0)


def test_rht_rotate_refuses_zero_dim_bad_dim_and_integers():
    r = RHT(16, 0)
    with pytest.raises(ValueError, match="no dimensions"):
        r.rotate(torch.tensor(1.0))
    with pytest.raises(IndexError, match="dim 2 is out of range for a 2-D tensor"):
        r.rotate(torch.randn(4, 16), dim=2)
    with pytest.raises(IndexError, match="out of range"):
        r.inverse(torch.randn(4, 16), dim=-3)
    with pytest.raises(TypeError, match="RHT.rotate/inverse takes float32/.* x is torch.int64"):
        r.rotate(torch.ones(4, 16, dtype=torch.int64))
    assert r.rotate(torch.randn(16)).shape == (16,)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: get_recipe("ufp4", rht_seed="a"), r"rht_seed must be an int in \[0, 2\^63\)"),
        (lambda: get_recipe("ufp4", rht_seed=True), "rht_seed must be an int"),
        (lambda: get_recipe("ufp4", rht_seed=-1), "rht_seed must be an int"),
        (lambda: Recipe(name="r", rht_seed=1.0), "rht_seed must be an int"),
        (lambda: OperandSpec(block_2d="yes"), "block_2d must be True or False, got 'yes'"),
        (lambda: OperandSpec(block_2d=1), "block_2d must be True or False"),
        (lambda: get_recipe("nvfp4", block_2d="yes"), "block_2d must be True or False"),
        (lambda: quantize(torch.randn(16, 16), "e1m2", block_2d="yes"), "block_2d must be True"),
        (lambda: OperandSpec(block=True), "block must be a positive integer"),
        (lambda: GemmSpec(x=None, w=None, rht=16.0), "rht size must be one of"),
        (lambda: GemmSpec(x=None, w=None, rht=True), "rht size must be one of"),
        (lambda: GemmSpec(x="e1m2", w=None), "GemmSpec.x must be an OperandSpec or None"),
        (
            lambda: Recipe(name="r", dgrad=GemmSpec(x=OperandSpec(), w=OperandSpec())),
            "Recipe.dgrad has no operand 'x' \\(its operands are dy, w\\)",
        ),
        (lambda: Recipe(name="r", fprop="ufp4"), "Recipe.fprop must be a GemmSpec or None"),
        (lambda: Recipe(name=3), "recipe name must be a string"),
        (lambda: get_recipe("ufp4", rht=16.0), "override rht=16.0: expected True, False, a size"),
        (lambda: get_recipe("ufp4", sr=5), "override sr=5: expected True, False or a tuple"),
    ],
)
def test_option_types_are_checked(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_origin_is_checked():
    x = torch.randn(4, 32)
    with pytest.raises(ValueError, match="origin column must be a multiple of 4"):
        quantize(x, "e1m2", rounding="sr", origin=(0, 2))
    with pytest.raises(ValueError, match="origin row must be an int >= 0, got -1"):
        quantize(x, "e1m2", origin=(-1, 0))
    with pytest.raises(ValueError, match=r"origin must be a \(row, column\) pair"):
        quantize(x, "e1m2", origin=4)
    assert torch.equal(quantize(x, "e1m2", origin=(0, 2)), quantize(x, "e1m2"))  # RTNE: unused


# ----------------------------------------------------------------- backend="triton"


def test_triton_backend_on_cpu_says_what_to_do():
    """Without TRITON_INTERPRET the kernels cannot run on a CPU tensor (a fresh process: the
    kernel tests turn the interpreter on in this one)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import torch\nfrom ufp4_megatron import quantize\n"
        "quantize(torch.randn(4, 16), 'e1m2', backend='triton')"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode != 0
    assert (
        "ValueError: backend='triton' needs a CUDA tensor (or TRITON_INTERPRET=1 for the "
        "CPU interpreter), got a tensor on cpu"
    ) in p.stderr, p.stderr[-2000:]
    assert "active drivers" not in p.stderr

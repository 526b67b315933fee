"""quantize(): block scaling, modes, shapes and bad input.

Contracts:
- each 1xB block's amax maps onto g_max exactly (fp32 scale): the block max is preserved;
- 2D tiles share one scale over BxB; e8m0 scales are powers of two; e4m3 block scales are
  E4M3 values times one fp32 tensor scale;
- any dim, any leading shape, same dtype out; sizes not a multiple of the block equal the
  result of explicit zero padding;
- NaN/Inf poison only their own block (to NaN); zero blocks give exact zeros; empty
  tensors work; unknown names raise errors listing the valid ones.
"""

import pytest
import torch

from ufp4_megatron import RHT, quantize
from ufp4_megatron.numerics.quantize import quantize_view_full


@pytest.mark.parametrize("fmt,gmax", [("e2m1", 6.0), ("e1m2", 1.75), ("int4", 7.0)])
def test_fp32_scale_maps_block_amax_onto_gmax(fmt, gmax):
    x = torch.randn(32, 64)
    q = quantize_view_full(x, fmt)
    amax = x.abs().view(32, 4, 16).amax(-1)
    assert torch.equal(q.scales, amax / gmax)
    qa = q.values.abs().view(32, 4, 16).amax(-1)
    assert torch.allclose(qa, amax, rtol=1e-6)


def test_2d_tiles_share_one_scale_and_serve_both_layouts():
    w = torch.randn(48, 64)
    q = quantize(w, "e2m1", block_2d=True)
    qt = quantize(w.t().contiguous(), "e2m1", block_2d=True)
    assert torch.equal(q, qt.t())  # the same 16x16 tiles whichever dim is blocked
    s = quantize_view_full(w, "e2m1", block_2d=True).scales
    assert torch.equal(s[0], s[15]) and not torch.equal(s[0], s[16])


def test_e8m0_scales_are_powers_of_two_and_e4m3_scales_are_e4m3_values():
    x = torch.randn(16, 128) * 3
    s = quantize_view_full(x, "e2m1", block=32, scale="e8m0").scales
    m, _ = torch.frexp(s)
    assert torch.all(m == 0.5)
    qv = quantize_view_full(x, "e2m1", scale="e4m3")
    s_t = x.abs().max() / (448 * 6)
    sb = qv.scales / s_t
    assert torch.allclose(sb.to(torch.float8_e4m3fn).float(), sb, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_any_dim_shape_and_dtype(dtype):
    x = torch.randn(3, 32, 5, dtype=dtype)
    q = quantize(x, "e1m2", dim=1)
    assert q.shape == x.shape and q.dtype == dtype
    ref = quantize(x.movedim(1, -1).contiguous(), "e1m2").movedim(-1, 1)
    assert torch.equal(q, ref)


def test_non_multiple_sizes_equal_explicit_zero_padding():
    x = torch.randn(6, 37)
    padded = torch.nn.functional.pad(x, (0, 11))
    for kw in ({}, {"rounding": "sr", "seed": 4}, {"scale": "e8m0", "block": 32}):
        assert torch.equal(quantize(x, "e2m1", **kw), quantize(padded, "e2m1", **kw)[:, :37])


def test_nan_and_inf_poison_only_their_block():
    x = torch.randn(2, 48)
    x[0, 3] = float("nan")
    x[1, 20] = float("inf")
    q = quantize(x, "e1m2")
    assert torch.isnan(q[0, :16]).all() and torch.isfinite(q[0, 16:]).all()
    assert torch.isnan(q[1, 16:32]).all() and torch.isfinite(q[1, :16]).all()
    assert torch.isfinite(q[1, 32:]).all()
    for scale in ("e4m3", "e8m0"):
        qs = quantize(x, "e2m1", scale=scale)
        assert torch.isnan(qs[0, :16]).all() and not torch.isfinite(qs[1, 16:32]).any()


def test_zero_blocks_and_empty_tensors():
    x = torch.zeros(4, 32)
    x[0, 16:] = torch.randn(16)
    q = quantize(x, "e2m1", rht=16)
    assert torch.equal(q[1:], torch.zeros(3, 32)) and torch.equal(q[0, :16], torch.zeros(16))
    assert quantize(torch.empty(0, 16), "e1m2").shape == (0, 16)
    assert quantize(torch.empty(5, 0), "e1m2").shape == (5, 0)
    assert quantize(torch.empty(0, 64), "e1m2", rounding="sr", rht=16).shape == (0, 64)


def test_tiny_block_in_e4m3_underflows_to_exact_zero_not_nan():
    x = torch.zeros(1, 32)
    x[0, 0] = 1e6
    x[0, 16] = 1e-6  # its E4M3 block scale underflows to 0
    q = quantize(x, "e2m1", scale="e4m3")
    assert torch.equal(q[0, 16:], torch.zeros(16)) and torch.isfinite(q).all()


def test_rht_returns_values_in_the_rotated_domain():
    from ufp4_megatron import RHT

    x = torch.randn(8, 64)
    r = RHT(16, seed=3)
    assert torch.equal(quantize(x, "e1m2", rht=r), quantize(r.rotate(x), "e1m2"))


def test_bad_input_errors_name_the_valid_choices():
    x = torch.randn(4, 16)
    with pytest.raises(ValueError, match="valid: e2m1"):
        quantize(x, "e3m0")
    with pytest.raises(ValueError, match="valid: fp32, e4m3, e8m0"):
        quantize(x, "e2m1", scale="ue8m0")
    with pytest.raises(ValueError, match="valid: rtne, sr"):
        quantize(x, "e2m1", rounding="nearest")
    with pytest.raises(ValueError, match="multiple of 16"):
        quantize(torch.randn(4, 20), "e2m1", rht=16)
    with pytest.raises(TypeError, match="float32/bfloat16/float16/float64 tensors"):
        quantize(torch.ones(4, 16, dtype=torch.int32), "e2m1")
    with pytest.raises(ValueError, match="positive integer"):
        quantize(x, "e2m1", block=0)


def test_rht16_quantize_of_values_near_8e37_is_finite():
    """The reported case: finite fp32 values near 8e37 with RHT16 gave a NaN block."""
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(4, 64, generator=g) * 2 - 1) * 8e37
    x[0, :16] = RHT(16, 0).signs * 8e37
    for grid in ("e1m2", "e2m1", "int4"):
        q = quantize(x, grid, rht=16)
        assert torch.isfinite(q).all(), grid
        back = RHT(16, 0).inverse(q)
        assert torch.isfinite(back).all()
        err = (back.double() - x.double()).norm() / x.double().norm()
        assert float(err) < 0.2, grid  # a 4-bit rounding, no more


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(rounding="sr", seed=3),
        dict(block=32, block_2d=True),
        dict(dim=0),
        dict(scale="e4m3"),
    ],
)
def test_gradient_is_straight_through(kw):
    """quantize() of a tensor that requires grad: the rounding counts as the identity (the
    straight-through estimator); without it the gradient was 0 except at each block's amax."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(32, 48, generator=g).requires_grad_()
    w = torch.randn(32, 48, generator=g)
    q = quantize(x, "e1m2", **kw)
    assert q.requires_grad and torch.equal(q.detach(), quantize(x.detach(), "e1m2", **kw))
    (q * w).sum().backward()
    assert torch.equal(x.grad, w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gradient_with_rht_is_the_rotations_transpose(dtype):
    r = RHT(16, 4)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 64, generator=g).to(dtype).requires_grad_()
    q = quantize(x, "e2m1", rht=r, dim=-1)
    w = torch.randn(q.shape, generator=g, dtype=q.dtype)
    (q * w).sum().backward()
    assert x.grad.dtype == dtype
    assert torch.equal(x.grad, r.inverse(w).to(dtype))
    x2 = x.detach().clone().requires_grad_()  # autograd through the rotation alone agrees
    (r.rotate(x2).to(w.dtype) * w).sum().backward()
    assert torch.allclose(x.grad.float(), x2.grad.float(), rtol=0, atol=1e-2)


def test_no_graph_without_requires_grad_or_under_no_grad():
    x = torch.randn(4, 32)
    assert not quantize(x, "e1m2").requires_grad
    with torch.no_grad():
        assert not quantize(x.requires_grad_(), "e1m2").requires_grad

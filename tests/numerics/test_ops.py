"""The quantized linear: three GEMMs, autograd, seeds, memory.

Contracts:
- bf16 recipe == torch.nn.functional.linear exactly (forward and all gradients);
- each GEMM equals the explicit composition of `quantize` calls the recipe describes
  (operands along the reduction dim, same RHT on both, SR seeds per GEMM/operand);
- against a float64 reference the relative error is bounded by 4-bit noise: each operand
  has SQNR >= ~17 dB (relative error <= 0.15), so a product's relative error stays below
  ~0.3 for random data; a wrong transpose or a missing RHT cancellation gives ~1.4;
- x of any leading shape, bf16/fp16/fp32, K not a multiple of 16, bias;
- backward saves only x and w (what BF16 saves), never quantized copies.
"""

import pytest
import torch

from ufp4_megatron import RHT, get_recipe, list_recipes, quantize, quantized_linear
from ufp4_megatron.numerics.philox import mix_seed
from ufp4_megatron.quant.ops import dgrad, fprop, wgrad


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


def test_bf16_recipe_is_exactly_torch_linear():
    x = torch.randn(2, 7, 48, requires_grad=True)
    w = torch.randn(24, 48, requires_grad=True)
    b = torch.randn(24, requires_grad=True)
    y = quantized_linear(x, w, b, get_recipe("bf16"))
    g = torch.randn_like(y)
    gx, gw, gb = torch.autograd.grad(y, (x, w, b), g)
    y2 = torch.nn.functional.linear(x, w, b)
    gx2, gw2, gb2 = torch.autograd.grad(y2, (x, w, b), g)
    assert torch.equal(y, y2) and torch.equal(gx, gx2) and torch.equal(gw, gw2)
    assert torch.allclose(gb, gb2, atol=1e-5)


def test_ufp4_gemms_equal_the_explicit_quantize_composition():
    r = get_recipe("ufp4", rht_seed=7)
    rht = RHT(16, 7)
    x, w, dy = torch.randn(32, 64), torch.randn(48, 64), torch.randn(32, 48)
    seed = 99
    q = lambda t, **kw: quantize(t, "e1m2", rht=rht, **kw)
    assert torch.equal(fprop(x, w, r, seed=seed), q(x) @ q(w).t())
    assert torch.equal(
        dgrad(dy, w, r, seed=seed), q(dy, rounding="sr", seed=mix_seed(seed, 1, 0)) @ q(w, dim=0)
    )
    assert torch.equal(
        wgrad(dy, x, r, seed=seed),
        q(dy, dim=0, rounding="sr", seed=mix_seed(seed, 2, 0)).t() @ q(x, dim=0),
    )


def test_e2m1_baseline_rotates_only_wgrad():
    r = get_recipe("e2m1")
    x, w = torch.randn(32, 64), torch.randn(48, 64)
    assert torch.equal(fprop(x, w, r), quantize(x, "e2m1") @ quantize(w, "e2m1").t())


@pytest.mark.parametrize("name", [n for n in list_recipes() if n != "bf16"])
def test_error_against_float64_is_bounded_by_4bit_noise(name):
    torch.manual_seed(0)
    x = torch.randn(4, 16, 96, requires_grad=True)
    w = (torch.randn(80, 96) / 10).requires_grad_()
    y = quantized_linear(x, w, None, get_recipe(name), seed=1)
    g = torch.randn_like(y)
    gx, gw = torch.autograd.grad(y, (x, w), g)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y64 = x64 @ w64.t()
    gx64, gw64 = torch.autograd.grad(y64, (x64, w64), g.double())
    for got, ref in ((y, y64), (gx, gx64), (gw, gw64)):
        assert _rel(got, ref) < 0.3
    assert _rel(y, y64) > 1e-3  # it really quantized


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_dtypes_leading_shapes_odd_k_and_bias(dtype):
    x = torch.randn(3, 2, 5, 40, dtype=dtype, requires_grad=True)
    w = torch.randn(24, 40, dtype=dtype, requires_grad=True)
    b = torch.randn(24, dtype=dtype, requires_grad=True)
    y = quantized_linear(x, w, b, get_recipe("ufp4"), seed=3)
    y.float().sum().backward()
    assert y.shape == (3, 2, 5, 24) and y.dtype == dtype
    assert x.grad.shape == x.shape and w.grad.dtype == dtype and b.grad.shape == (24,)
    assert torch.isfinite(x.grad).all() and torch.isfinite(w.grad).all()


def test_backward_saves_only_x_and_w():
    saved = []
    x = torch.randn(64, 64, requires_grad=True)
    w = torch.randn(32, 64, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        quantized_linear(x, w, None, get_recipe("ufp4"), seed=0)
    assert len(saved) == 2
    assert {t.data_ptr() for t in saved} == {x.data_ptr(), w.data_ptr()}


def test_seed_none_draws_only_when_the_recipe_uses_sr():
    x, w = torch.randn(16, 32), torch.randn(8, 32)
    torch.manual_seed(0)
    quantized_linear(x, w, None, get_recipe("ufp4", sr=()))
    after_rtne = torch.rand(1)
    torch.manual_seed(0)
    assert torch.equal(torch.rand(1), after_rtne)  # nothing was drawn without SR
    torch.manual_seed(0)
    quantized_linear(x, w, None, get_recipe("ufp4"))
    assert not torch.equal(torch.rand(1), after_rtne)


def test_zero_tokens_and_bad_arguments():
    w = torch.randn(8, 32, requires_grad=True)
    x = torch.randn(0, 32, requires_grad=True)
    y = quantized_linear(x, w, None, get_recipe("ufp4"), seed=0)
    y.sum().backward()
    assert y.shape == (0, 8) and torch.equal(w.grad, torch.zeros_like(w))
    with pytest.raises(ValueError, match="features"):
        quantized_linear(torch.randn(2, 31), w, None, get_recipe("ufp4"))
    with pytest.raises(TypeError, match="get_recipe"):
        quantized_linear(torch.randn(2, 32), w, None, "ufp4")

"""The TransformerEngine route's data flow, in plain PyTorch, against the local route (ops.py).

TE's quantizers hand its GEMMs one layout of each operand (ufp4_megatron/te/layouts.py): these
tests run that flow with the layouts the factory's quantizers hold and compare with what the
local autograd function multiplies and returns. TransformerEngine itself is not involved
(it needs CUDA): whether TE's modules call the quantizers for these layouts and multiply the
pairs of LAYOUTS is what gpu/te_check.sh shows on a GPU.

    test_layout_table_is_the_recipe_reduction_table     row-wise <=> quantized along the last dim
    test_layouts_equal_the_local_operands_bitwise        every preset and ablation, every GEMM,
                                                         fp32 and bf16: ops._gemm_operands' tensors
    test_te_gemm_flow_reproduces_quantized_linear        fprop/dgrad/wgrad on the layouts ==
                                                         quantized_linear's y, dX, dW bitwise
    test_main_grad_accumulation_over_micro_batches       wgrad added into an fp32 main_grad per
                                                         micro-batch, as TE's fused accumulation
    test_unrotated_padding_is_cut_rotated_is_refused     lengths off the block / RHT grid
    test_sr_layouts_use_the_call_seed_per_gemm           dgrad and wgrad dY bits of one call seed
"""

from __future__ import annotations

import pytest
import torch

from ufp4_megatron.quant import ops
from ufp4_megatron.quant.recipe import ABLATIONS, GEMMS, OPERANDS, PRESETS, ablation, reduction_dim
from ufp4_megatron.te.layouts import COLUMNWISE, LAYOUTS, ROWWISE, layout_plan, quantize_layout

RECIPES = {
    **{n: r for n, r in PRESETS.items() if r.quantized},
    **{n: ablation(n) for n in ABLATIONS},
}
SEED = 0x5EED_1234


def _tensors(m=64, k=96, n=48, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) * 0.05).to(dtype)
    dy = (torch.randn(m, n, generator=g) * 1e-3).to(dtype)
    return x, w, dy


def _layouts(recipe, x, w, dy, seed=SEED):
    """TE's six layouts: {(tensor, layout): fake-quantized tensor}."""
    tensors = {"input": x, "weight": w, "grad_output": dy}
    return {
        (t, lay): quantize_layout(
            tensors[t], layout_plan(recipe, t, lay), seed=seed, backend="torch"
        )
        for t in LAYOUTS
        for lay in (ROWWISE, COLUMNWISE)
    }


def test_layout_table_is_the_recipe_reduction_table():
    seen = set()
    for tensor, layouts in LAYOUTS.items():
        for layout, (gemm, operand) in layouts.items():
            assert (reduction_dim(gemm, operand) == 1) == (layout == ROWWISE), (tensor, layout)
            seen.add((gemm, operand))
    assert seen == {(g, o) for g in GEMMS for o in OPERANDS[g]}  # every operand exactly once


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(RECIPES))
def test_layouts_equal_the_local_operands_bitwise(name, dtype):
    recipe = RECIPES[name]
    x, w, dy = _tensors(dtype=dtype)
    lay = _layouts(recipe, x, w, dy)
    natural = {"x": x, "w": w, "dy": dy}
    role = {"x": "input", "w": "weight", "dy": "grad_output"}
    for gemm in GEMMS:
        if getattr(recipe, gemm) is None:
            continue
        names = OPERANDS[gemm]
        local = ops._gemm_operands(
            gemm,
            recipe,
            tuple(natural[n] for n in names),
            ((0, 0), (0, 0)),
            seed=SEED,
            backend="torch",
        )
        for operand, want in zip(names, local):
            layout = ROWWISE if reduction_dim(gemm, operand) == 1 else COLUMNWISE
            got = lay[role[operand], layout]
            # ops pads both operands to a common length along the reduction dim (mxfp4's
            # 1x32 blocks: N = 48 -> 64); that padding is zero, and a layout cuts it
            dim = reduction_dim(gemm, operand)
            cut = want.narrow(dim, 0, got.shape[dim])
            assert torch.count_nonzero(want) == torch.count_nonzero(cut), (gemm, operand)
            assert got.dtype == want.dtype and got.shape == cut.shape, (gemm, operand)
            assert torch.equal(got, cut), f"{name} {gemm}.{operand} differs"


@pytest.mark.parametrize("name", ["ufp4", "e2m1", "ufp4_int4", "nvfp4", "mxfp4"])
def test_te_gemm_flow_reproduces_quantized_linear(name):
    """TE's GEMMs on the layouts (general_gemm's TN, NN, NT) against the local autograd
    function with the same call seed: the same products, bitwise."""
    recipe = PRESETS[name]
    x, w, dy = _tensors(m=32, k=64, n=32)
    x.requires_grad_(True)
    w.requires_grad_(True)
    y = ops.quantized_linear(x, w, None, recipe, seed=SEED, backend="torch")
    y.backward(dy)
    lay = _layouts(recipe, x.detach(), w.detach(), dy)
    y_te = lay["input", ROWWISE] @ lay["weight", ROWWISE].t()  # fprop  TN
    dx_te = lay["grad_output", ROWWISE] @ lay["weight", COLUMNWISE]  # dgrad  NN
    dw_te = lay["grad_output", COLUMNWISE].t() @ lay["input", COLUMNWISE]  # wgrad NT
    assert torch.equal(y_te, y.detach())
    assert torch.equal(dx_te, x.grad)
    assert torch.equal(dw_te, w.grad)


def test_main_grad_accumulation_over_micro_batches():
    """TE with fused wgrad accumulation writes each micro-batch's dW into the fp32 main_grad
    (general_gemm(out=main_grad, accumulate=True)); the layouts' wgrad summed over micro-batches
    equals the local route's dW summed the same way (on a GPU TE accumulates inside the GEMM
    in fp32, the local route adds the BF16 product: equal within BF16 rounding there)."""
    recipe = PRESETS["ufp4"]
    main_local = torch.zeros(32, 64)
    main_te = torch.zeros(32, 64)
    for mb in range(3):
        x, w, dy = _tensors(m=32, k=64, n=32, seed=mb)
        seed = SEED + mb
        main_local += ops.wgrad(dy, x, recipe, seed=seed, backend="torch")
        lay = _layouts(recipe, x, w, dy, seed=seed)
        main_te += lay["grad_output", COLUMNWISE].t() @ lay["input", COLUMNWISE]
    assert torch.equal(main_te, main_local)
    assert main_te.abs().sum() > 0


def test_unrotated_padding_is_cut_rotated_is_refused():
    e2m1 = PRESETS["e2m1"]  # fprop without RHT: K = 40 is padded to 48 and cut
    x, w, _ = _tensors(m=32, k=40, n=32)
    lay = _layouts(e2m1, x, w, torch.zeros(32, 32))
    assert lay["input", ROWWISE].shape == x.shape
    y_local = ops.fprop(x, w, e2m1, backend="torch")
    assert torch.equal(lay["input", ROWWISE] @ lay["weight", ROWWISE].t(), y_local)
    ufp4 = PRESETS["ufp4"]  # fprop rotates along K in groups of 16
    with pytest.raises(ValueError, match=r"input \(32, 40\).*fprop GEMM rotates.*multiple of 16"):
        quantize_layout(x, layout_plan(ufp4, "input", ROWWISE))
    with pytest.raises(ValueError, match=r"wgrad GEMM rotates its tokens"):  # M = 24 tokens
        quantize_layout(torch.randn(24, 32), layout_plan(ufp4, "grad_output", COLUMNWISE), seed=1)


def test_sr_layouts_use_the_call_seed_per_gemm():
    """ufp4 rounds dY stochastically in dgrad and wgrad: each layout mixes its GEMM into the
    call seed as ops does, so the two layouts draw different bits, and another call seed
    changes them; x and w (RTNE) do not depend on the seed."""
    recipe = PRESETS["ufp4"]
    x, w, dy = _tensors()
    a, b = _layouts(recipe, x, w, dy, seed=1), _layouts(recipe, x, w, dy, seed=2)
    assert not torch.equal(a["grad_output", ROWWISE], b["grad_output", ROWWISE])
    assert not torch.equal(a["grad_output", COLUMNWISE], b["grad_output", COLUMNWISE])
    for key in (
        ("input", ROWWISE),
        ("input", COLUMNWISE),
        ("weight", ROWWISE),
        ("weight", COLUMNWISE),
    ):
        assert torch.equal(a[key], b[key]), key
    plan = layout_plan(recipe, "grad_output", ROWWISE)
    assert plan.uses_sr and plan.salt == (GEMMS.index("dgrad"), 0)


def test_an_expert_without_tokens_passes_through():
    for tensor, layout in (("input", ROWWISE), ("grad_output", COLUMNWISE)):
        empty = torch.zeros(0, 64)
        out = quantize_layout(empty, layout_plan(PRESETS["ufp4"], tensor, layout), seed=1)
        assert out.shape == (0, 64)


def test_unknown_role_or_layout_is_refused():
    with pytest.raises(ValueError, match="no GEMM operand for tensor 'output'"):
        layout_plan(PRESETS["ufp4"], "output", ROWWISE)

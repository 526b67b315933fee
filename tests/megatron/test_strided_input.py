"""A strided column-parallel weight (the gated fc1 of SwiGLU at TP > 1) is several chunks of
the full N axis, one ops call each (megatron/parallel_gemm.py, and grouped experts in
megatron/experts.py). They share x: its fprop and wgrad operands are quantized once for all
chunks where they round to nearest, and the results are bit for bit those of quantizing x
again in every chunk's call (the per-chunk calls below). On the kernels, x's operand made
apart is the pair launch's bits:
tests/kernels/test_device_keys_and_prepared.py::test_kept_operands_are_the_pair_launch_bits.
"""

import pytest
import torch

from ufp4_megatron import get_recipe
from ufp4_megatron.megatron import parallel_gemm
from ufp4_megatron.megatron.parallel_gemm import Comm, Shard, UFP4ParallelLinearFn
from ufp4_megatron.quant import ops

COMM = Comm(
    sequence_parallel=False, allreduce_dgrad=False, grad_accumulation_fusion=False, tp_group=None
)
STRIDED = Shard.column(rank=1, world=2, n_local=32, stride=2)


def _per_chunk(x2d, w, dy2d, recipe, seed, shard):
    """y and dW with x quantized again in every chunk's call (no shared operand)."""
    ys, dws = [], []
    for local, n0, width in shard.n:
        wc = w[local : local + width].contiguous()
        dyc = dy2d[:, local : local + width].contiguous()
        ys.append(ops.fprop(x2d, wc, recipe, seed=seed, x_origin=(0, 0), w_origin=(n0, 0)))
        dws.append(ops.wgrad(dyc, x2d, recipe, seed=seed, dy_origin=(0, n0), x_origin=(0, 0)))
    return torch.cat(ys, 1), torch.cat(dws, 0)


@pytest.mark.parametrize("name", ["ufp4", "e2m1", "nvfp4", "ufp4_int4"])
def test_strided_weight_quantizes_x_once_with_the_same_bits(name, monkeypatch):
    recipe = get_recipe(name)
    made = []
    real = ops.operand
    monkeypatch.setattr(
        ops, "operand", lambda gemm, op, *a, **k: made.append((gemm, op)) or real(gemm, op, *a, **k)
    )
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 16, 48, generator=g)
    w = torch.nn.Parameter(torch.randn(32, 48, generator=g))
    dy = torch.randn(2, 16, 32, generator=g)
    xi = x.clone().requires_grad_()
    y = UFP4ParallelLinearFn.apply(xi, w, None, recipe, 11, STRIDED, COMM, None)
    y.backward(dy)
    assert made == [("fprop", "x"), ("wgrad", "x")]  # once each, not once per chunk
    made.clear()
    want_y, want_dw = _per_chunk(
        x.reshape(32, 48), w.detach(), dy.reshape(32, 32), recipe, 11, STRIDED
    )
    assert made == []
    assert torch.equal(y.detach().reshape(32, 32), want_y)
    assert torch.equal(w.grad, want_dw)


def test_one_chunk_or_a_stochastic_x_is_left_to_the_gemm_call():
    x = torch.randn(8, 48)
    assert parallel_gemm.shared_input("fprop", x, get_recipe("ufp4"), Shard()) is None
    sr_x = get_recipe("ufp4", sr=("dy", "x"))
    assert parallel_gemm.shared_input("wgrad", x, sr_x, STRIDED) is None
    assert parallel_gemm.shared_input("fprop", x, get_recipe("bf16"), STRIDED) is None
    assert parallel_gemm.shared_input("wgrad", x, sr_x, Shard()) is None
    assert parallel_gemm.shared_input("fprop", x, get_recipe("ufp4"), STRIDED) is not None


@pytest.mark.parametrize("name", ["ufp4", "nvfp4"])
def test_strided_grouped_experts_quantize_x_once_with_the_same_bits(name, monkeypatch):
    from ufp4_megatron.megatron.experts import _GroupedExpertsFn
    from ufp4_megatron.quant import grouped_ops

    recipe = get_recipe(name)
    made = []
    real = grouped_ops.input_operand
    monkeypatch.setattr(
        grouped_ops, "input_operand", lambda gemm, *a, **k: made.append(gemm) or real(gemm, *a, **k)
    )
    g = torch.Generator().manual_seed(4)
    groups = grouped_ops.expert_groups((16, 0, 32), grouped_ops.token_alignment(recipe))
    x = torch.randn(48, 48, generator=g)
    w = torch.nn.Parameter(torch.randn(3, 32, 48, generator=g))
    dy = torch.randn(48, 32, generator=g)
    xi = x.clone().requires_grad_()
    y = _GroupedExpertsFn.apply(xi, w, None, recipe, 21, 2, groups, STRIDED, False, None)
    y.backward(dy)
    assert made == ["fprop", "wgrad"]  # once each, not once per chunk

    keys = dict(seed=21, first_expert=2, x_origin=(0, 0))
    xp, dyp = groups.pad(x), groups.pad(dy)
    ys, dws = [], []
    for local, n0, width in STRIDED.n:
        wc = w.detach()[:, local : local + width].contiguous()
        dyc = dyp[:, local : local + width].contiguous()
        ys.append(grouped_ops.fprop(xp, wc, groups, recipe, **keys, w_origin=(n0, 0)))
        dws.append(grouped_ops.wgrad(dyc, xp, groups, recipe, **keys, dy_origin=(0, n0)))
    assert torch.equal(y.detach(), groups.unpad(torch.cat(ys, 1)))
    assert torch.equal(w.grad, torch.cat(dws, 1))

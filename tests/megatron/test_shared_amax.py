"""NVFP4's tensor amax taken once for two GEMMs in the tensor-parallel linear
(megatron/parallel_gemm.py): x's for fprop and wgrad and w's for fprop and dgrad in forward,
dY's for dgrad and wgrad in backward (ops.tensor_amaxes: one kernel read on a GPU, kernels.tensor_amax_pair, tested bit
for bit against the reference in tests/kernels/test_amax_pair_triton.py). On the CPU the
GEMMs take the reference path, so tensor_amaxes is replaced by the reference's amax of each
layout: what reaches each GEMM must give the bits each GEMM gets when it takes its own."""

import pytest
import torch

from ufp4_megatron import get_recipe
from ufp4_megatron.megatron.parallel_gemm import Comm, Shard, UFP4ParallelLinearFn
from ufp4_megatron.numerics.quantize import e4m3_tensor_amax
from ufp4_megatron.quant import ops

COMM = Comm(
    sequence_parallel=False, allreduce_dgrad=False, grad_accumulation_fusion=False, tp_group=None
)
STRIDED = Shard.column(rank=1, world=2, n_local=32, stride=2)


def _reference_amaxes(calls):
    def amaxes(name, t, recipe, *, backend="auto"):
        calls.append(name)
        fmts = ops.shared_formats(name, t, recipe)
        if fmts is None:
            return None, None
        return tuple(
            e4m3_tensor_amax(view, block=f.block, block_2d=f.block_2d, rht=f.rht)
            for f, view in zip(fmts, (t, t.t()))
        )

    return amaxes


def _run(recipe, shard, weight_grad=True, cache=None, w_dtype=torch.float32):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 16, 48, generator=g).requires_grad_()
    w = torch.randn(32, 48, generator=g).to(w_dtype)
    w = torch.nn.Parameter(w, requires_grad=weight_grad)
    dy = torch.randn(2, 16, 32, generator=g)
    y = UFP4ParallelLinearFn.apply(x, w, None, recipe, 11, shard, COMM, cache)
    y.backward(dy)
    return y.detach(), x.grad, w.grad


@pytest.mark.parametrize(
    "name, shard, weight_grad, shared",
    [
        ("nvfp4", Shard(), True, ["x", "w", "dy"]),
        ("nvfp4", Shard.row(rank=1, k_local=48), True, ["x", "w", "dy"]),
        ("nvfp4", Shard(), False, ["w"]),  # no wgrad: x and dY quantized once anyway
        ("nvfp4", STRIDED, True, []),  # x made once for all chunks; w and dY chunks are copies
        # x and dY asked, and declined (fp32 scales); w not asked: the recipe says so, and
        # the linear's store of w's amaxes stays empty
        ("ufp4", Shard(), True, ["x", "dy"]),
    ],
)
def test_each_gemm_gets_the_amax_it_takes_itself(monkeypatch, name, shard, weight_grad, shared):
    recipe = get_recipe(name)
    own = _run(recipe, shard, weight_grad)
    calls = []
    monkeypatch.setattr(ops, "tensor_amaxes", _reference_amaxes(calls))
    got = _run(recipe, shard, weight_grad)
    assert calls == shared
    for what, a, b in zip(("y", "dx", "dw"), got, own):
        assert (a is None and b is None) or torch.equal(a, b), what


def test_a_kept_or_cast_weight_takes_no_shared_amax(monkeypatch):
    """w's pair is taken only where both GEMMs quantize w themselves, from w as they see it:
    not with kept operands (the weight cache makes them), not for a weight in another dtype
    than x (the GEMMs' cast to x's dtype could change its amax)."""
    from ufp4_megatron.quant.weight_cache import WeightOperands

    recipe = get_recipe("nvfp4")
    for kw in (dict(cache=WeightOperands()), dict(w_dtype=torch.float64)):
        own = _run(recipe, Shard(), **kw)
        calls = []
        monkeypatch.setattr(ops, "tensor_amaxes", _reference_amaxes(calls))
        got = _run(recipe, Shard(), **kw)
        monkeypatch.undo()
        assert calls == ["x", "dy"], kw
        for what, a, b in zip(("y", "dx", "dw"), got, own):
            assert torch.equal(a, b), (kw, what)


@pytest.mark.parametrize("name, which", [("x", None), ("w", 0), ("w", 1)])
def test_a_wrong_amax_would_be_seen(monkeypatch, name, which):
    """The comparison above can fail: x's two amaxes swapped change the bits, and w's amax
    off by 1.37x for fprop (which=0) changes y, for dgrad (1) dX. (w's two are equal, the
    same 16x16 tiles; a power of two would not show: e4m3 two-level scales are invariant
    under it.)"""
    recipe = get_recipe("nvfp4")
    own = _run(recipe, Shard())
    reference = _reference_amaxes([])

    def wrong(n, t, r, **k):
        pair = reference(n, t, r, **k)
        if n != name:
            return pair
        if which is None:
            return pair[::-1]
        return tuple(a * 1.37 if i == which else a for i, a in enumerate(pair))

    monkeypatch.setattr(ops, "tensor_amaxes", wrong)
    got = _run(recipe, Shard())
    if which is None:
        assert not all(torch.equal(a, b) for a, b in zip(got, own))
    else:
        assert not torch.equal(got[which], own[which])  # y for fprop's, dx for dgrad's

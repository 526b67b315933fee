"""Weights quantized once per optimizer step (ufp4_megatron/quant/weight_cache.py), on the CPU.

A UFP4 linear's autograd function (megatron/parallel_gemm.py) with and without its weight's
kept operands, over several optimizer steps of several micro-batches: outputs and gradients
bit for bit equal; the operands are made once per step (one fprop, one dgrad per chunk) and
again after each optimizer step, after a load_state_dict, after an in-place write through
the parameter, and after invalidate() (a write through .data, which nothing else sees).
The kernel path's operands equal the pair launch's bits in tests/kernels
(test_device_keys_and_prepared.py::test_cached_weight_operand_is_the_pair_launch_bits).
"""

import pytest
import torch

from ufp4_megatron import get_recipe
from ufp4_megatron.megatron.parallel_gemm import Comm, Shard, UFP4ParallelLinearFn
from ufp4_megatron.quant import weight_cache
from ufp4_megatron.quant.weight_cache import WeightOperands

COMM = Comm(
    sequence_parallel=False, allreduce_dgrad=False, grad_accumulation_fusion=False, tp_group=None
)
# one chunk, and a gated fc1's two chunks (stride 2 of a TP=2 shard: its own origins)
SHARDS = {"plain": Shard(), "stride2": Shard.column(rank=1, world=2, n_local=32, stride=2)}


class _Counting(WeightOperands):
    """Counts the operands made (cache misses)."""

    def __init__(self):
        super().__init__()
        self.made = []

    def get(self, key, weight, make):
        return super().get(key, weight, lambda: self.made.append(key) or make())


def _step(w, cache, shard, x, dy, seed):
    xi = x.clone().requires_grad_()
    y = UFP4ParallelLinearFn.apply(xi, w, None, get_recipe("ufp4"), seed, shard, COMM, cache)
    y.backward(dy)
    return y.detach(), xi.grad


@pytest.mark.parametrize("shard", SHARDS)
def test_kept_weight_operands_are_bitwise_and_refresh_when_the_weight_changes(shard):
    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(32, 48, generator=g)
    cached, plain = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    opts = [torch.optim.SGD([p], lr=0.1) for p in (cached, plain)]
    cache = _Counting()
    chunks = len(SHARDS[shard].n)
    for step in range(3):
        for micro in range(2):
            x, dy = torch.randn(2, 8, 48, generator=g), torch.randn(2, 8, 32, generator=g)
            y1, dx1 = _step(cached, cache, SHARDS[shard], x, dy, seed=100 * step + micro)
            y2, dx2 = _step(plain, None, SHARDS[shard], x, dy, seed=100 * step + micro)
            assert torch.equal(y1, y2) and torch.equal(dx1, dx2)
            assert torch.equal(cached.grad, plain.grad)
        # one fprop and one dgrad operand per chunk, made at the first micro-batch only
        assert len(cache.made) == 2 * chunks * (step + 1)
        for opt in opts:
            opt.step()  # the global post-step hook: every kept operand is stale now
            opt.zero_grad()
    assert cache.nbytes == 2 * 32 * 48 * 4  # fp32 here: two copies of the weight


def test_load_in_place_write_and_invalidate_refresh_the_kept_operands():
    g = torch.Generator().manual_seed(1)
    layer = torch.nn.Linear(48, 32, bias=False)
    cache = _Counting()
    x, dy = torch.randn(8, 48, generator=g), torch.randn(8, 32, generator=g)

    def check(made):
        plain = torch.nn.Parameter(layer.weight.detach().clone())
        y1, _ = _step(layer.weight, cache, Shard(), x, dy, seed=5)
        y2, _ = _step(plain, None, Shard(), x, dy, seed=5)
        assert torch.equal(y1, y2)
        assert len(cache.made) == made

    check(2)
    check(2)  # unchanged weight: kept
    layer.load_state_dict({"weight": torch.randn(32, 48, generator=g)})  # copy_: _version
    check(4)
    with torch.no_grad():
        layer.weight.mul_(0.5)  # in place through the parameter: _version
    check(6)
    layer.weight.data = torch.randn(32, 48, generator=g)  # new storage: data_ptr
    check(8)
    layer.weight.data.mul_(2.0)  # through .data: unseen until invalidate()
    weight_cache.invalidate()
    check(10)

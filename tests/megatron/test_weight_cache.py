"""Weights quantized once per optimizer step (ufp4_megatron/quant/weight_cache.py), on the CPU.

A UFP4 linear's autograd function (megatron/parallel_gemm.py) with and without its weight's
kept operands, over several optimizer steps of several micro-batches: outputs and gradients
bit for bit equal; the operands are made once per step (one fprop, one dgrad per chunk) and
again after each optimizer step, after a load_state_dict, after an in-place write through
the parameter, and after invalidate() (a write through .data, which nothing else sees).
Static operands (per-layer CUDA graphs): kept in the same storage, read by a capture (stood
for by patching the capture check), re-made by refresh() from the parameter's new values,
and never handed stale to a capture.
The kernel path's operands equal the pair launch's bits in tests/kernels
(test_device_keys_and_prepared.py::test_kept_operands_are_the_pair_launch_bits).
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


def _step(w, cache, shard, x, dy, seed, recipe="ufp4"):
    xi = x.clone().requires_grad_()
    y = UFP4ParallelLinearFn.apply(xi, w, None, get_recipe(recipe), seed, shard, COMM, cache)
    y.backward(dy)
    return y.detach(), xi.grad


# operands kept per chunk: fprop's and dgrad's, or one for both where they are one tensor
# (NVFP4's 16x16 tiles, unrotated, RTNE: ops.shares_weight_operand)
KEPT_PER_CHUNK = {"ufp4": 2, "nvfp4": 1}


@pytest.mark.parametrize("recipe", KEPT_PER_CHUNK)
@pytest.mark.parametrize("shard", SHARDS)
def test_kept_weight_operands_are_bitwise_and_refresh_when_the_weight_changes(shard, recipe):
    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(32, 48, generator=g)
    cached, plain = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    opts = [torch.optim.SGD([p], lr=0.1) for p in (cached, plain)]
    cache = _Counting()
    chunks = len(SHARDS[shard].n)
    for step in range(3):
        for micro in range(2):
            x, dy = torch.randn(2, 8, 48, generator=g), torch.randn(2, 8, 32, generator=g)
            seed = 100 * step + micro
            y1, dx1 = _step(cached, cache, SHARDS[shard], x, dy, seed, recipe)
            y2, dx2 = _step(plain, None, SHARDS[shard], x, dy, seed, recipe)
            assert torch.equal(y1, y2) and torch.equal(dx1, dx2)
            assert torch.equal(cached.grad, plain.grad)
        # the operands of each chunk, made at the first micro-batch only
        assert len(cache.made) == KEPT_PER_CHUNK[recipe] * chunks * (step + 1)
        for opt in opts:
            opt.step()  # the global post-step hook: every kept operand is stale now
            opt.zero_grad()
    assert cache.nbytes == KEPT_PER_CHUNK[recipe] * 32 * 48 * 4  # fp32 here: copies of w


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


def _capturing(monkeypatch, on: bool):
    # stands for torch.cuda.is_current_stream_capturing(): on CPU nothing is ever captured
    monkeypatch.setattr(weight_cache, "_capture_tag", (lambda: 1) if on else (lambda: -1))


@pytest.mark.parametrize("shard", SHARDS)
def test_static_operands_are_refreshed_in_their_storage_from_the_new_weight(shard, monkeypatch):
    """make_static/refresh (per-layer CUDA graphs): the operands stay in the same storage, a
    "capture" reads that storage, and refresh() after the optimizer step re-makes them from
    the parameter's new values, also where a chunk is a copy (stride2): a replay of a graph
    captured at step 0 then computes what the eager, uncached layer computes at every step,
    also after the parameter's storage is replaced."""
    g = torch.Generator().manual_seed(2)
    w0 = torch.randn(32, 48, generator=g)
    kept, plain = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    layer = torch.nn.Module()
    layer.weight_operands = cache = _Counting()
    assert weight_cache.make_static(layer) == 1
    opts = [torch.optim.SGD([p], lr=0.1) for p in (kept, plain)]
    chunks = len(SHARDS[shard].n)
    storage = None
    for step in range(3):
        for micro in range(2):
            # step 0, first micro-batch: eager (makes the operands); then every use is inside
            # a "capture", which may only read the kept storage
            _capturing(monkeypatch, step > 0 or micro > 0)
            x, dy = torch.randn(2, 8, 48, generator=g), torch.randn(2, 8, 32, generator=g)
            y1, dx1 = _step(kept, cache, SHARDS[shard], x, dy, seed=100 * step + micro)
            y2, dx2 = _step(plain, None, SHARDS[shard], x, dy, seed=100 * step + micro)
            assert torch.equal(y1, y2) and torch.equal(dx1, dx2), (step, micro)
            assert torch.equal(kept.grad, plain.grad)
        ptrs = sorted(e.operand.data_ptr() for e in cache._entries.values())
        assert storage in (None, ptrs)  # the same storage all along
        storage = ptrs
        for opt in opts:
            opt.step()
            opt.zero_grad()
        if step == 1:  # new storage: an operand made from a view taken earlier would miss it
            for p in (kept, plain):
                p.data = p.data * 1.5
        assert weight_cache.refresh(layer) == 2 * chunks  # every operand was stale
        assert weight_cache.refresh(layer) == 0
    # made at the first use and by each refresh, never inside a "capture"
    assert len(cache.made) == 2 * chunks * 4


def test_a_static_operand_stale_inside_a_capture_is_made_there_and_not_kept(monkeypatch):
    """A missed refresh must not hand a graph the old weight's operand: inside a capture a
    stale operand is made anew (in the graph, so every replay makes it) and the kept storage
    is left alone; eager, a stale operand is re-made into its storage."""
    g = torch.Generator().manual_seed(3)
    w = torch.nn.Parameter(torch.randn(32, 48, generator=g))
    layer = torch.nn.Module()
    layer.weight_operands = cache = WeightOperands()
    weight_cache.make_static(layer)
    x, dy = torch.randn(8, 48, generator=g), torch.randn(8, 32, generator=g)
    _step(w, cache, Shard(), x, dy, seed=1)
    kept = {k: (e.operand, e.operand.clone()) for k, e in cache._entries.items()}
    with torch.no_grad():
        w.mul_(0.5)  # no refresh after it
    _capturing(monkeypatch, True)
    y, _ = _step(w, cache, Shard(), x, dy, seed=1)
    y_plain, _ = _step(torch.nn.Parameter(w.detach().clone()), None, Shard(), x, dy, seed=1)
    assert torch.equal(y, y_plain)
    for k, (storage, before) in kept.items():
        assert cache._entries[k].operand is storage and torch.equal(storage, before)
    _capturing(monkeypatch, False)
    y, _ = _step(w, cache, Shard(), x, dy, seed=1)
    assert torch.equal(y, y_plain)
    for k, (storage, before) in kept.items():
        assert cache._entries[k].operand is storage and not torch.equal(storage, before)


def test_refresh_leaves_operands_that_are_not_static_to_their_next_use():
    layer = torch.nn.Module()
    layer.weight_operands = cache = _Counting()
    w = torch.nn.Parameter(torch.randn(32, 48))
    x, dy = torch.randn(8, 48), torch.randn(8, 32)
    _step(w, cache, Shard(), x, dy, seed=1)
    weight_cache.invalidate()
    assert weight_cache.refresh(layer) == 0 and len(cache.made) == 2


@pytest.mark.parametrize("gemm", ["fprop", "dgrad"])
def test_grouped_experts_static_operands_refresh_from_the_stacked_parameter(gemm):
    """The experts' weight is stacked [E, N, K]: a chunk of a stride-2 shard along N is a
    copy, so an operand re-made from the chunk taken when it was first made would be the old
    weight's. refresh() must re-derive it from the parameter."""
    from ufp4_megatron.megatron.experts import _kept
    from ufp4_megatron.megatron.parallel_gemm import chunk_of
    from ufp4_megatron.quant import grouped_ops

    g = torch.Generator().manual_seed(4)
    shard = SHARDS["stride2"]
    recipe = get_recipe("ufp4")
    weight = torch.nn.Parameter(torch.randn(2, 32, 48, generator=g))
    layer = torch.nn.Module()
    layer.weight_operands = cache = WeightOperands()
    weight_cache.make_static(layer)

    def expected(c, n0):
        w = chunk_of(shard, weight.detach(), 1, c)
        return grouped_ops.weight_operand(gemm, w, recipe, origin=(n0, shard.k))

    chunks = [(c, full) for c, (_, full, _) in enumerate(shard.n)]
    first = {
        c: _kept(cache, gemm, c, weight, shard, recipe, (n0, shard.k), None) for c, n0 in chunks
    }
    with torch.no_grad():
        weight.mul_(-0.5).add_(1.0)  # an optimizer's update, in place
    assert weight_cache.refresh(layer) == len(chunks)
    for c, n0 in chunks:
        kept = cache._entries[(gemm, c)].operand
        assert kept is first[c]  # the same storage
        assert torch.equal(kept, expected(c, n0))


@pytest.mark.parametrize("shard", SHARDS)
def test_grouped_experts_keep_one_operand_where_fprop_and_dgrad_share_it(shard):
    """NVFP4's stacked expert weight: dgrad's operand is fprop's kept entry, and it is bit for
    bit the operand dgrad would make itself (per-expert e4m3 amaxes included); UFP4 keeps two."""
    from ufp4_megatron.megatron.experts import _kept
    from ufp4_megatron.megatron.parallel_gemm import chunk_of
    from ufp4_megatron.quant import grouped_ops

    g = torch.Generator().manual_seed(5)
    shard = SHARDS[shard]
    # experts of very different scales: a wrong per-expert amax would show
    weight = torch.nn.Parameter(
        torch.randn(3, 32, 48, generator=g) * torch.tensor([1.0, 30.0, 1e-3])[:, None, None]
    )
    for recipe, kept in (("nvfp4", 1), ("ufp4", 2)):
        cache = WeightOperands()
        for c, (_, n0, _) in enumerate(shard.n):
            origin = (n0, shard.k)
            fprop = _kept(cache, "fprop", c, weight, shard, get_recipe(recipe), origin, None)
            dgrad = _kept(cache, "dgrad", c, weight, shard, get_recipe(recipe), origin, None)
            w = chunk_of(shard, weight.detach(), 1, c)
            own = grouped_ops.weight_operand("dgrad", w, get_recipe(recipe), origin=origin)
            assert torch.equal(dgrad, own), (recipe, c)
            assert (dgrad is fprop) == (kept == 1), recipe
        assert len(cache._entries) == kept * len(shard.n), recipe


def test_shares_weight_operand_only_for_whole_square_unrotated_rtne_tiles():
    from ufp4_megatron.quant.ops import shares_weight_operand

    bf16 = torch.bfloat16
    assert shares_weight_operand(get_recipe("nvfp4"), 32, 48, bf16)
    assert not shares_weight_operand(get_recipe("nvfp4"), 40, 48, bf16)  # dgrad pads N
    assert not shares_weight_operand(get_recipe("nvfp4"), 32, 56, bf16)  # fprop pads K
    for name in ("ufp4", "e2m1", "mxfp4", "bf16"):  # 1D blocks (and RHT16), or no 4-bit w
        assert not shares_weight_operand(get_recipe(name), 32, 48, bf16), name

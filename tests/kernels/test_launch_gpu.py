"""The cached launch (kernels/launch.py) on a GPU: its hits give the reference's bits.

Every kernel family through `launch` with caching on: the first call of a specialization
goes through Triton (a miss), the next ones through the compiled kernel's launcher (hits),
with other data and other SR seeds than the first: a runtime argument passed wrongly would
show as a mismatch. Run by gpu/kernels_exact.sh (all of tests/kernels on CUDA).
"""

import pytest
import torch
from kernel_assertions import assert_bitwise

from ufp4_megatron import kernels
from ufp4_megatron.kernels import launch as L
from ufp4_megatron.numerics.hadamard import RHT
from ufp4_megatron.numerics.quantize import quantize_view as reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CASES = {  # name -> quantize_view arguments (one per kernel path of dispatch.py)
    "row16 e1m2 rtne+rht16": dict(grid="e1m2", rht=RHT(16, 3)),
    "row16 e1m2 sr+rht16": dict(grid="e1m2", rounding="sr", rht=RHT(16, 3)),
    "row16 e2m1 rtne": dict(grid="e2m1"),
    "generic e2m1 e4m3 2D (tensor amax kernel)": dict(grid="e2m1", scale="e4m3", block_2d=True),
    "generic e2m1 e8m0 block 32": dict(grid="e2m1", scale="e8m0", block=32),
    "generic e1m2 sr rht32": dict(grid="e1m2", rounding="sr", rht=RHT(32, 1)),
}


def _data(seed, rows=257, cols=384):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, cols, generator=g) * 3).to(torch.bfloat16).cuda()


@pytest.fixture
def cached(monkeypatch):
    monkeypatch.setattr(L, "ENABLED", True)
    monkeypatch.setattr(L, "_cache", {})


@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("name", list(CASES))
def test_hits_give_the_reference_bits(cached, name, layout):
    kw = CASES[name]
    for i, seed in enumerate((11, 12, 13)):
        x = _data(seed)
        view = x if layout == "row" else x.t().contiguous().t()
        args = dict(kw, seed=100 + i) if kw.get("rounding") == "sr" else kw
        entries = len(L._cache)
        assert_bitwise(
            kernels.quantize_view(view, **args),
            reference(view, **args),
            f"{name} {layout} call {i}",
        )
        if i:  # same shapes and classes of arguments: no new entry, the launcher ran
            assert len(L._cache) == entries, f"{name}: call {i} missed the cache"
    assert L._cache and all(c is not None for c, _, _ in L._cache.values())


def test_pair_hits_give_the_reference_bits(cached):
    a_kw = dict(grid="e1m2", rounding="sr", rht=RHT(16, 0), keep_padding=True)
    b_kw = dict(grid="e1m2", rht=RHT(16, 0), keep_padding=True)
    for i in range(3):
        dy, x = _data(20 + i, 512, 384), _data(30 + i, 512, 256)
        a, b = dy.t(), x.t()  # wgrad's operands: both along tokens
        qa, qb = kernels.quantize_pair(a, dict(a_kw, seed=7 + i), b, dict(b_kw))
        assert_bitwise(qa, reference(a, **dict(a_kw, seed=7 + i)), f"pair a, call {i}")
        assert_bitwise(qb, reference(b, **b_kw), f"pair b, call {i}")
    assert len(L._cache) == 1  # one pair launch per call, all of one specialization

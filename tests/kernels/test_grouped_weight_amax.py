"""NVFP4's stacked expert weight: its per-expert e4m3 tensor amax taken once for fprop and dgrad.

Both GEMMs quantize w [E, N, K] in 16x16 tiles, unrotated, the same tiles in both layouts
(fprop's rows of the stack [E*N, K], dgrad's columns of its transpose), so each expert's
amax is the same for both. grouped_ops.weight_amax takes it in one read of all experts
(kernels.tensor_amax with the experts' segments) and the grouped experts' autograd function
(megatron/experts.py) hands it to fprop and, saved, to dgrad: each GEMM must get the bits it
gets when it takes its own amax. Runs in Triton's CPU interpreter without a GPU (conftest.py),
on CUDA where there is one.

| test                                          | what                                      |
| per_expert_amax_is_the_reference_segment_amax | kernels.tensor_amax(segments=) == numerics.segments.segment_tensor_amax in both layouts (NaN/Inf expert, zero expert), and what quantize_view takes |
| grouped_gemms_give_their_own_bits             | grouped fprop / dgrad with w_amax == without; a wrong w_amax would show |
| experts_take_w_amax_once_per_chunk            | _GroupedExpertsFn forward + backward bitwise with and without the sharing; w's amax pass once per chunk instead of twice |
| no_amax_where_it_does_not_apply               | UFP4 (no e4m3), the reference path, a tile over two experts: None |
"""

import functools

import pytest
import torch
from grouped_experts_run import count_amax_passes, passes_with_and_without, run_experts
from kernel_assertions import assert_bitwise

from ufp4_megatron import get_recipe, kernels
from ufp4_megatron.numerics.quantize import source
from ufp4_megatron.numerics.scaling import block_amax
from ufp4_megatron.numerics.segments import Segments, segment_tensor_amax
from ufp4_megatron.quant import grouped_ops as G
from ufp4_megatron.quant import ops

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
E, N, K = 3, 32, 48
COUNTS = (5, 0, 40)  # padded to 16 + 0 + 48 = 64 token rows: no w view's shape
NVFP4 = get_recipe("nvfp4")


def _weight(non_finite: bool = False) -> torch.Tensor:
    """[E, N, K] bf16 whose experts need different tensor scales: expert 1 all zeros, expert
    2 40x larger; with non_finite, NaN and Inf tiles in expert 0 (left out of its amax)."""
    g = torch.Generator().manual_seed(7)
    w = torch.randn(E, N, K, generator=g)
    w[1] = 0.0
    w[2] *= 40
    if non_finite:
        w[0, 3, 5] = float("nan")
        w[0, 20, 40] = float("inf")
        w[0, 17, 2] = 4096.0  # larger than the rest, in a finite tile: expert 0's amax
    return w.bfloat16().to(DEVICE)


def _segments(axis: int) -> Segments:
    return Segments(axis, tuple(e * N for e in range(E)), (0,) * E)


def test_per_expert_amax_is_the_reference_segment_amax(monkeypatch):
    import ufp4_megatron.kernels.dispatch as dispatch

    keeps = []
    real = dispatch.launch
    monkeypatch.setattr(
        dispatch, "launch", lambda k, *a, **kw: keeps.append(kw.get("KEEP")) or real(k, *a, **kw)
    )
    w2d = _weight(non_finite=True).reshape(E * N, K)
    fmts = ops.shared_formats("w", w2d, NVFP4)
    amaxes = []
    for axis, (fmt, view) in enumerate(zip(fmts, (w2d, w2d.t()))):
        seg = _segments(axis)
        keeps.clear()
        got = kernels.tensor_amax(view, fmt, segments=seg)
        # segments of rows: reduced in the kernel, by atomic max per 16 rows (KEEP 3); of
        # block columns: a maximum per block column, reduced per segment on the host
        assert keeps == [3 if axis == 0 else 2], keeps
        padded = source(view.cpu(), block=fmt.block, block_2d=fmt.block_2d, rht=fmt.rht)
        per = segment_tensor_amax(block_amax(padded, fmt.block, fmt.block_2d), seg, fmt.block)
        firsts = list(seg.starts) if axis == 0 else [s // fmt.block for s in seg.starts]
        want = per[firsts, 0] if axis == 0 else per[0, firsts]
        assert_bitwise(got.cpu(), want, f"axis {axis}")
        assert_bitwise(
            kernels.quantize_view(view, fmt=fmt, segments=seg, tensor_amax=got),
            kernels.quantize_view(view, fmt=fmt, segments=seg),
            f"quantized, axis {axis}",
        )
        amaxes.append(got)
    assert torch.equal(amaxes[0], amaxes[1])  # the same tiles
    assert amaxes[0][0].item() == 4096.0 and amaxes[0][1].item() == 0.0  # Inf, NaN left out
    w = w2d.view(E, N, K)
    assert torch.equal(G.weight_amax(w, NVFP4, backend="triton"), amaxes[0])


def _tokens(groups: G.ExpertGroups):
    g = torch.Generator().manual_seed(8)
    x = torch.randn(sum(COUNTS), K, generator=g).bfloat16().to(DEVICE)
    dy = torch.randn(sum(COUNTS), N, generator=g).bfloat16().to(DEVICE)
    return groups.pad(x), groups.pad(dy)


def test_grouped_gemms_give_their_own_bits():
    w = _weight()
    groups = G.ExpertGroups(COUNTS, G.token_alignment(NVFP4))
    x, dy = _tokens(groups)
    w_amax = G.weight_amax(w, NVFP4, backend="triton")
    assert w_amax.shape == (E,) and w_amax.dtype == torch.float32
    kw = dict(seed=5, first_expert=2, w_origin=(64, 16), backend="triton", gemm_backend="loop")
    for fn, a in ((G.fprop, x), (G.dgrad, dy)):
        own = fn(a, w, groups, NVFP4, **kw)
        assert torch.equal(fn(a, w, groups, NVFP4, **kw, w_amax=w_amax), own), fn.__name__
        # the amax given is the one used: off by 1.37x (not a power of two, which e4m3's
        # two-level scales absorb) it changes the result
        wrong = fn(a, w, groups, NVFP4, **kw, w_amax=w_amax * 1.37)
        assert not torch.equal(wrong, own), fn.__name__


def _run_experts(shard, monkeypatch, share: bool):
    """y, dx, dw of _GroupedExpertsFn on the kernel path, and the shapes of w's amax passes."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(sum(COUNTS), K, generator=g).bfloat16().to(DEVICE)
    dy = torch.randn(sum(COUNTS), N, generator=g).bfloat16().to(DEVICE)
    groups = G.expert_groups(COUNTS, G.token_alignment(NVFP4))
    grads, passes = run_experts(
        monkeypatch,
        shard,
        NVFP4,
        groups,
        x,
        _weight(),
        dy,
        kernel_calls=("fprop", "dgrad", "weight_amax"),
        off=None if share else {"weight_amax": None},
    )
    chunk_rows = E * N // len(shard.n)
    return grads, [p for p in passes if p in ((chunk_rows, K), (K, chunk_rows))]


@pytest.mark.parametrize("stride", (1, 2))
def test_experts_take_w_amax_once_per_chunk(monkeypatch, stride):
    own_passes, got_passes, chunks = passes_with_and_without(monkeypatch, _run_experts, N, stride)
    assert len(own_passes) == 2 * chunks and len(got_passes) == chunks, (own_passes, got_passes)


def test_no_amax_where_it_does_not_apply():
    w = _weight()
    assert G.weight_amax(w, get_recipe("ufp4"), backend="triton") is None  # fp32 scales
    assert G.weight_amax(w, NVFP4, backend="torch") is None
    if DEVICE == "cpu":  # "auto" takes the reference on the CPU: it takes its own amaxes
        assert G.weight_amax(w, NVFP4) is None
    ragged = w[:, :24].contiguous()  # a 16x16 tile would span two experts: per-expert calls
    assert G.weight_amax(ragged, NVFP4, backend="triton") is None


# ~35-60 s each in the interpreter: in `make test-slow`; make test keeps both stores on the
# dense linear and an NVFP4 MoE training step's (tests/megatron/test_kept_weight_amax.py)
@pytest.mark.slow
@pytest.mark.parametrize("static", (True, False))
def test_experts_keep_w_amax_until_the_weight_changes(monkeypatch, static):
    """The experts' store of their weight's amaxes (megatron/experts._weight_amax) on the
    kernel path, a gated fc1's two chunks (copies of the stacked parameter): over 2 optimizer
    steps of 2 micro-batches, y, dx and dw are bit for bit those made without the store, the
    amax passes run once per chunk per step, not per micro-batch, and static (per-layer
    CUDA graphs: a stood-for capture reads the store) refresh() re-makes them from the
    parameter after each step."""
    from ufp4_megatron.megatron import experts
    from ufp4_megatron.megatron.parallel_gemm import Shard
    from ufp4_megatron.quant import weight_cache
    from ufp4_megatron.quant.weight_cache import WeightOperands

    shard = Shard.column(rank=1, world=2, n_local=N, stride=2)
    groups = G.expert_groups(COUNTS, G.token_alignment(NVFP4))
    chunk_rows = E * N // 2
    for name in ("fprop", "dgrad", "weight_amax"):
        monkeypatch.setattr(G, name, functools.partial(getattr(G, name), backend="triton"))
    passes = count_amax_passes(monkeypatch)

    def train(store, static=False):
        weight = torch.nn.Parameter(_weight())
        opt = torch.optim.SGD([weight], lr=0.1)
        layer = torch.nn.Module()
        layer.weight_amaxes = store
        if static:
            weight_cache.make_static(layer)
        out, made = [], []
        for step in range(2):
            for micro in range(2):
                inside = static and (step > 0 or micro > 0)
                monkeypatch.setattr(weight_cache, "_capture_tag", lambda i=inside: 1 if i else -1)
                g = torch.Generator().manual_seed(10 * step + micro)
                x = torch.randn(sum(COUNTS), K, generator=g).bfloat16().to(DEVICE)
                dy = torch.randn(sum(COUNTS), N, generator=g).bfloat16().to(DEVICE)
                x.requires_grad_()
                passes.clear()
                y = experts._GroupedExpertsFn.apply(
                    x, weight, None, NVFP4, 11, 2, groups, shard, False, None, store
                )
                y.backward(dy)
                made.append(sum(p in ((chunk_rows, K), (K, chunk_rows)) for p in passes))
                out += [y.detach(), x.grad]
            out.append(weight.grad.clone())
            opt.step()
            opt.zero_grad()
            with torch.no_grad():
                weight.mul_(1.37)  # no power of two: e4m3's two-level scales would absorb it
            if static:
                passes.clear()
                assert weight_cache.refresh(layer) == 2
                made.append(len(passes))
        return out, made

    own, own_made = train(None)
    got, made = train(WeightOperands(), static)
    assert all(torch.equal(a, b) for a, b in zip(got, own))
    assert own_made == [2, 2, 2, 2]
    assert made == ([2, 0, 2, 0, 0, 2] if static else [2, 0, 2, 0]), made

"""NVFP4's grouped x and dY: each expert's e4m3 tensor amax for both GEMMs from one read.

x is quantized for fprop (1x16 blocks along K) and for wgrad (1x16 blocks along tokens, RHT16),
dY for dgrad (along N) and wgrad (along tokens, RHT16), each expert's tokens with their own
tensor scale. kernels.tensor_amax_pair(..., starts=) takes both layouts' per-expert amaxes in
one pass of the 16-tensor pair kernel, which reduces them per expert itself (atomic max);
grouped_ops.input_amaxes gives them to the GEMMs and the experts' autograd function
(megatron/experts.py) takes x's pair in forward and dY's in backward. Each GEMM must get the
bits it gets when it takes its own amax. Runs in Triton's CPU interpreter without a GPU
(conftest.py), on CUDA where there is one (where the atomics of many programs meet).

| test                                      | what                                         |
| segment_pair_is_the_reference             | both rows of the [2, E] pair == numerics.segments.segment_tensor_amax of each layout (NaN/Inf, empty and all-zero experts, many programs per expert), == kernels.tensor_amax(segments=), and what quantize_view takes |
| pair_without_segments_unchanged           | starts=(0,): the same amax as the pair without segments |
| no_segment_pair_where_it_does_not_apply   | starts off the 16-row grid, the generic kernel, UFP4, the reference path: None |
| grouped_gemms_give_their_own_bits         | grouped fprop / dgrad / wgrad with the amaxes == without; a wrong one would show |
| experts_take_the_pairs                    | _GroupedExpertsFn bitwise with and without the pairs; no single x or dY amax pass left with one chunk |
| grouped_linear_takes_each_amax_once       | grouped_linear (the library's) bitwise with and without the sharing: one amax pass of w, none of x or dY, instead of two each |
"""

import pytest
import torch
from grouped_experts_run import count_amax_passes, passes_with_and_without, run_experts, turn_off
from kernel_assertions import assert_bitwise

from ufp4_megatron import get_recipe, kernels
from ufp4_megatron.numerics.quantize import source
from ufp4_megatron.numerics.scaling import block_amax
from ufp4_megatron.numerics.segments import Segments, segment_tensor_amax
from ufp4_megatron.quant import grouped_ops as G
from ufp4_megatron.quant import ops

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
NVFP4 = get_recipe("nvfp4")
E, N, K = 4, 64, 80
COUNTS = (40, 0, 150, 3)  # padded to 48 + 0 + 160 + 16 = 224 token rows


def _groups() -> G.ExpertGroups:
    return G.expert_groups(COUNTS, G.token_alignment(NVFP4))


def _tokens(cols: int, seed: int, special: bool = False) -> torch.Tensor:
    """[224, cols] bf16 in the padded layout: each expert at its own scale (expert 2 2^12
    larger, expert 3 all zeros); with `special`, NaN and Inf in expert 0 (left out of its
    amaxes, each in one layout's block) beside a finite maximum."""
    groups = _groups()
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(groups.total, cols, generator=g)
    x[40:190] *= 4096.0
    x[190:] = 0.0
    if special:
        x[3, 5], x[20, cols - 1] = float("nan"), float("-inf")
        x[33, 11] = 2.0**20  # expert 0's largest, a finite block in both layouts
    return groups.pad(x.bfloat16().to(DEVICE))


def _reference(view: torch.Tensor, fmt, seg: Segments) -> torch.Tensor:
    """numerics' amax of each segment: the value at its first position (its block column's
    with column segments), 0 for a segment without positions."""
    padded = source(view.cpu(), block=fmt.block, block_2d=fmt.block_2d, rht=fmt.rht)
    per = segment_tensor_amax(block_amax(padded, fmt.block, fmt.block_2d), seg, fmt.block)
    per = per[:, 0] if seg.axis == 0 else per[0, :]
    step = 1 if seg.axis == 0 else fmt.block
    ends = (*seg.starts[1:], view.shape[seg.axis])
    return torch.stack(
        [per[s // step] if t > s else per.new_zeros(()) for s, t in zip(seg.starts, ends)]
    )


# wide x: two programs along the columns, the second over a partial tile (128 + 16 columns);
# dY's layouts (~20 s) in make test-slow, beside x's of the same kernel
@pytest.mark.parametrize(
    "name, cols", (("x", K), pytest.param("dy", N, marks=pytest.mark.slow), ("wide x", 144))
)
def test_segment_pair_is_the_reference(name, cols):
    t = _tokens(cols, seed=cols, special=True)
    starts = _groups().padded_starts
    fmts = ops.shared_formats(name.split()[-1], t, NVFP4)
    pair = kernels.tensor_amax_pair(t, *fmts, starts=starts)
    assert pair.shape == (2, E) and pair.dtype == torch.float32
    for axis, (fmt, view) in enumerate(zip(fmts, (t, t.t()))):
        seg = Segments(axis, starts, (0,) * E)
        want = _reference(view, fmt, seg)
        # expert 1 owns no rows and expert 3 only zeros: both amaxes 0
        assert want[1].item() == 0.0 and want[3].item() == 0.0
        assert want[0].item() == 2.0**20 if axis == 0 else want[0].item() > 0
        assert_bitwise(pair[axis].cpu(), want, f"{name}, axis {axis}")
        assert_bitwise(pair[axis], kernels.tensor_amax(view, fmt, segments=seg), f"axis {axis}")
        assert_bitwise(
            kernels.quantize_view(view, fmt=fmt, segments=seg, tensor_amax=pair[axis]),
            kernels.quantize_view(view, fmt=fmt, segments=seg),
            f"quantized, {name}, axis {axis}",
        )


def test_pair_without_segments_unchanged():
    t = _tokens(K, seed=3, special=True)
    fmts = ops.shared_formats("x", t, NVFP4)
    whole = kernels.tensor_amax_pair(t, *fmts)
    one = kernels.tensor_amax_pair(t, *fmts, starts=(0,))
    assert_bitwise(one[:, 0], whole, "one segment")


def test_no_segment_pair_where_it_does_not_apply():
    t = _tokens(K, seed=4)
    fmts = ops.shared_formats("x", t, NVFP4)
    assert kernels.tensor_amax_pair(t, *fmts, starts=(0, 40, 208)) is None  # 40: off the grid
    assert kernels.tensor_amax_pair(t, *fmts, starts=(0, 48), generic=True) is None
    assert ops.shared_formats("x", t, get_recipe("ufp4")) is None  # fp32 scales
    groups = _groups()
    assert G.input_amaxes("x", t, groups, get_recipe("ufp4"), backend="triton") == (None, None)
    assert G.input_amaxes("x", t, groups, NVFP4, backend="torch") == (None, None)
    # the 2D-tile format of a weight takes no token segments
    w_fmts = ops.shared_formats("w", t, NVFP4)
    assert kernels.tensor_amax_pair(t, *w_fmts, starts=(0, 48)) is None


# ~70 s in the interpreter: in `make test-slow`; make test has experts_take_the_pairs[1] and
# grouped_linear_takes_each_amax_once, both bit for bit with and without the given amaxes
@pytest.mark.slow
def test_grouped_gemms_give_their_own_bits():
    groups = _groups()
    x, dy = _tokens(K, seed=5, special=True), _tokens(N, seed=6)
    w = (torch.randn(E, N, K, generator=torch.Generator().manual_seed(7))).bfloat16().to(DEVICE)
    x_amax = G.input_amaxes("x", x, groups, NVFP4, backend="triton")
    dy_amax = G.input_amaxes("dy", dy, groups, NVFP4, backend="triton")
    assert all(a is not None and a.shape == (E,) for a in (*x_amax, *dy_amax))
    kw = dict(seed=5, first_expert=2, backend="triton", gemm_backend="loop")
    calls = (
        (G.fprop, (x, w), dict(x_amax=x_amax[0]), "x_amax"),
        (G.dgrad, (dy, w), dict(dy_amax=dy_amax[0]), "dy_amax"),
        (G.wgrad, (dy, x), dict(dy_amax=dy_amax[1], x_amax=x_amax[1]), None),
    )
    for fn, args, given, one in calls:
        own = fn(*args, groups, NVFP4, **kw)  # x's NaN and Inf make NaN rows or columns
        assert_bitwise(fn(*args, groups, NVFP4, **kw, **given), own, fn.__name__)
        # each amax given is the one used: off by 1.37x (not a power of two, which e4m3's
        # two-level scales absorb) it changes the result
        for key in [one] if one else list(given):
            wrong = fn(*args, groups, NVFP4, **kw, **{**given, key: given[key] * 1.37})
            assert not _same(wrong, own), key


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal, NaN where the other is NaN."""
    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(a[~nan], b[~nan])


def _run_experts(shard, monkeypatch, share: bool):
    """y, dx, dw of _GroupedExpertsFn with every grouped call on the kernel path, and the
    shapes of the single amax passes of x and dY."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(sum(COUNTS), K, generator=g).bfloat16().to(DEVICE)
    w = torch.randn(E, N, K, generator=g).bfloat16().to(DEVICE)
    dy = torch.randn(sum(COUNTS), N, generator=g).bfloat16().to(DEVICE)
    groups = _groups()
    calls = ("fprop", "dgrad", "wgrad", "input_operand", "weight_amax", "input_amaxes")
    off = None if share else {"input_amaxes": (None, None)}
    grads, passes = run_experts(
        monkeypatch, shard, NVFP4, groups, x, w, dy, kernel_calls=calls, off=off
    )
    return grads, [p for p in passes if groups.padded_total in p]


# stride 2 (~85 s in the interpreter) is in `make test-slow`; make test has stride 1 and
# test_grouped_weight_amax.py's test_experts_take_w_amax_once_per_chunk[2] for the chunks
@pytest.mark.parametrize("stride", (1, pytest.param(2, marks=pytest.mark.slow)))
def test_experts_take_the_pairs(monkeypatch, stride):
    own_passes, got_passes, chunks = passes_with_and_without(monkeypatch, _run_experts, N, stride)
    # x for fprop and wgrad, each chunk of dY for dgrad and wgrad
    assert len(own_passes) == 2 + 2 * chunks, own_passes
    if chunks == 1:  # both pairs taken: no single pass of x or dY left
        assert got_passes == [], got_passes
    else:  # a strided shard makes x's operands once, and copies dY's chunks per GEMM
        assert len(got_passes) == len(own_passes), got_passes


def _grouped_linear(monkeypatch, off):
    """y, dx, dw of grouped_ops.grouped_linear (backend "triton") and its single amax passes."""
    g = torch.Generator().manual_seed(10)
    x = torch.randn(sum(COUNTS), K, generator=g).bfloat16().to(DEVICE).requires_grad_()
    w = torch.randn(E, N, K, generator=g).bfloat16().to(DEVICE).requires_grad_()
    dy = torch.randn(sum(COUNTS), N, generator=g).bfloat16().to(DEVICE)
    turn_off(monkeypatch, off)
    passes = count_amax_passes(monkeypatch)
    y = G.grouped_linear(x, w, None, COUNTS, NVFP4, seed=4, backend="triton")
    y.backward(dy)
    monkeypatch.undo()
    return (y.detach(), x.grad, w.grad), passes


def test_grouped_linear_takes_each_amax_once(monkeypatch):
    own, own_passes = _grouped_linear(
        monkeypatch, {"input_amaxes": (None, None), "weight_amax": None}
    )
    got, got_passes = _grouped_linear(monkeypatch, None)
    for what, a, b in zip(("y", "dx", "dw"), got, own):
        assert torch.equal(a, b), what
    rows = _groups().padded_total
    assert len(own_passes) == 6, own_passes  # x, dY and w, two GEMMs each
    assert got_passes == [(E * N, K)], got_passes  # w's, for fprop and dgrad
    assert all(rows in p for p in own_passes if p not in ((E * N, K), (K, E * N)))

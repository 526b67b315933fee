"""Grouped expert GEMMs on the kernel path, bit for bit against the per-expert twin.

The grouped path quantizes each operand of all experts in one kernel launch (the stacked
weight, the padded token matrix in both layouts), with SR keyed per expert segment
(`segments=`: kernels/segments_triton.py); the twin runs `ops` one expert at a time, on each
padded segment, through per-expert launches with one seed each. Both products go through the
same loop of matmuls (`gemm_backend="loop"`) on operands of the same memory layout (the
kernels return column-wise operands as transposed views, the reference contiguous ones, and a
bf16 matmul's summation order may depend on the layout), so equal operands give equal results
bit for bit: a block crossing an expert, a wrong SR key or a lost padding row shows as a
difference. That the segment-keyed launches equal the torch reference is checked on the
operands themselves (segment_kernels_match_reference, and at full size on the GPU).
Runs in Triton's CPU interpreter without a GPU (conftest.py), on CUDA where there is one
(gpu/perf.sh runs this file). On the CPU, make test-slow runs the twin's cases other than UFP4
bf16 with SR on dY, and the e4m3 launch count (make test's 20-minute budget).

| test                                          | what                             | device |
| segment_kernels_match_reference               | segment-keyed SR, row and column segments x row16, col16, generic (block 32, RHT32), pair launches vs numerics.quantize_view(segments=) | interpreter / CUDA |
| kernels_refuse_segments_off_16                | strict names it; auto falls back to the reference | interpreter / CUDA |
| grouped_kernel_path_matches_per_expert_twin   | ufp4 (16-tensor kernels, SR on dY / on every operand, bf16 and fp16), e2m1, nvfp4 (e4m3 per expert, 2D weight tiles), mxfp4 (block 32: generic rows, 16-tensor columns with expert segments) | interpreter / CUDA |
| e4m3_segments_match_reference                 | nvfp4's per-expert tensor scales in one launch (row, col x 1x16, 16x16 tiles, RHT16, SR) vs numerics.quantize_view(segments=) | interpreter / CUDA |
| grouped_e4m3_launches_do_not_grow_with_experts | nvfp4 grouped fprop/dgrad/wgrad: the same launches for 2 experts as for 6 | interpreter / CUDA |
| grouped_e4m3_tiles_over_two_experts_fall_back | N = 24: a 16x16 weight tile would span two experts; per-expert calls, equal to the twin | interpreter / CUDA |
| gpu_grouped_mm_matches_loop                   | bf16, ufp4: torch._grouped_mm (CUTLASS) vs cuBLAS per expert, fp32 accumulation order only | CUDA, bf16 |
| gpu_grouped_sr_is_per_expert                  | ufp4 SR (dY, every operand) at 1792x2048 experts: segment-keyed operands == reference, grouped == twin bitwise; an expert's dX rows and dW unchanged (bitwise; within bf16 ulps through torch._grouped_mm) when other experts' token counts change or experts split over two calls | CUDA |
"""

import pytest
import torch
from kernel_assertions import assert_bitwise

from ufp4_megatron import get_recipe, kernels
from ufp4_megatron.numerics.hadamard import RHT
from ufp4_megatron.numerics.quantize import quantize_view as reference
from ufp4_megatron.numerics.segments import Segments
from ufp4_megatron.quant import grouped_ops as G
from ufp4_megatron.quant.fake_quant import quantize_view as dispatch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _data(counts, e, n, k, seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    m = sum(counts)
    mk = lambda *s: torch.randn(*s, generator=g).to(dtype).to(DEVICE)
    return mk(m, k), mk(e, n, k), mk(m, n)


STARTS, SEEDS = (0, 16, 16, 48), (11, 2**62 + 5, 33, 7)  # segment 1 is empty
# (layout, quantize_view options): which kernel family runs
FAMILIES = {
    "row16": ("row", dict(rht=RHT(16, 1))),
    "col16": ("col", dict(rht=RHT(16, 1))),
    "col32": ("col", dict(block=32, rht=RHT(16, 1))),
    "row16_plain": ("row", {}),
    "generic_block32": ("row", dict(block=32)),
    "generic_rht32_col": ("col", dict(rht=RHT(32, 2))),
}


@pytest.mark.parametrize("axis", (0, 1))
@pytest.mark.parametrize("family", FAMILIES)
def test_segment_kernels_match_reference(family, axis):
    layout, kw = FAMILIES[family]
    g = torch.Generator().manual_seed(axis)
    x = torch.randn(64, 72, generator=g).bfloat16().to(DEVICE)
    view = x if layout == "row" else x.t().contiguous().t()  # col: a transposed view
    unit = 32 if kw.get("block") == 32 or kw.get("rht", RHT(16, 0)).size == 32 else 16
    starts = STARTS if axis == 0 else tuple(s * unit // 16 for s in STARTS)
    view = view[:, : 4 * unit] if axis == 1 else view
    args = dict(rounding="sr", origin=(3, 8), segments=Segments(axis, starts, SEEDS), **kw)
    assert_bitwise(
        kernels.quantize_view(view, "e1m2", **args),
        reference(view, "e1m2", **args),
        f"{family} axis {axis}",
    )


def test_segment_pair_and_generic_launches_match_reference():
    g = torch.Generator().manual_seed(5)
    a = torch.randn(64, 48, generator=g).bfloat16().to(DEVICE)
    b = torch.randn(32, 64, generator=g).bfloat16().to(DEVICE)
    rht = RHT(16, 1)
    ka = dict(grid="e1m2", rounding="sr", rht=rht, segments=Segments(0, STARTS, SEEDS))
    kb = dict(
        grid="int4",
        rounding="sr",
        rht=rht,
        origin=(16, 4),
        segments=Segments(1, STARTS[:3], SEEDS[:3]),
    )
    qa, qb = kernels.quantize_pair(a, ka, b.t(), kb)  # row job + column job, one launch
    assert_bitwise(qa, reference(a, **ka), "pair a")
    assert_bitwise(qb, reference(b.t(), **kb), "pair b")
    kc = dict(kb, segments=Segments(1, STARTS, SEEDS))
    row = kernels.quantize_view(a, **dict(ka, rht=RHT(32, 3)))  # RHT32: the generic kernel
    col = kernels.quantize_view(a.t(), **dict(kc, rht=RHT(32, 3), block=32))
    assert_bitwise(row, reference(a, **dict(ka, rht=RHT(32, 3))), "generic row")
    assert_bitwise(col, reference(a.t(), **dict(kc, rht=RHT(32, 3), block=32)), "generic col")


def test_kernels_refuse_segments_off_16():
    x = torch.randn(48, 32).bfloat16().to(DEVICE)
    kw = dict(rounding="sr", segments=Segments(0, (0, 8), (1, 2)))
    assert "multiples of 16" in kernels.unsupported(x, "e1m2", **kw)
    with pytest.raises(ValueError, match="starts must be multiples of 16"):
        kernels.quantize_view(x, "e1m2", **kw)
    assert torch.equal(dispatch(x, "e1m2", **kw), reference(x, "e1m2", **kw))  # auto: reference
    assert kernels.supports(x, "e1m2", **dict(kw, rounding="rtne"))  # RTNE ignores segments


@pytest.mark.parametrize("axis", (0, 1))
@pytest.mark.parametrize(
    "layout,kw",
    [
        ("row", {}),
        ("col", dict(rht=RHT(16, 1))),
        ("row", dict(block_2d=True)),
        ("col", dict(block_2d=True)),
        ("col", dict(rht=RHT(16, 1), rounding="sr")),
    ],
)
def test_e4m3_segments_match_reference(layout, kw, axis):
    g = torch.Generator().manual_seed(3 + axis)
    # ragged: the kernels' program grids overhang the view (the amax kernel's padding rows
    # and block columns must not reach a segment's maximum)
    x = torch.randn(*((57, 80) if axis == 0 else (40, 96)), generator=g).bfloat16()
    if axis == 0:
        x[16:] *= 40  # the experts' ranges differ: each needs its own tensor scale
    else:
        x[:, 16:] *= 40
    x[20, 20] = float("nan")  # a NaN block of one expert: its block alone
    x = x.to(DEVICE)
    view = x if layout == "row" else x.t().contiguous().t()
    args = dict(scale="e4m3", segments=Segments(axis, STARTS, SEEDS), origin=(0, 8), **kw)
    got, want = kernels.quantize_view(view, "e2m1", **args), reference(view, "e2m1", **args)
    assert_bitwise(got, want, f"{layout} {kw} axis {axis}")
    assert not torch.equal(
        want.nan_to_num(), reference(view, "e2m1", **dict(args, segments=None)).nan_to_num()
    )  # a segment's scale is not the view's


def _launches(monkeypatch):
    """The names of the kernels dispatch.py launches from now on (each still runs)."""
    from ufp4_megatron.kernels import dispatch

    names, real = [], dispatch.launch

    def counted(kernel, grid, *args, **kwargs):
        names.append(getattr(kernel, "__name__", getattr(kernel, "fn", kernel).__name__))
        return real(kernel, grid, *args, **kwargs)

    monkeypatch.setattr(dispatch, "launch", counted)
    return names


# slow (kept out of make test's 20 minutes): a launch count, for speed on the GPU, where
# gpu/perf.sh runs it; NVFP4's segment kernels and its per-expert fallback stay in make test
# (test_e4m3_segments_match_reference, test_grouped_e4m3_tiles_over_two_experts_fall_back)
@pytest.mark.slow
def test_grouped_e4m3_launches_do_not_grow_with_experts(monkeypatch):
    """NVFP4's experts share each operand's launches (one expert at a time makes its MoE step
    several times BF16's on an H200: a launch per expert and operand, host-bound)."""
    names = _launches(monkeypatch)
    r = get_recipe("nvfp4")
    seen = {}
    for counts in ((7, 33), (0, 7, 33, 5, 16, 1)):
        x, w, dy = _data(counts, len(counts), 32, 32, seed=1)
        g = G.ExpertGroups(counts, G.token_alignment(r))
        x, dy = g.pad(x), g.pad(dy)
        names.clear()
        for fn, args in ((G.fprop, (x, w)), (G.dgrad, (dy, w)), (G.wgrad, (dy, x))):
            fn(*args, g, r, seed=5, backend="triton", gemm_backend="loop")
        seen[len(counts)] = list(names)
    assert seen[2] == seen[6] and len(seen[2]) == 12, seen  # amax + QDQ per operand


def test_grouped_e4m3_tiles_over_two_experts_fall_back():
    counts, n, k = (7, 33), 24, 32  # w [2 x 24, 32]: a 16x16 tile would span two experts
    r = get_recipe("nvfp4")
    x, w, _dy = _data(counts, len(counts), n, k, seed=2)
    g = G.ExpertGroups(counts, G.token_alignment(r))
    x = g.pad(x)
    got = G.fprop(x, w, g, r, seed=3, backend="triton", gemm_backend="loop")
    assert torch.equal(got, G.reference_fprop(x, w, g, r, seed=3, backend="triton"))


# make test keeps UFP4 as trained (bf16, SR on dY); SR on every operand, fp16 and the other
# recipes run in `make test-slow` (interpreted kernels, 20-56 s each, kept out of make test's
# 20 minutes). Their kernels against the reference, segment-keyed SR included:
# segment_kernels_match_reference, e4m3_segments_match_reference and test_quantize_triton.py
# (fp16 too), all in make test.
@pytest.mark.parametrize(
    "name,overrides,dtype",
    [
        ("ufp4", {}, torch.bfloat16),
        pytest.param("ufp4", {"sr": ("dy", "x", "w")}, torch.bfloat16, marks=pytest.mark.slow),
        pytest.param("ufp4", {}, torch.float16, marks=pytest.mark.slow),
        pytest.param("e2m1", {}, torch.bfloat16, marks=pytest.mark.slow),
        pytest.param("nvfp4", {}, torch.bfloat16, marks=pytest.mark.slow),
        pytest.param("mxfp4", {"sr": ("dy", "x", "w")}, torch.bfloat16, marks=pytest.mark.slow),
    ],
)
def test_grouped_kernel_path_matches_per_expert_twin(name, overrides, dtype):
    counts = (0, 7, 33) if DEVICE == "cpu" else (0, 300, 1, 517, 64)
    e, n, k = len(counts), 64, 96
    r = get_recipe(name, **overrides)
    x, w, dy = _data(counts, e, n, k, seed=len(name), dtype=dtype)
    g = G.ExpertGroups(counts, G.token_alignment(r))
    x, dy = g.pad(x), g.pad(dy)
    for fn, ref, args, origins in (
        (G.fprop, G.reference_fprop, (x, w), dict(x_origin=(0, 32), w_origin=(64, 32))),
        (G.dgrad, G.reference_dgrad, (dy, w), dict(dy_origin=(0, 64), w_origin=(64, 32))),
        (G.wgrad, G.reference_wgrad, (dy, x), dict(dy_origin=(0, 64), x_origin=(0, 32))),
    ):
        got = fn(
            *args, g, r, seed=77, first_expert=3, backend="triton", gemm_backend="loop", **origins
        )
        want = ref(*args, g, r, seed=77, first_expert=3, backend="triton", **origins)
        assert torch.equal(got, want), f"{name} {overrides} {fn.__name__}"


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device")
@pytest.mark.parametrize("name", ("bf16", "ufp4"))
def test_gpu_grouped_mm_matches_loop(name):
    counts = (0, 300, 1, 517, 64, 2048)
    e, n, k = len(counts), 1792, 2048
    r = get_recipe(name)
    x, w, dy = _data(counts, e, n, k, seed=3)
    g = G.ExpertGroups(counts, G.token_alignment(r))
    x, dy = g.pad(x), g.pad(dy)
    for fn, args in ((G.fprop, (x, w)), (G.dgrad, (dy, w)), (G.wgrad, (dy, x))):
        fused = fn(*args, g, r, seed=5).float()
        loop = fn(*args, g, r, seed=5, gemm_backend="loop").float()
        # bf16 outputs of fp32 sums taken in another order: within a few bf16 ulps
        assert ((fused - loop).abs() <= 2**-6 * loop.abs() + 1e-2).all(), fn.__name__
        if fn is G.wgrad:
            assert torch.equal(fused[0], torch.zeros_like(fused[0]))


def _expert_backward(recipe, counts, toks, w, dys, *, first_expert=0, gemm_backend):
    """Per local expert: (dX rows, dW) of grouped dgrad and wgrad on these counts."""
    g = G.ExpertGroups(counts, G.token_alignment(recipe))
    x = g.pad(torch.cat([t[:c] for t, c in zip(toks, counts)]))
    dy = g.pad(torch.cat([d[:c] for d, c in zip(dys, counts)]))
    kw = dict(seed=2024, first_expert=first_expert, gemm_backend=gemm_backend)
    dx, dw = G.dgrad(dy, w, g, recipe, **kw), G.wgrad(dy, x, g, recipe, **kw)
    return [(dx[s : s + c], dw[e]) for e, (s, c) in enumerate(zip(g.padded_starts, counts))]


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device")
@pytest.mark.parametrize("sr", (("dy",), ("dy", "x", "w")))
def test_gpu_grouped_sr_is_per_expert(sr):
    """The grouped SR path with the real kernels: equal to the per-expert twin bit for bit,
    and each expert's results independent of the other experts' token counts and of how the
    experts are split over calls (EP ranks)."""
    r = get_recipe("ufp4", sr=sr)
    counts = (0, 300, 1, 517, 64, 2048)
    e, n, k = len(counts), 1792, 2048
    x, w, dy = _data(counts, e, n, k, seed=9)
    g = G.ExpertGroups(counts, G.token_alignment(r))
    xp, dyp = g.pad(x), g.pad(dy)
    for fn, ref, args in (
        (G.fprop, G.reference_fprop, (xp, w)),
        (G.dgrad, G.reference_dgrad, (dyp, w)),
        (G.wgrad, G.reference_wgrad, (dyp, xp)),
    ):
        got = fn(*args, g, r, seed=31, first_expert=6, backend="triton", gemm_backend="loop")
        want = ref(*args, g, r, seed=31, first_expert=6, backend="triton")
        assert torch.equal(got, want), fn.__name__
    # the segment-keyed launches themselves, against the torch reference: dY row-wise (dgrad)
    # and column-wise (wgrad), expert segments at the padded starts
    seeds = tuple(range(101, 101 + e))
    for view, axis in ((dyp, 0), (dyp.t(), 1)):
        kw = dict(
            rounding="sr",
            rht=RHT(16, r.rht_seed),
            origin=(0, 64),
            segments=Segments(axis, g.padded_starts, seeds),
        )
        assert_bitwise(
            kernels.quantize_view(view, "e1m2", **kw),
            reference(view, "e1m2", **kw),
            f"segments axis {axis}",
        )

    gen = torch.Generator().manual_seed(4)
    toks = [torch.randn(2048, k, generator=gen).bfloat16().to(DEVICE) for _ in range(e)]
    dys = [torch.randn(2048, n, generator=gen).bfloat16().to(DEVICE) for _ in range(e)]
    for backend in ("loop", "auto"):  # per-expert cuBLAS; torch._grouped_mm (CUTLASS)
        base = _expert_backward(r, counts, toks, w, dys, gemm_backend=backend)
        others = [
            _expert_backward(r, (700, 300, 0, 517, 64, 5), toks, w, dys, gemm_backend=backend),
            _expert_backward(r, counts[:3], toks[:3], w[:3], dys[:3], gemm_backend=backend)
            + _expert_backward(
                r, counts[3:], toks[3:], w[3:], dys[3:], first_expert=3, gemm_backend=backend
            ),
        ]
        for other in others:
            for ex in (1, 3, 4):  # experts whose own tokens are unchanged
                for got, want in zip(other[ex], base[ex]):
                    if backend == "loop":
                        assert torch.equal(got, want), (backend, ex)
                    else:  # CUTLASS may pick another tile shape for other group sizes
                        got, want = got.float(), want.float()
                        assert ((got - want).abs() <= 2**-6 * want.abs() + 1e-2).all(), ex

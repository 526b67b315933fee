"""Grouped expert GEMMs on the kernel path, bit for bit against the per-expert twin.

The grouped path quantizes each operand of all experts in one kernel launch (the stacked
weight, the padded token matrix in both layouts); the twin runs `ops` one expert at a time,
on each padded segment, on the torch reference (`backend="torch"`). Both products go through the same loop
of matmuls (`gemm_backend="loop"`), so equal operands give equal results bit for bit: a
block crossing an expert, a wrong SR key or a lost padding row shows as a difference.
Runs in Triton's CPU interpreter without a GPU (conftest.py), on CUDA where there is one.

| test                                          | recipes                          | device |
| grouped_kernel_path_matches_per_expert_twin   | ufp4 (16-tensor kernels, SR), e2m1, nvfp4 (e4m3 per expert, 2D weight tiles), mxfp4 (block 32, generic kernel) | interpreter / CUDA |
| gpu_grouped_mm_matches_loop                   | bf16, ufp4: torch._grouped_mm (CUTLASS) vs cuBLAS per expert, fp32 accumulation order only | CUDA, bf16 |
"""
import pytest
import torch

from ufp4_megatron import get_recipe
from ufp4_megatron import grouped_ops as G

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _data(counts, e, n, k, seed):
    g = torch.Generator().manual_seed(seed)
    m = sum(counts)
    mk = lambda *s: torch.randn(*s, generator=g).bfloat16().to(DEVICE)  # noqa: E731
    return mk(m, k), mk(e, n, k), mk(m, n)


@pytest.mark.parametrize("name", ("ufp4", "e2m1", "nvfp4", "mxfp4"))
def test_grouped_kernel_path_matches_per_expert_twin(name):
    counts = (0, 7, 33) if DEVICE == "cpu" else (0, 300, 1, 517, 64)
    e, n, k = len(counts), 64, 96
    r = get_recipe(name)
    x, w, dy = _data(counts, e, n, k, seed=len(name))
    g = G.ExpertGroups(counts, G.token_alignment(r))
    x, dy = g.pad(x), g.pad(dy)
    for fn, ref, args, origins in (
            (G.fprop, G.reference_fprop, (x, w), dict(x_origin=(0, 32), w_origin=(64, 32))),
            (G.dgrad, G.reference_dgrad, (dy, w), dict(dy_origin=(0, 64), w_origin=(64, 32))),
            (G.wgrad, G.reference_wgrad, (dy, x), dict(dy_origin=(0, 64), x_origin=(0, 32)))):
        got = fn(*args, g, r, seed=77, backend="triton", gemm_backend="loop", **origins)
        want = ref(*args, g, r, seed=77, backend="torch", **origins)
        assert torch.equal(got, want), f"{name} {fn.__name__}"


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
        assert ((fused - loop).abs() <= 2 ** -6 * loop.abs() + 1e-2).all(), fn.__name__
        if fn is G.wgrad:
            assert torch.equal(fused[0], torch.zeros_like(fused[0]))

"""Grouped expert GEMMs (ufp4_megatron.grouped_ops) against their per-expert twin.

Contracts:
- test_grouped_gemms_equal_per_expert_reference_bitwise: for every preset recipe, fp32 and
  bf16, with an empty expert, token counts that are not multiples of the block, and
  tensor-parallel shard origins, grouped fprop/dgrad/wgrad on the padded token layout equal
  the per-expert loop through `ops` on each padded segment exactly (RTNE and SR: SR keys are
  padded token positions, passed as origins by the twin);
- test_torch_grouped_mm_equals_the_loop_bitwise: torch._grouped_mm (where torch has it on
  this device) equals the loop of matmuls it replaces, both layouts, empty groups included;
- test_sr_bits_follow_the_seed: another seed moves SR-rounded gradients, the same seed
  reproduces them (the comparison above is not trivially passing);
- test_zero_token_expert_wgrad_is_exactly_zero, test_no_tokens_at_all;
- test_padding_layout: each expert's tokens start a segment that is a multiple of `align`,
  unpad(pad(t)) == t;
- test_grouped_linear_autograd: bf16 == per-expert F.linear exactly (y, dx, dW, db); RTNE
  UFP4 == per-expert quantized_linear exactly;
- errors: SR weights, expert sizes that split a block, wrong wgrad padding, bad backend,
  inconsistent shapes/counts.
"""
import pytest
import torch

from ufp4_megatron import get_recipe, list_recipes, quantized_linear
from ufp4_megatron import grouped_ops as G

COUNTS = (0, 5, 17, 42)  # an empty expert; no count a multiple of 16
E, K, N = 4, 64, 96


def _data(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    M = sum(COUNTS)
    mk = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    return mk(M, K), mk(E, N, K) * K ** -0.5, mk(M, N)


def _groups(recipe):
    return G.ExpertGroups(COUNTS, G.token_alignment(recipe))


def _padded(recipe, dtype, seed=0):
    """groups and x, w, dy with x and dy in the padded token layout."""
    x, w, dy = _data(dtype, seed)
    g = _groups(recipe)
    return g, g.pad(x), w, g.pad(dy)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("name", list_recipes())
def test_grouped_gemms_equal_per_expert_reference_bitwise(name, dtype):
    r = get_recipe(name)
    g, x, w, dy = _padded(r, dtype)
    # a TP shard's origins: column chunk at n0 = 32, row shard at k0 = 64
    kw = dict(seed=1234)
    cases = [
        (G.fprop, G.reference_fprop, (x, w), dict(x_origin=(0, 64), w_origin=(32, 64))),
        (G.dgrad, G.reference_dgrad, (dy, w), dict(dy_origin=(0, 32), w_origin=(32, 64))),
        (G.wgrad, G.reference_wgrad, (dy, x), dict(dy_origin=(0, 32), x_origin=(0, 64))),
    ]
    for fn, ref, args, origins in cases:
        got, want = fn(*args, g, r, **kw, **origins), ref(*args, g, r, **kw, **origins)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want), f"{name} {fn.__name__}"


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="torch without _grouped_mm")
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_torch_grouped_mm_equals_the_loop_bitwise(dtype):
    g, x, w, dy = _padded(get_recipe("bf16"), dtype, seed=1)
    for a, b in ((x, w.transpose(1, 2)), (dy, w), (dy.t(), x)):
        fused = G.grouped_mm(a, b, g, backend="grouped")
        loop = G.grouped_mm(a, b, g, backend="loop")
        assert torch.equal(fused, loop)


def test_sr_bits_follow_the_seed():
    r = get_recipe("ufp4")
    g, x, w, dy = _padded(r, torch.float32, seed=2)
    a, b = G.wgrad(dy, x, g, r, seed=1), G.wgrad(dy, x, g, r, seed=2)
    assert torch.equal(a, G.wgrad(dy, x, g, r, seed=1))
    assert (a - b).abs().max() > 0
    assert (G.dgrad(dy, w, g, r, seed=1) - G.dgrad(dy, w, g, r, seed=2)).abs().max() > 0


@pytest.mark.parametrize("name", ("bf16", "ufp4", "nvfp4"))
def test_zero_token_expert_wgrad_is_exactly_zero(name):
    r = get_recipe(name)
    g, x, _, dy = _padded(r, torch.float32, seed=3)
    dw = G.wgrad(dy, x, g, r, seed=5)
    assert dw.shape == (E, N, K)
    assert torch.equal(dw[0], torch.zeros(N, K)) and dw[1:].abs().amax() > 0


def test_no_tokens_at_all():
    r = get_recipe("ufp4")
    g = G.ExpertGroups((0, 0), 16)
    x, w, dy = torch.zeros(0, K), torch.randn(2, N, K), torch.zeros(0, N)
    assert g.padded_total == 0
    assert G.fprop(x, w, g, r).shape == (0, N)
    assert G.dgrad(dy, w, g, r).shape == (0, K)
    assert torch.equal(G.wgrad(dy, x, g, r), torch.zeros(2, N, K))


def test_padding_layout():
    g = G.ExpertGroups((3, 0, 17, 16), 16)
    assert g.padded_starts == (0, 16, 16, 48) and g.padded_total == 64
    t = torch.arange(36.0).unsqueeze(1)
    p = g.pad(t)
    for s, e, c in zip(g.starts, g.padded_starts, g.counts):
        assert torch.equal(p[e:e + c], t[s:s + c])
    assert p.sum() == t.sum()  # everything else is zero
    assert torch.equal(g.unpad(p), t)
    aligned = t[:48]
    assert G.ExpertGroups((16, 32), 16).pad(aligned) is aligned  # nothing to move: no copy


@pytest.mark.parametrize("with_bias", (False, True))
def test_grouped_linear_autograd(with_bias):
    x, w, dy = _data(torch.float32, seed=4)
    b = torch.randn(E, N) if with_bias else None
    for name in ("bf16", "ufp4"):
        r = get_recipe(name, sr=())  # RTNE: the per-expert reference draws the same bits
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        bs = b.clone().requires_grad_() if with_bias else None
        y = G.grouped_linear(xs, ws, bs, COUNTS, r)
        y.backward(dy)
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        br = b.clone().requires_grad_() if with_bias else None
        starts = G.ExpertGroups(COUNTS).starts
        ys = []
        for e, (s, c) in enumerate(zip(starts, COUNTS)):
            be = br[e] if with_bias else None
            ys.append(torch.nn.functional.linear(xr[s:s + c], wr[e], be) if name == "bf16"
                      else quantized_linear(xr[s:s + c], wr[e], be, r))
        yr = torch.cat(ys)
        yr.backward(dy)
        assert torch.equal(y, yr), name
        assert torch.equal(xs.grad, xr.grad) and torch.equal(ws.grad, wr.grad), name
        if with_bias:
            assert torch.allclose(bs.grad, br.grad, atol=1e-5), name


def test_errors_say_what_to_change():
    r = get_recipe("ufp4")
    g, xp, w, dyp = _padded(r, torch.float32)
    x, _, dy = _data(torch.float32)
    with pytest.raises(ValueError, match="RTNE for weights"):
        G.fprop(xp, w, g, get_recipe("ufp4", sr=("dy", "w")))
    with pytest.raises(ValueError, match="not a multiple of 16"):
        G.fprop(xp[:, :40], w[:, :, :40], g, r)
    with pytest.raises(ValueError, match="token_alignment"):
        g4 = G.ExpertGroups(COUNTS, 4)
        G.wgrad(g4.pad(dy), g4.pad(x), g4, r)
    with pytest.raises(ValueError, match="padded token layout"):
        G.fprop(x, w, g, r)
    with pytest.raises(ValueError, match="unknown grouped GEMM backend"):
        G.fprop(xp, w, g, r, gemm_backend="cutlass")
    with pytest.raises(ValueError, match="one token count per expert"):
        G.grouped_linear(x, w, None, COUNTS[:3], r)
    with pytest.raises(ValueError, match="sum of the counts"):
        G.grouped_linear(x[1:], w, None, COUNTS, r)
    with pytest.raises(ValueError, match="token counts must be >= 0"):
        G.ExpertGroups((3, -1))
    with pytest.raises(TypeError, match="get_recipe"):
        G.grouped_linear(x, w, None, COUNTS, "ufp4")

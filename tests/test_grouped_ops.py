"""Grouped expert GEMMs (ufp4_megatron.quant.grouped_ops) against their per-expert twin.

Contracts:
- test_grouped_gemms_equal_per_expert_reference_bitwise: for every preset recipe (their SR
  on dY, and SR on every operand), fp32, bf16 and fp16, with an empty expert, token counts
  that are not multiples of the block, tensor-parallel shard origins and a first expert
  other than 0 (an EP rank), grouped fprop/dgrad/wgrad on the padded token layout equal the
  per-expert loop through `ops` exactly: expert g keyed by expert_seed(seed, g), positions
  from its own first token;
- test_expert_results_do_not_depend_on_other_experts: an expert's output rows, dX rows and dW
  stay bit for bit when another expert's token count changes, when experts are split over
  two calls (two EP ranks) and when zero-token experts are added around it;
- test_experts_draw_distinct_sr_bits: two experts with identical tokens and weights round
  differently under SR (their keys differ), identically under RTNE;
- test_fp16_with_rht_is_quantized_in_fp32: fp16 operands of 16400 rotate past fp16's range:
  finite and equal to the per-expert path (ops quantizes them into fp32, so does grouped);
- test_torch_grouped_mm_equals_the_loop_bitwise: torch._grouped_mm (where torch has it on
  this device) equals the loop of matmuls it replaces, both layouts, empty groups included;
- test_sr_bits_follow_the_seed: another seed moves SR-rounded gradients, the same seed
  reproduces them (the comparison above is not trivially passing);
- test_zero_token_expert_wgrad_is_exactly_zero, test_no_tokens_at_all;
- test_padding_layout: each expert's tokens start a segment that is a multiple of `align`,
  unpad(pad(t)) == t;
- test_grouped_linear_autograd: the autograd wiring: bf16 against per-expert F.linear and
  RTNE UFP4 against per-expert quantized_linear (y, dx, dW, db) to fp32 GEMM rounding. Not
  bit for bit: the grouped path multiplies each expert's padded segment, the reference its
  unpadded rows, and a CPU BLAS picks its kernel by shape (MKL on an AVX-512 CPU:
  5 rows x 64 differ by 4e-6 between F.linear and a matmul of the transposed copy, and
  between 5 rows and the same rows padded to 16). The operands are the same bits either way;
  the exact contract of the grouped GEMMs is the first test's, on the padded layout;
- errors: expert sizes that split a block, wrong wgrad padding, bad backend, inconsistent
  shapes/counts, bad seed/first_expert.
"""

import pytest
import torch

from ufp4_megatron import get_recipe, list_recipes, quantized_linear
from ufp4_megatron.quant import grouped_ops as G

COUNTS = (0, 5, 17, 42)  # an empty expert; no count a multiple of 16
E, K, N = 4, 64, 96
# the presets, and SR on every operand (weights included: keyed per expert too)
RECIPES = [(n, {}) for n in list_recipes()] + [
    ("ufp4", {"sr": ("dy", "x", "w")}),
    ("mxfp4", {"sr": ("dy", "x", "w")}),
]


def _data(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    M = sum(COUNTS)
    mk = lambda *s: torch.randn(*s, generator=g).to(dtype)
    return mk(M, K), mk(E, N, K) * K**-0.5, mk(M, N)


def _groups(recipe):
    return G.ExpertGroups(COUNTS, G.token_alignment(recipe))


def _padded(recipe, dtype, seed=0):
    """groups and x, w, dy with x and dy in the padded token layout."""
    x, w, dy = _data(dtype, seed)
    g = _groups(recipe)
    return g, g.pad(x), w, g.pad(dy)


def _gemms(x, w, dy, origins=True):
    """(grouped fn, twin, operands, origins) of the three GEMMs; origins of a TP shard: column
    chunk at n0 = 32, row shard at k0 = 64."""
    o = (lambda **kw: kw) if origins else (lambda **kw: {})
    return [
        (G.fprop, G.reference_fprop, (x, w), o(x_origin=(0, 64), w_origin=(32, 64))),
        (G.dgrad, G.reference_dgrad, (dy, w), o(dy_origin=(0, 32), w_origin=(32, 64))),
        (G.wgrad, G.reference_wgrad, (dy, x), o(dy_origin=(0, 32), x_origin=(0, 64))),
    ]


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16))
@pytest.mark.parametrize("name,overrides", RECIPES)
def test_grouped_gemms_equal_per_expert_reference_bitwise(name, overrides, dtype):
    r = get_recipe(name, **overrides)
    g, x, w, dy = _padded(r, dtype)
    kw = dict(seed=1234, first_expert=8)  # local experts 8..11: an EP rank's
    for fn, ref, args, origins in _gemms(x, w, dy):
        got, want = fn(*args, g, r, **kw, **origins), ref(*args, g, r, **kw, **origins)
        assert got.dtype == want.dtype == dtype and got.shape == want.shape
        assert torch.equal(got, want), f"{name} {overrides} {fn.__name__}"


def _expert_results(recipe, counts, tokens, w, dy_tokens, first_expert=0, seed=99):
    """Per local expert: (Y rows, dX rows, dW) of the grouped GEMMs on these counts; tokens
    and dy_tokens hold each expert's rows (a list per expert)."""
    g = G.ExpertGroups(counts, G.token_alignment(recipe))
    x = g.pad(torch.cat(tokens)) if sum(counts) else torch.zeros(0, K)
    dy = g.pad(torch.cat(dy_tokens)) if sum(counts) else torch.zeros(0, N)
    kw = dict(seed=seed, first_expert=first_expert)
    y, dx = G.fprop(x, w, g, recipe, **kw), G.dgrad(dy, w, g, recipe, **kw)
    dw = G.wgrad(dy, x, g, recipe, **kw)
    rows = list(zip(g.padded_starts, g.counts))
    return [(y[s : s + c], dx[s : s + c], dw[e]) for e, (s, c) in enumerate(rows)]


@pytest.mark.parametrize(
    "name,overrides",
    [("ufp4", {}), ("ufp4", {"sr": ("dy", "x", "w")}), ("mxfp4", {}), ("nvfp4", {})],
)
def test_expert_results_do_not_depend_on_other_experts(name, overrides):
    r = get_recipe(name, **overrides)
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(E, N, K, generator=gen) * K**-0.5
    toks = [torch.randn(60, K, generator=gen) for _ in range(E)]
    dys = [torch.randn(60, N, generator=gen) for _ in range(E)]

    def run(counts, experts=range(E), first=0):
        es = list(experts)
        return _expert_results(
            r,
            counts,
            [toks[e][:c] for e, c in zip(es, counts)],
            w[es[0] : es[-1] + 1],
            [dys[e][:c] for e, c in zip(es, counts)],
            first_expert=first,
        )

    base = run((3, 17, 42, 9))
    for other in (
        run((40, 17, 42, 9)),  # expert 0 got more tokens
        run((0, 17, 42, 1)),  # experts 0 and 3 got fewer
        run((3, 17), experts=(0, 1)) + run((42, 9), experts=(2, 3), first=2),
    ):
        for e in (1, 2):
            for got, want in zip(other[e], base[e]):
                assert torch.equal(got, want), (name, overrides, e)
    moved = run((3, 30, 42, 9))[1]  # expert 1's own tokens changed: its results do
    assert not torch.equal(moved[2], base[1][2])


@pytest.mark.parametrize("rounding", ("rtne", "sr"))
def test_experts_draw_distinct_sr_bits(rounding):
    r = get_recipe("ufp4", sr=("dy",) if rounding == "sr" else ())
    gen = torch.Generator().manual_seed(8)
    w = (torch.randn(N, K, generator=gen) * K**-0.5).expand(2, N, K).contiguous()
    x, dy = torch.randn(20, K, generator=gen), torch.randn(20, N, generator=gen)
    (_, dx0, dw0), (_, dx1, dw1) = _expert_results(r, (20, 20), [x, x], w, [dy, dy])
    same = torch.equal(dx0, dx1) and torch.equal(dw0, dw1)
    assert same == (rounding == "rtne")


def test_fp16_with_rht_is_quantized_in_fp32():
    r = get_recipe("ufp4")
    g = G.ExpertGroups((16, 0, 16), G.token_alignment(r))
    big = dict(fill_value=16400.0, dtype=torch.float16)  # a rotated block reaches 65600
    small = dict(fill_value=2.0**-12, dtype=torch.float16)
    x, dy = torch.full((32, K), **big), torch.full((32, N), **big)
    w = torch.full((3, N, K), **small)
    for fn, ref, args, _ in _gemms(x, w, dy, origins=False):
        if fn is G.wgrad:  # dY rotated along tokens; a small X keeps dW = dY^T X in range
            args = (dy, torch.full((32, K), **small))
        got, want = fn(*args, g, r, seed=3), ref(*args, g, r, seed=3)
        assert got.dtype == torch.float16 and torch.isfinite(got).all(), fn.__name__
        assert torch.equal(got, want), fn.__name__


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
    r = get_recipe(name, **({"sr": ("dy", "x", "w")} if name == "ufp4" else {}))
    for counts in (COUNTS, (5, 0, 0, 42), (0, 0, 17, 0)):  # empty first, middle, last
        g = G.ExpertGroups(counts, G.token_alignment(r))
        x, _, dy = _data(torch.float32, seed=3)
        x, dy = g.pad(x[: sum(counts)]), g.pad(dy[: sum(counts)])
        dw = G.wgrad(dy, x, g, r, seed=5)
        assert dw.shape == (E, N, K)
        for e, c in enumerate(counts):
            assert torch.equal(dw[e], torch.zeros(N, K)) == (c == 0), (counts, e)
        assert torch.equal(dw, G.reference_wgrad(dy, x, g, r, seed=5))


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
        assert torch.equal(p[e : e + c], t[s : s + c])
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
            ys.append(
                torch.nn.functional.linear(xr[s : s + c], wr[e], be)
                if name == "bf16"
                else quantized_linear(xr[s : s + c], wr[e], be, r)
            )
        yr = torch.cat(ys)
        yr.backward(dy)
        # fp32 GEMMs of other shapes agree to a few ulps (docstring); a wiring error (another
        # expert's weight or rows, a missing bias or gradient) is off by O(1)
        close = dict(rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(y, yr, **close, msg=name)
        torch.testing.assert_close(xs.grad, xr.grad, **close, msg=name)
        torch.testing.assert_close(ws.grad, wr.grad, **close, msg=name)
        if with_bias:
            torch.testing.assert_close(bs.grad, br.grad, **close, msg=name)


def test_errors_say_what_to_change():
    r = get_recipe("ufp4")
    g, xp, w, _dyp = _padded(r, torch.float32)
    x, _, dy = _data(torch.float32)
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
    with pytest.raises(ValueError, match="first_expert must be an int >= 0"):
        G.grouped_linear(x, w, None, COUNTS, r, first_expert=-1)
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\^63\)"):
        G.grouped_linear(x, w, None, COUNTS, r, seed=2**63)

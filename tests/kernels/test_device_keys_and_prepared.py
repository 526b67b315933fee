"""SR keys read from device memory, prepared launches, cached weight operands: bit for bit.

Runs on a GPU when there is one, else in Triton's CPU interpreter (conftest.py), at small
shapes. Contracts:
| test                                              | what |
| draw_kernel_is_operand_keys_of_the_stream         | keys_triton's draw (plain and 70 experts: two blocks) == numerics.philox.operand_keys(stream_seed(...)), counter + 1 per draw |
| device_key_equals_host_seed                       | row16, col16, generic row/col, the pair kernel: a seed read from a key table == the same seed as a host int == the reference |
| segments_read_a_key_row_in_place                  | Segments(seeds=<int64 row>) == Segments(seeds=<ints>), kernels and reference |
| prepared_launch_matches_quantize_pair             | PreparedQDQ (one and two jobs, row/col, int seeds and device keys, repeated calls on new data) == quantize_pair |
| prepared_refuses_what_it_does_not_cover           | e4m3, segments, generic-kernel operands: prepare() is None |
| ops_key_table_equals_host_seed                    | ops.fprop/dgrad/wgrad (ufp4, SR on every operand): a key table [6, 1] == its call seed |
| sr_seeds_device_draws_are_the_host_stream         | megatron/seeds.py's device draws == operand_keys of its host draws; state continues across both |
| kept_operands_are_the_pair_launch_bits            | ops.operand / grouped_ops.weight_operand given as qw (and x's as qx) == quantized in the call (ufp4, nvfp4; e2m1, mxfp4 in make test-slow) |
"""

import pytest
import torch
from kernel_assertions import assert_bitwise

from ufp4_megatron import get_recipe, kernels
from ufp4_megatron.kernels.dispatch import PreparedQDQ, prepare
from ufp4_megatron.kernels.keys_triton import _draw_keys_kernel
from ufp4_megatron.numerics.hadamard import RHT
from ufp4_megatron.numerics.philox import operand_keys, stream_seed
from ufp4_megatron.numerics.quantize import quantize_view as reference
from ufp4_megatron.numerics.segments import Segments
from ufp4_megatron.quant import grouped_ops, ops

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's uint64 wrap


def _data(rows, cols, seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g).to(dtype).to(DEVICE)


@pytest.mark.parametrize(
    "experts,salt", [(None, (3, 2**32 - 5, 0, 1)), ((5, 70), (1, 7, 0, 0)), (None, ())]
)
def test_draw_kernel_is_operand_keys_of_the_stream(experts, salt):
    first, n = experts or (0, 1)
    counter = torch.tensor([41], dtype=torch.int64, device=DEVICE)
    for draw in (41, 42):
        out = torch.empty(6, n, dtype=torch.int64, device=DEVICE)
        _draw_keys_kernel[(1,)](
            counter,
            out,
            2**62 + 12345,
            *salt,
            *(0,) * (4 - len(salt)),
            first,
            E=n,
            NSALT=len(salt),
            EXPERTS=experts is not None,
            BLOCK=64,
        )
        want = operand_keys(
            stream_seed(2**62 + 12345, draw, *salt),
            None if experts is None else range(first, first + n),
        )
        assert out.cpu().tolist() == want
    assert counter.item() == 43


CASES = {
    "row16": ("row", dict(rht=RHT(16, 1))),
    "col16": ("col", dict(rht=RHT(16, 1))),
    "col32": ("col", dict(block=32, rht=RHT(16, 1))),
    "generic_row": ("row", dict(block=32)),
    "generic_col": ("col", dict(rht=RHT(32, 1))),
}


@pytest.mark.parametrize("case", CASES)
def test_device_key_equals_host_seed(case):
    layout, kw = CASES[case]
    x = _data(48, 64, 0)
    view = x if layout == "row" else x.t().contiguous().t()
    table = torch.tensor([[7], [2**62 + 99]], dtype=torch.int64, device=DEVICE)
    args = dict(kw, rounding="sr", origin=(2, 8))
    q_key = kernels.quantize_view(view, "e1m2", seed=table[1, 0], **args)
    assert_bitwise(q_key, kernels.quantize_view(view, "e1m2", seed=2**62 + 99, **args), case)
    assert_bitwise(q_key, reference(view.cpu(), "e1m2", seed=2**62 + 99, **args).to(DEVICE), case)


def test_device_key_equals_host_seed_in_the_pair_kernel():
    x, w = _data(48, 64, 1), _data(32, 64, 2)
    table = torch.tensor([[5], [2**62 + 99]], dtype=torch.int64, device=DEVICE)
    kw = dict(grid="e1m2", rounding="sr", rht=RHT(16, 1))
    qa, qb = kernels.quantize_pair(x, dict(kw, seed=table[0, 0]), w.t(), dict(kw, seed=table[1, 0]))
    ra, rb = kernels.quantize_pair(x, dict(kw, seed=5), w.t(), dict(kw, seed=2**62 + 99))
    assert_bitwise(qa, ra, "a")
    assert_bitwise(qb, rb, "b")


def test_segments_read_a_key_row_in_place():
    x = _data(48, 64, 3)
    seeds = (11, 2**62 + 5, 33)
    row = torch.tensor(seeds, dtype=torch.int64, device=DEVICE)
    kw = dict(rounding="sr", rht=RHT(16, 1))
    want = reference(x.cpu(), "e1m2", segments=Segments(0, (0, 16, 16), seeds), **kw)
    assert_bitwise(
        kernels.quantize_view(x, "e1m2", segments=Segments(0, (0, 16, 16), row), **kw),
        want.to(DEVICE),
        "kernel",
    )
    assert_bitwise(
        reference(x.cpu(), "e1m2", segments=Segments(0, (0, 16, 16), row.cpu()), **kw),
        want,
        "reference",
    )


# (along_rows of each job, rounding of each job, format options of both): fprop, dgrad, wgrad
# shapes, one job; MXFP4's wgrad (1x32 column blocks, e8m0 scales)
JOBS = {
    "fprop": ((False, False), ("rtne", "rtne"), {}),
    "dgrad": ((False, True), ("sr", "rtne"), {}),
    "wgrad": ((True, True), ("sr", "rtne"), {}),
    "single_col_sr": ((True,), ("sr",), {}),
    "mxfp4_wgrad": ((True, True), ("sr", "rtne"), dict(grid="e2m1", block=32, scale="e8m0")),
}


@pytest.mark.parametrize("keyed", (False, True))
@pytest.mark.parametrize("job", JOBS)
def test_prepared_launch_matches_quantize_pair(job, keyed):
    rows, roundings, fmt = JOBS[job]
    table = torch.tensor([[2**62 + 3], [17], [2**40 + 1], [9]], dtype=torch.int64, device=DEVICE)
    kws = [
        dict(
            dict(grid="e1m2", rounding=r, rht=RHT(16, 2), keep_padding=True, origin=(0, 16 * i)),
            **fmt,
        )
        for i, r in enumerate(roundings)
    ]
    prepared = None
    for call in range(2):  # the same plan over new data and new keys
        ts = [_data(32, 48, 10 * call + i) for i in range(len(rows))]
        host = [(2**61 + call * 7 + i) if r == "sr" else 0 for i, r in enumerate(roundings)]
        if keyed:
            table[: len(rows), 0] = torch.tensor(host)
        seeds = [
            ((table, i) if keyed else h) if r == "sr" else 0
            for i, (h, r) in enumerate(zip(host, roundings))
        ]
        if prepared is None:
            prepared = prepare(ts, rows, kws, seeds)
            assert isinstance(prepared, PreparedQDQ)
        got = prepared(ts, seeds)
        views = [t.t() if r else t for t, r in zip(ts, rows)]
        if len(ts) == 2:
            want = kernels.quantize_pair(
                views[0], dict(kws[0], seed=host[0]), views[1], dict(kws[1], seed=host[1])
            )
        else:
            want = (kernels.quantize_view(views[0], seed=host[0], **kws[0]),)
        for g, w, r in zip(got, want, rows):
            assert_bitwise(g, w.t() if r else w, f"{job} call {call}")


def test_prepared_refuses_what_it_does_not_cover():
    t = _data(32, 64, 4)
    base = dict(grid="e2m1", keep_padding=True)
    assert prepare([t], [False], [dict(base, scale="e4m3")], [0]) is None
    assert prepare([t], [False], [dict(base, block=32)], [0]) is None  # 1x32 rows: generic
    seg = Segments(0, (0, 16), (1, 2))
    assert prepare([t], [False], [dict(base, rounding="sr", segments=seg)], [0]) is None


@pytest.mark.parametrize("gemm", ("fprop", "dgrad", "wgrad"))
def test_ops_key_table_equals_host_seed(gemm):
    recipe = get_recipe("ufp4", sr=("x", "w", "dy"))
    x, w, dy = _data(32, 48, 5), _data(64, 48, 6), _data(32, 64, 7)
    call = 2**62 + 1234
    table = torch.tensor(operand_keys(call), dtype=torch.int64, device=DEVICE)
    fn, args = {
        "fprop": (ops.fprop, (x, w)),
        "dgrad": (ops.dgrad, (dy, w)),
        "wgrad": (ops.wgrad, (dy, x)),
    }[gemm]
    assert_bitwise(
        fn(*args, recipe, seed=table, backend="triton"),
        fn(*args, recipe, seed=call, backend="triton"),
        gemm,
    )


# make test: UFP4's (RHT16 on every GEMM); the other recipes' (~20-40 s each in the
# interpreter) in make test-slow
@pytest.mark.parametrize(
    "name",
    (
        "ufp4",
        pytest.param("nvfp4", marks=pytest.mark.slow),
        pytest.param("e2m1", marks=pytest.mark.slow),
        pytest.param("mxfp4", marks=pytest.mark.slow),
    ),
)
def test_kept_operands_are_the_pair_launch_bits(name):
    recipe = get_recipe(name)
    x, w, dy = _data(32, 64, 8), _data(64, 64, 9), _data(32, 64, 10)
    t = dict(backend="triton", seed=77)
    for gemm, fn, a in (("fprop", ops.fprop, x), ("dgrad", ops.dgrad, dy)):
        qw = ops.operand(gemm, "w", w, recipe, origin=(16, 0), backend="triton")
        assert_bitwise(
            fn(a, w, recipe, w_origin=(16, 0), qw=qw, **t),
            fn(a, w, recipe, w_origin=(16, 0), **t),
            f"{name} {gemm}",
        )
    # x's operands, made once for a strided weight's chunks (megatron/parallel_gemm.py)
    qx = ops.operand("fprop", "x", x, recipe, origin=(0, 16), backend="triton")
    assert_bitwise(
        ops.fprop(x, w, recipe, x_origin=(0, 16), qx=qx, **t),
        ops.fprop(x, w, recipe, x_origin=(0, 16), **t),
        f"{name} fprop x",
    )
    qx = ops.operand("wgrad", "x", x, recipe, origin=(0, 16), backend="triton")
    assert_bitwise(
        ops.wgrad(dy, x, recipe, x_origin=(0, 16), qx=qx, **t),
        ops.wgrad(dy, x, recipe, x_origin=(0, 16), **t),
        f"{name} wgrad x",
    )
    groups = grouped_ops.expert_groups((16, 0, 16), grouped_ops.token_alignment(recipe))
    ws = torch.stack([w, w.flip(0), w * 0.5])
    xp, dyp = groups.pad(x), groups.pad(dy)
    for gemm, fn, a in (("fprop", grouped_ops.fprop, xp), ("dgrad", grouped_ops.dgrad, dyp)):
        qw = grouped_ops.weight_operand(gemm, ws, recipe, backend="triton")
        kw = dict(backend="triton", gemm_backend="loop", seed=77, first_expert=2)
        assert_bitwise(
            fn(a, ws, groups, recipe, qw=qw, **kw),
            fn(a, ws, groups, recipe, **kw),
            f"{name} grouped {gemm}",
        )
    kw = dict(backend="triton", seed=77, first_expert=2)
    for gemm, fn, args in (
        ("fprop", grouped_ops.fprop, (xp, ws, groups, recipe)),
        ("wgrad", grouped_ops.wgrad, (dyp, xp, groups, recipe)),
    ):
        qx = grouped_ops.input_operand(gemm, xp, groups, recipe, **kw)
        assert_bitwise(
            fn(*args, **kw, gemm_backend="loop", qx=qx),
            fn(*args, **kw, gemm_backend="loop"),
            f"{name} grouped {gemm} x",
        )


def test_sr_seeds_device_draws_are_the_host_stream(monkeypatch):
    """megatron/seeds.py: draws on the device (the draw kernel, a device counter) are the key
    tables of the host stream's call seeds, in order; the state saved after device draws
    continues on the host where the device left off, and back."""
    from ufp4_megatron.megatron import seeds as seeds_module

    monkeypatch.setattr(seeds_module, "DEVICE_DRAWS", {"cuda", "cpu"})
    dev, host = seeds_module.SRSeeds(9), seeds_module.SRSeeds(9)
    device = torch.device(DEVICE)
    for salt, experts in (((1, 2, 0, 0), None), ((1, 3, 0, 1), (4, 3)), ((2, 2, 0, 0), None)):
        keys = dev.draw(*salt, experts=experts, device=device)
        call = host.draw(*salt)
        want = operand_keys(call, None if experts is None else range(4, 7))
        assert keys.cpu().tolist() == want
    assert dev.draws == host.draws == 3
    resumed = seeds_module.SRSeeds(0)
    resumed.load_state_dict(dev.state_dict())
    assert resumed.draw(5, 5, 0, 0) == host.draw(5, 5, 0, 0)
    dev.load_state_dict(resumed.state_dict())  # the device counter follows a load
    assert dev.draw(6, 1, 0, 0, device=device).cpu().tolist() == operand_keys(host.draw(6, 1, 0, 0))


def test_sr_draws_in_megatron_graph_warmup_leave_the_stream_alone(monkeypatch):
    """Megatron's per-layer capture runs each layer a few extra times first (is_graph_warmup);
    draws there must not advance the counter, else the captured run's keys are shifted from
    the eager run's from the first replayed step on."""
    from megatron.core.transformer import cuda_graphs

    from ufp4_megatron.megatron import seeds as seeds_module

    monkeypatch.setattr(seeds_module, "DEVICE_DRAWS", {"cuda", "cpu"})
    graphed, eager = seeds_module.SRSeeds(4), seeds_module.SRSeeds(4)
    device = torch.device(DEVICE)
    first = graphed.draw(1, 2, 0, 0, device=device)
    assert torch.equal(first, eager.draw(1, 2, 0, 0, device=device))
    cuda_graphs._set_warmup_start()
    try:
        thrown_away = [graphed.draw(1, 2, 0, 0, device=device) for _ in range(3)]
    finally:
        cuda_graphs._set_warmup_end()
    assert graphed.draws == eager.draws == 1
    nxt = eager.draw(1, 2, 0, 0, device=device)
    assert all(torch.equal(k, nxt) for k in thrown_away)  # a copy of the counter at draw 1
    assert torch.equal(graphed.draw(1, 2, 0, 0, device=device), nxt)
    assert graphed.draws == 2

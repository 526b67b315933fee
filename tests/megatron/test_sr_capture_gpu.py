"""SR seeds and CUDA graphs, with a real capture (make test-gpu).

On the GPU a draw is a kernel that reads the stream's counter from device memory, writes the
call's key table and advances the counter (megatron/seeds.py, kernels/keys_triton.py), and
the QDQ kernels read their keys from that table: a captured graph draws the next keys at each
replay, the ones the eager calls draw in the same order, so the quantized GEMMs of a replay
equal the eager ones bit for bit. A stream resumed in the older format (host-integer seeds)
still refuses inside a capture (SRCaptureError): its seed would be frozen into the graph.
The CPU suite checks the refusal of host-integer draws through a UFP4 linear's forward with
the capture check simulated (test_mcore_parallel_linear.py::
test_sr_forward_refuses_under_cuda_graph_capture).
"""

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CUDA = torch.device("cuda")


def _capture(fn):
    """fn() captured in a CUDA graph (after one run on a side stream: warm-up), and its
    captured output."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def test_device_draws_replay_the_eager_stream():
    from ufp4_megatron.megatron.seeds import SRSeeds

    graphed, eager = SRSeeds(5), SRSeeds(5)
    graph, keys = _capture(lambda: graphed.draw(1, 2, 0, 0, device=CUDA, experts=(3, 5)))
    eager.draw(1, 2, 0, 0, device=CUDA, experts=(3, 5))  # the warm-up draw of _capture
    got = []
    for _ in range(3):
        graph.replay()
        got.append(keys.clone())
    want = [eager.draw(1, 2, 0, 0, device=CUDA, experts=(3, 5)) for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert len({tuple(k.flatten().tolist()) for k in got}) == 3  # fresh keys every replay
    assert graphed.draws == eager.draws == 4


def test_quantized_gemms_in_a_graph_equal_the_eager_ones():
    from ufp4_megatron import get_recipe
    from ufp4_megatron.megatron.seeds import SRSeeds
    from ufp4_megatron.quant import ops

    recipe = get_recipe("ufp4", sr=("x", "w", "dy"))
    g = torch.Generator(device="cuda").manual_seed(0)
    x, w, dy = (
        torch.randn(*s, device="cuda", generator=g, dtype=torch.bfloat16)
        for s in ((256, 512), (384, 512), (256, 384))
    )
    graphed, eager = SRSeeds(9), SRSeeds(9)

    def step(seeds):
        seed = seeds.draw(4, 1, 0, 0, device=CUDA)
        return (
            ops.fprop(x, w, recipe, seed=seed),
            ops.dgrad(dy, w, recipe, seed=seed),
            ops.wgrad(dy, x, recipe, seed=seed),
        )

    graph, outs = _capture(lambda: step(graphed))
    step(eager)
    for _ in range(2):
        graph.replay()
        want = step(eager)
        assert all(torch.equal(a, b) for a, b in zip(outs, want))


def test_host_integer_draws_refuse_inside_a_capture():
    from ufp4_megatron.megatron.seeds import SRCaptureError, SRSeeds

    gen = torch.Generator().manual_seed(3)
    seeds = SRSeeds(0)
    seeds.load_state_dict({"seed": 3, "draws": 0, "generator": gen.get_state()})  # format 1
    before = seeds.draw(1, 2, 0, 0, device=CUDA)
    graph = torch.cuda.CUDAGraph()
    x = torch.zeros(4, device="cuda")
    with pytest.raises(SRCaptureError, match="inside a CUDA graph"), torch.cuda.graph(graph):
        x.add_(1)
        seeds.draw(1, 2, 0, 0, device=CUDA)
    assert seeds.draws == 1  # the refused draw did not advance the stream
    assert seeds.draw(1, 2, 0, 0, device=CUDA) != before  # outside capture: it goes on

"""SR seeds and CUDA graphs, with a real capture (make test-gpu).

A seed is a host integer handed to the kernels; a captured graph would replay it every step.
SRSeeds.draw refuses during capture (megatron/seeds.py); outside capture it draws as before.
The CPU suite checks the same refusal through a UFP4 linear's forward with the capture check
simulated (test_mcore_parallel_linear.py::test_sr_forward_refuses_under_cuda_graph_capture).
"""

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_draw_refuses_inside_a_cuda_graph_capture():
    from ufp4_megatron.megatron.seeds import SRCaptureError, SRSeeds

    seeds = SRSeeds(5)
    before = seeds.draw(1, 2, 0, 0)
    graph = torch.cuda.CUDAGraph()
    x = torch.zeros(4, device="cuda")
    with pytest.raises(SRCaptureError, match="inside a CUDA graph"), torch.cuda.graph(graph):
        x.add_(1)
        seeds.draw(1, 2, 0, 0)
    assert seeds.draws == 1  # the refused draw did not advance the stream
    assert seeds.draw(1, 2, 0, 0) != before  # outside capture: the stream goes on

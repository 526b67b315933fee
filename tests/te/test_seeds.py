"""The TE route's SR seed source (te/seeds.py) where a CPU can check it: the fixed seed the
parity checks use, and the refusal off CUDA. Drawing from the CUDA generator (its state saved
and restored with a checkpoint) is checked on a GPU: gpu/te_parity.py, "SR stream"."""

from __future__ import annotations

import pytest
import torch

from ufp4_megatron.te import seeds


def test_fixed_seed_nests_and_ends():
    cpu = torch.device("cpu")
    with seeds.fixed(5):
        assert seeds.draw(cpu) == 5
        with seeds.fixed(2**62):
            assert seeds.draw(cpu) == 2**62
        assert seeds.draw(cpu) == 5
    with pytest.raises(ValueError, match="draws its SR seeds from the CUDA generator"):
        seeds.draw(cpu)
    with pytest.raises(ValueError), seeds.fixed(-1):
        pass

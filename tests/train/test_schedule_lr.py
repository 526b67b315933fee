"""The LR schedule: linear warmup to optim.lr, cosine to optim.min_lr at train.steps.

    test_warmup_then_cosine_to_min_lr
"""
import pytest

from ufp4_megatron.train.optim import lr_at
from ufp4_megatron.train.schema import OptimConfig


def test_warmup_then_cosine_to_min_lr():
    cfg = OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=10)
    assert lr_at(0, cfg, 110) == pytest.approx(0.1)
    assert lr_at(9, cfg, 110) == pytest.approx(1.0)
    assert lr_at(60, cfg, 110) == pytest.approx(0.55)  # half-way down the cosine
    assert lr_at(110, cfg, 110) == pytest.approx(0.1)
    assert lr_at(500, cfg, 110) == pytest.approx(0.1)
    lrs = [lr_at(s, cfg, 110) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))

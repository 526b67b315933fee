"""The LR schedule: Megatron-Core's OptimizerParamScheduler, built from optim.* (train/optim.py).

test_default_keeps_the_old_warmup_and_cosine   warmup bit-equal to the formula used before
    the scheduler (lr * (s+1) / warmup), cosine = that formula one step on, last update at
    min_lr
test_run_shorter_than_warmup_stays_in_warmup   train.steps <= warmup: as before, no error
test_wsd_holds_then_decays                     WSD: lr until the final wsd_decay_steps
test_linear_and_constant_styles
test_state_round_trip_continues_the_schedule   state_dict -> a fresh scheduler: same LRs
test_bad_schedule_keys_fail_with_one_line      each new key's error cases
"""

import math

import pytest
import torch

from ufp4_megatron.train.optim import build_scheduler, check_schedule
from ufp4_megatron.train.schema import Config, OptimConfig, TrainConfig


def _cfg(steps: int, **optim) -> Config:
    return Config(optim=OptimConfig(**optim), train=TrainConfig(steps=steps))


def _lrs(cfg: Config, n: int | None = None, sched=None) -> list[float]:
    """LR of each update, as the loop takes it (advance, then step)."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.optim.lr)
    sched = sched or build_scheduler(opt, cfg)
    out = []
    for _ in range(cfg.train.steps if n is None else n):
        sched.step(increment=1)
        out.append(sched.optimizer.param_groups[0]["lr"])
    return out


def _old_lr_at(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """The hand-written schedule this package used before Megatron's scheduler."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))


def test_default_keeps_the_old_warmup_and_cosine():
    cfg = _cfg(110, lr=1.0, min_lr=0.1, warmup_steps=10)
    new = _lrs(cfg)
    old = [_old_lr_at(s, cfg.optim, 110) for s in range(111)]
    assert new[:10] == old[:10]  # warmup, bit for bit
    assert new[10:] == pytest.approx(old[11:111], rel=1e-12, abs=1e-12)  # cosine, one step on
    assert new[9] == 1.0 and new[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(new[9:], new[10:]))


def test_run_shorter_than_warmup_stays_in_warmup():
    cfg = _cfg(5, lr=1.0, min_lr=0.1, warmup_steps=100)
    assert _lrs(cfg) == [_old_lr_at(s, cfg.optim, 5) for s in range(5)]


def test_wsd_holds_then_decays():
    cfg = _cfg(20, lr=1.0, min_lr=0.0, warmup_steps=2, decay_style="WSD", wsd_decay_steps=4)
    lrs = _lrs(cfg)
    assert lrs[:2] == [0.5, 1.0]
    assert lrs[2:16] == [1.0] * 14  # stable until the last 4 updates
    assert lrs[16:] == pytest.approx([0.75, 0.5, 0.25, 0.0])


def test_linear_and_constant_styles():
    assert _lrs(_cfg(6, lr=1.0, min_lr=0.0, warmup_steps=2, decay_style="linear")) == pytest.approx(
        [0.5, 1.0, 0.75, 0.5, 0.25, 0.0]
    )
    assert _lrs(_cfg(4, lr=1.0, min_lr=0.0, warmup_steps=1, decay_style="constant")) == [1.0] * 4


def test_state_round_trip_continues_the_schedule():
    cfg = _cfg(30, lr=1.0, min_lr=0.1, warmup_steps=5)
    unbroken = _lrs(cfg)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    first = build_scheduler(opt, cfg)
    head = _lrs(cfg, 12, sched=first)
    resumed = build_scheduler(
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0),
        _cfg(40, lr=1.0, min_lr=0.1, warmup_steps=5),
    )  # steps extended
    resumed.load_state_dict(first.state_dict())
    tail = _lrs(cfg, 28, sched=resumed)
    assert head + tail[:18] == unbroken  # the checkpoint's horizon (30 steps) is kept
    assert tail[18:] == [pytest.approx(0.1)] * 10  # the extension runs at min_lr


@pytest.mark.parametrize(
    "optim, match",
    [
        (dict(decay_style="exp"), "optim.decay_style='exp'; valid: cosine"),
        (dict(decay_style="WSD"), "needs optim.wsd_decay_steps"),
        (
            dict(decay_style="WSD", wsd_decay_steps=5, wsd_decay_style="cos"),
            "wsd_decay_style='cos'",
        ),
        (dict(decay_style="WSD", wsd_decay_steps=500), "longer than the decay phase"),
        (dict(decay_steps=50), "optim.decay_steps=50 must exceed optim.warmup_steps=100"),
        (dict(warmup_steps=-1), "optim.warmup_steps=-1 must be >= 0"),
        (dict(min_lr=1.0), "optim.min_lr=1.0 must be in"),
    ],
)
def test_bad_schedule_keys_fail_with_one_line(optim, match):
    with pytest.raises(ValueError, match=match) as e:
        check_schedule(_cfg(200, **optim))
    assert "\n" not in str(e.value)

"""`logging.tensorboard=true` through the trainer: a run writes each step's loss to
<run dir>/tensorboard, and a resumed run appends its steps to the same dir."""

from __future__ import annotations

import pytest
from _cli import losses, run, train_cmd

pytestmark = pytest.mark.usefixtures("hydra_configs")


def _scalars(run_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard")).Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_a_run_and_its_resume_write_every_steps_loss(tmp_path):
    run_dir, cache = tmp_path / "run", tmp_path / "cache"
    common = ("logging.tensorboard=true", "checkpoint.interval=2")
    first = run(train_cmd(run_dir, cache, "train.steps=2", *common), tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    again = run(train_cmd(run_dir, cache, "train.steps=4", *common), tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    logged = losses(run_dir)
    assert len(logged) == 4
    # the event file holds float32: the same values to its precision, steps 1-4 once each
    assert [s for s, _ in _scalars(run_dir, "loss")] == [1, 2, 3, 4]
    assert [v for _, v in _scalars(run_dir, "loss")] == pytest.approx(logged, rel=1e-6)

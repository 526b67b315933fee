"""The trainer's kept weight operands (train.weight_cache, quant/weight_cache.py), on the CPU:
the trainer keeps them in fixed storage and re-makes them right after each optimizer step
(make_static/refresh; a resumed run makes them after its load). A run with them gives the
losses of a run without them bit for bit: dense, across a resume, and MoE (the grouped experts'
operands). That a refresh reads the parameter's new values where a chunk is a copy (TP > 1 with
a stride) is tests/megatron/test_weight_cache.py's."""

from __future__ import annotations

import pytest
from _cli import losses, run, train_cmd

pytestmark = pytest.mark.usefixtures("hydra_configs")


def _train(tmp_path, name, *overrides):
    r = run(train_cmd(tmp_path / name, tmp_path / "cache", *overrides), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_dense_kept_operands_give_the_uncached_losses_across_a_resume(tmp_path):
    runs = {}
    for cache in ("all", "none"):
        common = ("model=tiny", "precision=ufp4", f"train.weight_cache={cache}")
        out = _train(tmp_path, cache, *common, "train.steps=2")
        if cache == "all":
            assert "weight cache all" in out  # the runtime line: the cache is on
        out = _train(tmp_path, cache, *common, "train.steps=4")  # resumes from step 2
        assert "resum" in out.lower()
        runs[cache] = losses(tmp_path / cache)
    assert len(runs["all"]) == 4 and runs["all"] == runs["none"]


# ~40 s: in make test-slow; make test has the dense run above and the experts' kept operands
# against the stacked parameter (tests/megatron/test_weight_cache.py)
@pytest.mark.slow
def test_moe_kept_operands_give_the_uncached_losses(tmp_path):
    moe = ("model=moe_small", "model.num_layers=2", "precision=ufp4", "train.steps=3")
    for cache in ("all", "none"):
        _train(tmp_path, cache, *moe, f"train.weight_cache={cache}")
    assert len(losses(tmp_path / "all")) == 3
    assert losses(tmp_path / "all") == losses(tmp_path / "none")

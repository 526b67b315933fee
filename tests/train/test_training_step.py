"""The step as the trainer runs it, built once for the trainer and the step profiler
(train/schedule.py TrainingStep, bench/profile.py): the run keeps the weight operands the
runtime decided (train.weight_cache), and a profile under CUDA graphs waits for a replay."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from _cli import FAST

from ufp4_megatron.bench.profile import warmup_steps

_RUN = textwrap.dedent(
    """
    import json
    import sys
    from ufp4_megatron.quant import weight_cache
    from ufp4_megatron.train import distributed, schedule
    from ufp4_megatron.train.build import build_run
    from ufp4_megatron.train.footprint import load_config
    from ufp4_megatron.train.runtime import decide

    for asked in sys.argv[2:]:
        cfg = load_config([*json.loads(sys.argv[1]), f"train.weight_cache={asked}"])
        rt = decide(cfg)
        t = cfg.train
        with rt.scope():
            built = build_run(cfg, rt, n_train=t.global_batch, n_valid=1)
            reports, _ = schedule.TrainingStep(built, cfg, rt)(0)
            print("RUN", asked, built.policy.weight_cache, len(reports) == built.n_micro,
                  weight_cache.kept_bytes(built.model) > 0)
            distributed.shutdown()
    """
)


def test_the_built_run_keeps_the_weight_operands_the_runtime_decided(tmp_path):
    """`--set train.weight_cache=none` profiled a run keeping the experts' operands before:
    the run was built with the policy's default. Now every build takes the runtime's choice
    (auto is "all" on a CPU), and a step keeps operands only where it says so."""
    asked = ("none", "experts", "all", "auto")
    common = [*FAST, "precision=ufp4", f"data.cache_dir={tmp_path / 'data'}"]
    r = subprocess.run(
        [sys.executable, "-c", _RUN, json.dumps(common), *asked],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [line.split()[1:] for line in r.stdout.splitlines() if line.startswith("RUN ")]
    assert rows == [
        ["none", "none", "True", "False"],
        ["experts", "experts", "True", "False"],  # model=tiny is dense: no experts to keep
        ["all", "all", "True", "True"],
        ["auto", "all", "True", "True"],
    ]


@pytest.mark.parametrize(
    "warmup, graphs, graph_warmup, steps",
    [
        (3, "none", 3, 3),  # eager: as asked
        (3, "local", 3, 5),  # 3 eager, 1 capturing, 1 replay before the profiled one
        (3, "full_iteration", 1, 3),  # captured and replayed within the asked warm-up
        (8, "local", 3, 8),
    ],
)
def test_a_profile_under_graphs_waits_for_a_replay(warmup, graphs, graph_warmup, steps):
    assert warmup_steps(warmup, graphs, graph_warmup) == steps

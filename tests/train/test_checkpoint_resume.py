"""Nothing is lost: checkpoints under kills, damage and misuse, through the real CLI on CPU.

Every run is a UFP4 tiny-model run (SR on dy, RHT) through Megatron's DDP, distributed
optimizer and dist_checkpointing, the code path of GPU runs. "Equal" means bit for bit.

    test_checkpoint_is_megatron_dist_checkpointing   step dir = torch_dist checkpoint with
        Megatron-LM's sharding metadata, step + layout in its common state; `latest` last
    test_sigkill_during_save_leaves_a_resumable_state[phase]   SIGKILL at each point of a
        save (temp dir made, shards written, renamed, `latest` written, pruning): the rerun
        resumes from the newest complete step and ends with the unbroken run's losses
        (`renamed` in make test, the other four in make test-slow)
    test_damaged_newest_checkpoint_falls_back_and_cut_metrics_line_is_dropped   a truncated
        newest checkpoint and a half-written metrics line: warnings naming them, resume from
        the step before, same losses
    test_resume_false_in_used_run_dir_is_refused     nothing deleted or cut; resume still works
    test_extending_steps_keeps_the_checkpoints_schedule   steps past the saved horizon at min_lr
    test_bf16_params_resume_exactly_with_either_optimizer[opt]   the GPU dtype: Float16Optimizer too
        (its plain-optimizer case in make test-slow)
"""

from __future__ import annotations

import json
import shutil

import pytest
from _cli import ROOT, env, losses, run, train_cmd
from _kill import run_to_death

from ufp4_megatron.train import checkpoint

STEPS = 6
COMMON = [
    "precision=ufp4",
    f"train.steps={STEPS}",
    "checkpoint.interval=2",
    "checkpoint.keep=1",
    "logging.wandb.mode=disabled",
]


def leftovers(ckpt_dir):
    return [p.name for p in ckpt_dir.iterdir() if p.name.endswith((".saving", ".deleting", ".tmp"))]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory, cache):
    tmp = tmp_path_factory.mktemp("unbroken")
    r = run(train_cmd(tmp / "run", cache, *COMMON), tmp)
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp / "run"


def _killed(tmp_path, cache, at: str, *extra: str):
    """A run SIGKILLed at `at` ('<phase>:<step>') of a save; returns (its command, run dir)."""
    cmd = train_cmd(tmp_path / "run", cache, *COMMON, *extra)
    r = run_to_death(cmd, ROOT, env(tmp_path) | {checkpoint.KILL_HOOK: at}, tmp_path)
    assert r.returncode == -9, r.stderr[-3000:]  # SIGKILL: no handler, no cleanup ran
    assert not r.survivors  # the checkpoint writer's helper ended with it (train/lifetime.py)
    return cmd, tmp_path / "run"


def test_checkpoint_is_megatron_dist_checkpointing(unbroken):
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import load_common_state_dict

    ckpt = unbroken / "checkpoints"
    assert checkpoint.steps_on_disk(ckpt) == [STEPS]  # keep=1 pruned the older ones
    assert (ckpt / "latest").read_text() == str(STEPS) and not leftovers(ckpt)
    step_dir = checkpoint.step_dir(ckpt, STEPS)
    assert json.loads((step_dir / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    assert list(step_dir.glob("*.distcp"))
    assert dist_checkpointing.load_content_metadata(str(step_dir)) == {
        "singleton_local_shards": False,
        "chained_optim_avoid_prefix": True,
        "distrib_optim_sharding_type": "dp_reshardable",
    }
    common = load_common_state_dict(str(step_dir))
    assert common["ufp4.step"] == STEPS
    assert common["ufp4.layout"] == {
        "tp": 1,
        "pp": 1,
        "ep": 1,
        "dp": 1,
        "world_size": 1,
        "distributed_optimizer": True,
        "optim_sharding": "dp_reshardable",
    }
    assert checkpoint.damage(step_dir) is None and checkpoint.latest_step(ckpt) == STEPS


# each phase a kill point of the save protocol. make test keeps `renamed` (the newest step dir
# is complete but `latest` still names the step before: the scan, not the pointer, decides);
# the other four run in `make test-slow` (kept out of make test's 20 minutes): a kill
# after `latest` is written is also the kill of the damaged-checkpoint and bf16 tests below,
# resuming from the step before is also the damaged-checkpoint test's, and a half-deleted step
# dir is test_checkpoint_units.py's test_prune_leaves_no_half_deleted_step
@pytest.mark.parametrize(
    "phase, resumes_from",
    [
        pytest.param("tmp_created", 2, marks=pytest.mark.slow),
        pytest.param("shards_written", 2, marks=pytest.mark.slow),
        ("renamed", 4),
        pytest.param("latest_written", 4, marks=pytest.mark.slow),
        pytest.param("pruning", 4, marks=pytest.mark.slow),
    ],
)
def test_sigkill_during_save_leaves_a_resumable_state(
    unbroken, tmp_path, cache, phase, resumes_from
):
    cmd, run_dir = _killed(tmp_path, cache, f"{phase}:4")
    ckpt = run_dir / "checkpoints"
    assert checkpoint.latest_step(ckpt) == resumes_from
    assert len(losses(run_dir)) == 4  # metrics of steps past the checkpoint: cut on resume
    r = run(cmd, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert losses(run_dir) == losses(unbroken)
    assert checkpoint.steps_on_disk(ckpt) == [STEPS] and not leftovers(ckpt)


def test_damaged_newest_checkpoint_falls_back_and_cut_metrics_line_is_dropped(
    unbroken, tmp_path, cache
):
    cmd, run_dir = _killed(tmp_path, cache, "latest_written:4", "checkpoint.keep=2")
    ckpt = run_dir / "checkpoints"
    assert checkpoint.steps_on_disk(ckpt) == [2, 4]
    shard = next(checkpoint.step_dir(ckpt, 4).glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "loss": 5.4')  # a write cut by the kill
    assert checkpoint.latest_step(ckpt) == 2
    r = run(cmd, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"step_00000004 is damaged: {shard.name} is truncated" in r.stderr
    assert f"Resuming from {checkpoint.step_dir(ckpt, 2)} instead" in r.stderr
    assert "line(s) 5 cut short (a run killed mid-write): moved to" in r.stderr
    assert losses(run_dir) == losses(unbroken)


def test_resume_false_in_used_run_dir_is_refused(unbroken, tmp_path, cache):
    run_dir = tmp_path / "run"
    shutil.copytree(unbroken, run_dir)
    before = (run_dir / "metrics.jsonl").read_text()
    r = run(
        train_cmd(run_dir, cache, *COMMON, "checkpoint.resume=false", "train.steps=4"), tmp_path
    )
    assert r.returncode != 0
    assert (
        "checkpoint.resume=false but" in r.stderr
        and "Start a fresh run in a new run dir" in r.stderr
    )
    assert (run_dir / "metrics.jsonl").read_text() == before
    assert checkpoint.steps_on_disk(run_dir / "checkpoints") == [STEPS]
    assert (run_dir / "checkpoints" / "latest").read_text() == str(STEPS)
    r = run(train_cmd(run_dir, cache, *COMMON), tmp_path)  # the same run still resumes
    assert r.returncode == 0, r.stderr[-3000:]
    assert losses(run_dir) == losses(unbroken)


def test_extending_steps_keeps_the_checkpoints_schedule(tmp_path, cache):
    run_dir = tmp_path / "run"
    cmd = lambda steps: train_cmd(
        run_dir, cache, "precision=bf16", f"train.steps={steps}", "logging.wandb.mode=disabled"
    )
    assert run(cmd(4), tmp_path).returncode == 0
    first = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    r = run(cmd(6), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "LR schedule continues the checkpoint's: cosine decay over 4 steps" in r.stdout
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[:4] == first and [row["step"] for row in rows] == list(range(1, 7))
    assert [row["lr"] for row in rows[3:]] == pytest.approx([3e-5] * 3)  # at min_lr


# the plain optimizer's variant (Float16Optimizer) runs in `make test-slow`; the distributed
# one, the trainer's default, in make test (its 20-minute budget)
@pytest.mark.parametrize(
    "optimizer", ["distributed", pytest.param("plain", marks=pytest.mark.slow)]
)
def test_bf16_params_resume_exactly_with_either_optimizer(tmp_path, cache, optimizer):
    """The GPU runs' dtype: bf16 parameters (norms too, as Megatron-LM's Float16Module casts
    them), whose non-distributed optimizer is Megatron's Float16Optimizer: its checkpoint
    failed on an fp32 norm weight ("Param id 10 does not match any model sharded param",
    seen on the H200). SIGKILL after the step-4 save, rerun: the unbroken run's losses."""
    extra = ["train.dtype=bf16"] + (
        ["parallel.distributed_optimizer=false"] if optimizer == "plain" else []
    )
    whole = run(train_cmd(tmp_path / "whole", cache, *COMMON, *extra), tmp_path)
    assert whole.returncode == 0, whole.stderr[-3000:]
    cmd, run_dir = _killed(tmp_path, cache, "latest_written:4", *extra)
    r = run(cmd, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert losses(run_dir) == losses(tmp_path / "whole")

"""The checkpoint dir's rules, on real files, in process (train/checkpoint.py, train/logs/metrics.py).

test_prune_by_integer_step_never_newer      retention deletes only steps older than the
    one just saved, by number (step_100000000 sorts before step_99999999 by name)
test_prune_leaves_no_half_deleted_step       a dir being deleted is renamed first
test_resume_false_over_used_dir_is_refused   one line, says how to start fresh
test_no_intact_checkpoint_is_refused         damaged dirs only: refuse, name them
test_check_layout_refusals                   pp or ep change, distributed optimizer on/off,
    dp_reshardable at another TP
test_check_layout_allows_what_megatron_reshards   DP changes; TP changes in model space
test_metrics_partial_last_line_dropped       a line cut by a kill: moved to metrics.jsonl.bad,
    warned, rest kept; records past the checkpoint to metrics.jsonl.superseded
test_read_metrics_skips_a_line_being_written, test_read_metrics_names_a_damaged_line
"""

from __future__ import annotations

import json

import pytest

from ufp4_megatron.train import checkpoint
from ufp4_megatron.train.logs.metrics import MetricsFile, read_metrics


def _steps(d, *steps):
    for s in steps:
        checkpoint.step_dir(d, s).mkdir(parents=True)


def test_prune_by_integer_step_never_newer(tmp_path):
    _steps(tmp_path, 2, 4, 8, 10)
    assert checkpoint.prune(tmp_path, 4, keep=1) == [2]  # 8 and 10 are newer: kept
    assert checkpoint.steps_on_disk(tmp_path) == [4, 8, 10]
    _steps(tmp_path, 99_999_999, 100_000_000)
    assert checkpoint.prune(tmp_path, 100_000_000, keep=2) == [4, 8, 10]
    assert checkpoint.steps_on_disk(tmp_path) == [99_999_999, 100_000_000]
    assert checkpoint.prune(tmp_path, 100_000_000, keep=0) == []  # keep <= 0: keep all


def test_prune_leaves_no_half_deleted_step(tmp_path):
    _steps(tmp_path, 2, 4)
    (tmp_path / "step_00000002.deleting").mkdir()  # left by a kill mid-delete
    checkpoint.prune(tmp_path, 4, keep=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000004"]


def test_resume_false_over_used_dir_is_refused(tmp_path):
    checkpoint.check_start(tmp_path / "absent", resume=False)  # nothing there: fine
    _steps(tmp_path, 8, 10)
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.check_start(tmp_path, resume=False)
    msg = str(e.value)
    assert "steps 8, 10" in msg and "new run dir" in msg and "\n" not in msg
    assert checkpoint.steps_on_disk(tmp_path) == [8, 10]


def test_no_intact_checkpoint_is_refused(tmp_path):
    _steps(tmp_path, 3)
    (tmp_path / "latest").write_text("5")
    assert checkpoint.latest_step(tmp_path) is None
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.check_start(tmp_path, resume=True)
    msg = str(e.value)
    assert "names step 5" in msg and "step_00000003 is damaged: no metadata.json" in msg


LAYOUT = {
    "tp": 2,
    "pp": 1,
    "ep": 1,
    "dp": 2,
    "world_size": 4,
    "distributed_optimizer": True,
    "optim_sharding": "dp_reshardable",
}


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(pp=2, world_size=8), "changing parallel.pp"),
        (dict(distributed_optimizer=False, optim_sharding=None), "switching the distributed"),
        (dict(tp=1, dp=4), "dp_reshardable state can change only the data-parallel size"),
        (dict(ep=2), "changing parallel.ep"),
        (dict(ep=2, distributed_optimizer=False, optim_sharding=None), "changing parallel.ep"),
    ],
)
def test_check_layout_refusals(tmp_path, change, match):
    with pytest.raises(checkpoint.CheckpointError, match=match) as e:
        checkpoint.check_layout(LAYOUT, LAYOUT | change, tmp_path)
    assert "Resume with parallel.tp=2 parallel.pp=1" in str(e.value)


@pytest.mark.parametrize(
    "saved, now",
    [
        (LAYOUT, LAYOUT | dict(dp=1, world_size=2)),  # DP change, dp_reshardable
        (LAYOUT | dict(optim_sharding="fully_reshardable"), LAYOUT | dict(tp=1, dp=4)),
        (
            LAYOUT | dict(distributed_optimizer=False, optim_sharding=None),
            LAYOUT | dict(tp=1, dp=4, distributed_optimizer=False, optim_sharding=None),
        ),
    ],
)
def test_check_layout_allows_what_megatron_reshards(tmp_path, saved, now):
    checkpoint.check_layout(saved, now, tmp_path)


def test_metrics_partial_last_line_dropped(tmp_path, capsys):
    f = tmp_path / "metrics.jsonl"
    rows = [json.dumps({"step": s, "loss": 1.0 / s}) for s in (1, 2, 3, 4)]
    f.write_text("\n".join(rows) + '\n{"step": 5, "lo')
    m = MetricsFile(f, resumed_step=3)
    m.write({"step": 4, "loss": 0.5})
    m.close()
    assert [r["step"] for r in read_metrics(f)] == [1, 2, 3, 4]
    assert read_metrics(f)[-1]["loss"] == 0.5
    err = capsys.readouterr().err
    assert "line(s) 5 cut short (a run killed mid-write): moved to" in err
    assert (tmp_path / "metrics.jsonl.bad").read_text() == '{"step": 5, "lo\n'  # kept aside
    assert json.loads((tmp_path / "metrics.jsonl.superseded").read_text())["step"] == 4


def test_read_metrics_skips_a_line_being_written(tmp_path):
    f = tmp_path / "metrics.jsonl"
    f.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')
    assert read_metrics(f) == [{"step": 1, "loss": 2.0}]


def test_read_metrics_names_a_damaged_line(tmp_path):
    f = tmp_path / "metrics.jsonl"
    f.write_text('{"step": 1}\n{"st\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON step record \(1 "):
        read_metrics(f)


def test_read_metrics_notes_a_cut_last_line_before_trailing_blank_lines(tmp_path):
    f = tmp_path / "metrics.jsonl"
    f.write_text('{"step": 1}\n{"st\n\n')
    notes = []
    assert read_metrics(f, note=notes.append) == [{"step": 1}]
    assert notes == [f"{f}: skipped a partial last line (a run killed mid-write)"]


def test_unreadable_config_yaml_is_one_line(tmp_path):
    """A hand-edited or truncated config.yaml in a run dir: one line naming the file and what
    to do (the YAML parser's message spans several lines; found by docs/reliability.md)."""
    from ufp4_megatron.train.rundir.resume_check import _load
    from ufp4_megatron.train.validate import ConfigError

    bad = tmp_path / "config.yaml"
    bad.write_text("model:\n  name: tiny\n train: [unclosed\n")
    with pytest.raises(ConfigError) as e:
        _load(bad)
    msg = str(e.value)
    assert "\n" not in msg and str(bad) in msg and "repair or remove it" in msg


def test_ctrl_c_while_the_writer_queue_starts_is_blocked_not_ignored(monkeypatch):
    """While Megatron's writer Manager starts (seconds on a loaded machine), SIGINT is blocked,
    not ignored: a Ctrl-C then stays pending for the trainer, where an ignored one was dropped;
    SIGTERM and SIGUSR1 are ignored, which the Manager inherits. Everything is restored after."""
    import signal

    import megatron.core.dist_checkpointing.strategies.filesystem_async as fa

    from ufp4_megatron.train import checkpoint

    seen = {}

    def start():
        seen["blocked"] = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        seen["int"] = signal.getsignal(signal.SIGINT)
        seen["term"] = signal.getsignal(signal.SIGTERM)

    def on_int(signum, frame):  # the trainer's own handler (a pytest-xdist worker ignores SIGINT)
        pass

    original = signal.signal(signal.SIGINT, on_int)
    try:
        before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
        monkeypatch.setattr(fa, "get_write_results_queue", start)
        checkpoint.start_checkpoint_writer_queue()
        after = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGINT, original)
    assert seen["blocked"] and seen["int"] is on_int
    assert seen["term"] == signal.SIG_IGN
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert after == before

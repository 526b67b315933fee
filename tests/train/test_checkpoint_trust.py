"""A run dir is not trusted: what the trainer reads from it is checked, in process, on files.

Each test is a case tried as an attacker, a typo or a second job would; none runs a trainer
(test_checkpoint_misuse.py has the cases that need one).

    test_planted_pickle_in_metadata_is_refused_not_run      `.metadata` = pickle of os.system
    test_restricted_unpickling_refuses_code_but_reads_data  pickle, torch.load, numpy objects
    test_te_extra_state_with_a_custom_recipe_is_read        the TE route's recipe and factory,
        and no other function of the plugin
    test_garbage_metadata_json_is_damage_and_the_older_step_is_tried
    test_latest_with_a_path_or_a_huge_number_is_ignored     `latest` = "../..", 5000 digits
    test_a_symlinked_step_dir_is_damaged_and_pruning_never_follows_it
    test_latest_naming_removed_steps_is_refused              no silent restart from step 0
    test_manifest_listing_problems_are_damage                planted common.pt, missing file,
        garbage integrity.json
    test_checksum_shares_cover_every_file_once               hashing split over any world size
    test_a_checksum_mismatch_names_the_file
    test_another_runs_checkpoint_is_refused_naming_both      identity, instance, copies pass
    test_second_lock_is_refused_naming_the_holder, test_stale_lock_is_taken_over,
    test_a_lock_file_that_is_a_directory_or_a_link_is_refused
    test_metrics_bad_middle_line_and_string_step_are_kept_aside
    test_a_symlink_at_a_run_dir_file_is_refused              metrics.jsonl -> elsewhere
    test_names_that_would_leave_runs_are_refused
    test_os_reason_finds_the_disk_error_in_a_wrapped_failure
    test_ranks_that_see_different_files_are_named
    test_a_non_finite_loss_stops_with_one_line
    test_a_cut_or_foreign_index_cache_file_is_rebuilt        Megatron's GPTDataset cache; a
        second job building it waits for the first
    test_the_watchdog_kills_helpers_of_a_killed_process
"""

from __future__ import annotations

import json
import math
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from ufp4_megatron.train import checkpoint, trust
from ufp4_megatron.train.logs.metrics import MetricsFile, read_metrics
from ufp4_megatron.train.rundir import names, run_lock


class Payload:
    """What an attacker plants: unpickling it runs a command (here: touch a marker file)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def fake_step(ckpt: Path, step: int, **files: bytes) -> Path:
    """A step dir with a valid torch_dist metadata.json and the given files."""
    d = checkpoint.step_dir(ckpt, step)
    d.mkdir(parents=True)
    (d / "metadata.json").write_text(
        '{"sharded_backend": "torch_dist", "sharded_backend_version": 1}'
    )
    for name, data in files.items():
        (d / name.replace("_dot_", ".")).write_bytes(data)
    return d


def test_planted_pickle_in_metadata_is_refused_not_run(tmp_path):
    marker = tmp_path / "PWNED"
    fake_step(tmp_path, 4, _dot_metadata=pickle.dumps(Payload(marker)))
    with pytest.raises(checkpoint.Tampered) as e:
        checkpoint.check_start(tmp_path, resume=True)
    msg = str(e.value)
    assert "names posix.system" in msg and "step_00000004" in msg and "\n" not in msg
    assert not marker.exists()  # the command never ran
    with pytest.raises(checkpoint.Tampered):
        checkpoint.latest_step(tmp_path)  # what report.mechanism asks first
    assert not marker.exists()


def test_restricted_unpickling_refuses_code_but_reads_data(tmp_path):
    import io

    marker = tmp_path / "PWNED"
    evil = pickle.dumps(Payload(marker))
    buf = io.BytesIO()
    torch.save({"w": torch.arange(4.0), "rng": np.random.get_state(), "n": 3}, buf)
    with trust.restricted() as scope:
        with pytest.raises(trust.ForbiddenGlobal, match="posix.system"):
            pickle.loads(evil)
        with pytest.raises(Exception):  # noqa: B017 - torch wraps it; scope.refused names it
            torch.load(io.BytesIO(evil), weights_only=False)
        with pytest.raises(trust.ForbiddenGlobal):  # an object array's items too
            pickle.loads(pickle.dumps(np.array([Payload(marker)], dtype=object)))
        assert scope.refused == "posix.system"
        buf.seek(0)
        back = torch.load(buf, weights_only=False)  # tensors, numpy RNG state: plain data
    assert torch.equal(back["w"], torch.arange(4.0)) and back["n"] == 3
    assert not marker.exists()
    pickle.loads(pickle.dumps(os.getcwd))  # outside the block nothing is restricted


def test_te_extra_state_with_a_custom_recipe_is_read():
    """A TE module's extra state under the TE route pickles TE's CustomRecipe and the plugin's
    factory (by name): a resume reads both, as it reads everything Megatron-Core's own
    extra-state allowlist accepts, and still refuses any other callable of the plugin."""
    from megatron.core.safe_globals import SafeUnpickler

    from ufp4_megatron.te.factories import factory_path, resolve

    # GLOBAL transformer_engine.common.recipe.CustomRecipe, then NEWOBJ (): built without TE
    # here, so the import fails after the allowlist passed it
    custom_recipe = b"\x80\x02ctransformer_engine.common.recipe\nCustomRecipe\n)\x81."
    with trust.restricted() as scope:
        back = pickle.loads(pickle.dumps({"qfactory": resolve("ufp4"), "n": 4}))
        try:
            pickle.loads(custom_recipe)
        except ImportError:  # TransformerEngine is not installed here
            pass
        assert scope.refused is None
        with pytest.raises(trust.ForbiddenGlobal, match="factory_path"):
            pickle.loads(pickle.dumps(factory_path))
    assert back["qfactory"] is resolve("ufp4")
    assert SafeUnpickler._SAFE_CLASSES <= trust.ALLOWED


def test_garbage_metadata_json_is_damage_and_the_older_step_is_tried(tmp_path):
    bad = fake_step(tmp_path, 6)
    (bad / "metadata.json").write_bytes(b"\x00garbage{")
    fake_step(tmp_path, 4)  # no .metadata: damaged too, but it must have been looked at
    found = checkpoint.find(tmp_path)
    assert found.step is None
    assert (
        "step_00000006 is damaged: metadata.json is not Megatron's JSON config" in found.skipped[0]
    )
    assert "step_00000004 is damaged: .metadata unreadable" in found.skipped[1]


@pytest.mark.parametrize("text", ["../..", "9" * 5000, "6\n" + "x" * (1 << 20)])
def test_latest_with_a_path_or_a_huge_number_is_ignored(tmp_path, text):
    fake_step(tmp_path, 2)
    (tmp_path / "latest").write_text(text)
    step, note = checkpoint.read_latest(tmp_path)
    assert step is None and "not a step number: ignored" in note and len(note) < 300
    assert "not a step number" in checkpoint.find(tmp_path).skipped[0]


def test_a_symlinked_step_dir_is_damaged_and_pruning_never_follows_it(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "step_00000002").symlink_to(victim)
    fake_step(ckpt, 4)
    assert checkpoint.steps_on_disk(ckpt) == [2, 4]
    assert "is a symbolic link (to" in checkpoint.damage(checkpoint.step_dir(ckpt, 2))
    assert checkpoint.prune(ckpt, 4, keep=1) == [2]
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_00000004"]  # no .deleting left
    assert (victim / "precious").read_text() == "keep me"


def test_latest_naming_removed_steps_is_refused(tmp_path):
    (tmp_path / "latest").write_text("6")
    for resume in (True, False):
        with pytest.raises(
            checkpoint.CheckpointError,
            match=r"names step 6 but .* holds no "
            r"step dir: its checkpoints were removed",
        ) as e:
            checkpoint.check_start(tmp_path, resume=resume)
        assert "remove" in str(e.value) and "\n" not in str(e.value)


def _manifested(tmp_path) -> Path:
    d = fake_step(tmp_path, 4, _dot_metadata=b"m", __0_0_dot_distcp=b"x" * 1000)
    digests = trust.hash_share(d, 0, 1)
    (d / trust.MANIFEST).write_text(trust.manifest_text(digests))
    assert set(trust.read(d)) == {".metadata", "__0_0.distcp", "metadata.json"}
    return d


def test_manifest_listing_problems_are_damage(tmp_path):
    d = _manifested(tmp_path)
    assert trust.listing_problem(d, trust.read(d)) is None
    (d / "common.pt").write_bytes(pickle.dumps({"ufp4.step": 99}))  # Megatron reads it first
    assert "holds common.pt, which its integrity.json does not list" in checkpoint.damage(d)
    (d / "common.pt").unlink()
    (d / "__0_0.distcp").unlink()
    assert checkpoint.damage(d) == "__0_0.distcp is missing (listed in integrity.json)"
    (d / trust.MANIFEST).write_text("{not json")
    assert checkpoint.damage(d).startswith("integrity.json is not JSON")


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_checksum_shares_cover_every_file_once(world):
    files = [f"__{r}_{i}.distcp" for r in range(4) for i in range(2)] + [
        ".metadata",
        "metadata.json",
    ]
    shares = [trust.share(files, r, world) for r in range(world)]
    assert sorted(f for s in shares for f in s) == sorted(files)
    if world >= 4:  # each rank hashes the files it wrote itself
        assert {"__1_0.distcp", "__1_1.distcp"} <= set(shares[1])


def test_a_checksum_mismatch_names_the_file(tmp_path):
    d = _manifested(tmp_path)
    data = bytearray((d / "__0_0.distcp").read_bytes())
    data[100:200] = bytes(100)  # zeroed inside, size unchanged
    (d / "__0_0.distcp").write_bytes(bytes(data))
    problem = trust.verify_share(d, trust.read(d), 0, 1)
    assert problem.startswith("__0_0.distcp does not match its sha256 in integrity.json")
    assert trust.verify_share(d, trust.read(d), 1, 2) is None  # rank 1's share is ok


def test_another_runs_checkpoint_is_refused_naming_both(tmp_path):
    from ufp4_megatron.train.footprint import load_config

    ufp4, bf16 = load_config(["precision=ufp4"]), load_config(["precision=bf16"])
    sibling = tmp_path / "bf16_run"
    (sibling / "checkpoints").mkdir(parents=True)
    (sibling / "config.yaml").write_text("x")
    common = {"ufp4.run": checkpoint.owner(bf16, sibling)}
    me = tmp_path / "ufp4_run"
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.check_owner(common, checkpoint.owner(ufp4, me), sibling / "checkpoints", me)
    msg = str(e.value)
    assert "holds the checkpoints of another run" in msg and str(sibling) in msg
    assert str(me) in msg and "precision.name" in msg
    twin = load_config(["precision=bf16"])  # the same config in another run dir
    with pytest.raises(checkpoint.CheckpointError, match="not of this run dir"):
        checkpoint.check_owner(common, checkpoint.owner(twin, me), sibling / "checkpoints", me)
    copy = tmp_path / "copied_run"  # a copied (or moved) run dir resumes its own copy
    checkpoint.check_owner(common, checkpoint.owner(twin, copy), copy / "checkpoints", copy)
    checkpoint.check_owner({}, checkpoint.owner(ufp4, me), sibling, me)  # saved before: passes


def test_second_lock_is_refused_naming_the_holder(tmp_path):
    import socket

    held = run_lock.take(tmp_path, "run dir")
    try:
        with pytest.raises(checkpoint.CheckpointError) as e:
            run_lock.take(tmp_path, "run dir")
        msg = str(e.value)
        assert f"pid {os.getpid()} on host {socket.gethostname()}" in msg
        assert "in use by another trainer" in msg and "\n" not in msg
    finally:
        held.release()
    assert not (tmp_path / run_lock.NAME).exists()  # removed by its holder
    run_lock.take(tmp_path, "run dir").release()  # free again


def test_stale_lock_is_taken_over(tmp_path, capsys):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer runs
    (tmp_path / run_lock.NAME).write_text(json.dumps({"pid": dead.pid, "host": "h"}))
    held = run_lock.take(tmp_path, "run dir")
    assert f"was left by pid {dead.pid} on host h" in capsys.readouterr().out
    assert json.loads((tmp_path / run_lock.NAME).read_text())["pid"] == os.getpid()
    held.release()


def test_a_lock_file_that_is_a_directory_or_a_link_is_refused(tmp_path):
    (tmp_path / "a" / run_lock.NAME).mkdir(parents=True)
    with pytest.raises(checkpoint.CheckpointError, match="is a directory, not a lock file"):
        run_lock.take(tmp_path / "a", "run dir")
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / run_lock.NAME).symlink_to(victim)
    with pytest.raises(checkpoint.CheckpointError, match="is a symbolic link"):
        run_lock.take(tmp_path / "b", "run dir")
    assert victim.read_text() == "keep me"


def test_metrics_bad_middle_line_and_string_step_are_kept_aside(tmp_path, capsys):
    f = tmp_path / "metrics.jsonl"
    f.write_text(
        '{"step": 1, "loss": 3.0}\n{"step": 2, "lo\n{"step": "3", "loss": 2.0}\n'
        '{"step": 4, "loss": 1.5}\n'
    )
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON step record \(2 "):
        read_metrics(f)  # compare & co. refuse it rather than guess
    MetricsFile(f, resumed_step=4).close()
    err = capsys.readouterr().err
    assert "line(s) 2, 3 not JSON step records (damaged or edited): moved to" in err
    assert (
        tmp_path / "metrics.jsonl.bad"
    ).read_text() == '{"step": 2, "lo\n{"step": "3", "loss": 2.0}\n'
    assert [r["step"] for r in read_metrics(f)] == [1, 4]


def test_a_symlink_at_a_run_dir_file_is_refused(tmp_path):
    from ufp4_megatron.train.footprint import load_config
    from ufp4_megatron.train.rundir.resume_check import plan_start
    from ufp4_megatron.train.validate import ConfigError

    victim = tmp_path / "bashrc"
    victim.write_text("keep me\n")
    for name in ("metrics.jsonl", "resumes.jsonl", "config.yaml"):
        run = tmp_path / name.replace(".", "_")
        run.mkdir()
        (run / name).symlink_to(victim)
        with pytest.raises(ConfigError, match=f"{name} is a symbolic link"):
            plan_start(load_config(["checkpoint.keep=1"]), run)
    assert victim.read_text() == "keep me\n"


@pytest.mark.parametrize(
    "override",
    [
        "experiment=../../x",
        "precision.name=../../../x",
        "model.name=a/b",
        "experiment=",
        "experiment=..",
        "experiment='a\tb'",
        "hydra.run.dir=",
        "hydra.run.dir=' '",
    ],
)
def test_names_that_would_leave_runs_are_refused(override):
    problem = names.overrides_problem(["model=tiny", override])
    assert problem and "\n" not in problem
    assert names.overrides_problem(["experiment=my-study_2", "precision.name=ufp4.v2"]) is None


def test_os_reason_finds_the_disk_error_in_a_wrapped_failure():
    from torch.distributed.checkpoint.api import CheckpointException

    full = OSError(28, "No space left on device")
    wrapped = CheckpointException("write failed", {0: (RuntimeError("worker"), None)})
    wrapped.failures[0][0].__cause__ = full
    assert checkpoint.os_reason(wrapped) == "No space left on device (ENOSPC)"
    assert (
        checkpoint.os_reason(RuntimeError("[Errno 30] Read-only file system: '/x'"))
        == "Read-only file system (EROFS)"
    )
    assert checkpoint.os_reason(RuntimeError("a bug")) is None


def test_ranks_that_see_different_files_are_named():
    assert checkpoint.disagreement("x", [[2, 4], [2, 4]]) is None
    msg = checkpoint.disagreement("the step dirs of /c", [[2, 4], [2, 4], [2], [2, 4]])
    assert "rank 0 sees [2, 4], rank 2 sees [2]" in msg


def test_a_non_finite_loss_stops_with_one_line(tmp_path):
    from ufp4_megatron.train.loop import _stop_if_not_finite, _stop_if_params_not_finite

    _stop_if_not_finite(3, {"loss": 2.5, "grad_norm": 1.0}, tmp_path)
    fake_step(tmp_path, 2)
    with pytest.raises(checkpoint.RunFailed) as e:
        _stop_if_not_finite(3, {"loss": math.nan, "grad_norm": math.inf}, tmp_path)
    msg = str(e.value)
    assert msg.startswith("step 3: loss is nan, grad_norm is inf; stopped without saving")
    assert "step_00000002, is kept as it was" in msg and "\n" not in msg
    model = torch.nn.Linear(2, 2)  # optim.lr=inf: a finite loss, weights that are not
    _stop_if_params_not_finite(1, model, None, tmp_path)
    with torch.no_grad():
        model.weight[0, 0] = math.inf
    with pytest.raises(checkpoint.RunFailed, match="step 1: the model's weights hold NaN or Inf"):
        _stop_if_params_not_finite(1, model, None, tmp_path)


def test_a_cut_or_foreign_index_cache_file_is_rebuilt(tmp_path, capsys):
    from ufp4_megatron.data import index_cache
    from ufp4_megatron.data.datasets import build_datasets
    from ufp4_megatron.train.footprint import load_config

    data = load_config(
        [f"data.cache_dir={tmp_path}", "data.corpus_max_bytes=200000", "data.split='80,20,0'"]
    ).data
    args = dict(seed=1, seq_len=32, vocab_size=512, n_train=64, n_valid=8)
    first = [int(x) for x in build_datasets(data, **args)[0][5]["tokens"][:8]]
    npys = sorted((tmp_path / "index").rglob("*-sample_index.npy"))
    assert npys
    cut = npys[0]
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])  # killed mid-write
    assert "cut short" in index_cache.npy_problem(cut)
    again = build_datasets(data, **args)[0]  # Megatron failed here: mmap length > file size
    assert [int(x) for x in again[5]["tokens"][:8]] == first
    assert index_cache.npy_problem(cut) is None
    assert f"{cut} it is cut short" in capsys.readouterr().err
    np.save(cut, np.array([Payload(tmp_path / "PWNED")], dtype=object), allow_pickle=True)
    assert "Python objects" in index_cache.npy_problem(cut)
    cut.write_bytes(pickle.dumps(Payload(tmp_path / "PWNED")))  # not even an array
    assert index_cache.npy_problem(cut) == "not a .npy array file"
    build_datasets(data, **args)
    assert index_cache.npy_problem(cut) is None and not (tmp_path / "PWNED").exists()
    # a second job building the same cache waits for the first (here: the test holds it)
    import fcntl
    import threading

    fd = os.open(cut.parent / index_cache.LOCK, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    built = []
    t = threading.Thread(target=lambda: built.append(build_datasets(data, **args)))
    t.start()
    time.sleep(1.0)
    waited = t.is_alive() and not built
    os.close(fd)
    t.join(120)
    assert (
        waited
        and built
        and "another job is building Megatron's index cache" in capsys.readouterr().err
    )


_KILLED_PARENT = r"""
import os, signal, subprocess, sys, time
from ufp4_megatron.train.lifetime import reap_with_me
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
reap_with_me([helper.pid])
print(helper.pid, flush=True)
time.sleep(0.5)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_watchdog_kills_helpers_of_a_killed_process(tmp_path):
    r = subprocess.run(
        [sys.executable, "-c", _KILLED_PARENT],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert r.returncode == -signal.SIGKILL, r.stderr
    helper = int(r.stdout.split()[0])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{helper}").exists() and time.monotonic() < deadline:
        state = Path(f"/proc/{helper}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            break
        time.sleep(0.1)
    alive = (
        Path(f"/proc/{helper}").exists()
        and Path(f"/proc/{helper}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    )
    if alive:
        os.kill(helper, signal.SIGKILL)
    assert not alive

"""Start, resume or refuse: decided from the run dir before anything is written to it.

    plan = resume_check.plan_start(cfg, run_dir)    reads only; ConfigError when refused
    resume_check.record(plan, config_yaml, hydra)   writes config.yaml, .hydra/, resumes.jsonl

A run dir holds one run: `config.yaml` is the resolved config it was started with. A new
command in the same dir (the same command again, a requeue, or an explicit hydra.run.dir)
is checked against it:

- a difference in the run's identity (train/rundir/identity.py: model, precision, data, optim,
  seed, seq_len, global batch) is refused, naming the keys: that is another run (unless the
  dir holds neither a checkpoint nor metrics: a start that failed before its first step);
- a checkpoint to resume from but no config.yaml beside it is refused (nothing to check);
- anything else (train.steps extended, log/eval/checkpoint intervals, micro_batch, parallel
  layout) resumes, and the changed keys are appended to resumes.jsonl with the step;
- a run whose checkpoint already reached train.steps does nothing and says so.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..validate import ConfigError
from . import identity

CONFIG = "config.yaml"
HISTORY = "resumes.jsonl"
METRICS = "metrics.jsonl"


@dataclass(frozen=True)
class StartPlan:
    run_dir: Path
    ckpt_dir: Path
    step: int  # the checkpoint's step to resume from; 0 for a fresh start
    total: int  # train.steps
    changes: dict[str, list] = field(default_factory=dict)  # key: [stored, new], non-identity

    @property
    def complete(self) -> bool:
        return self.step > 0 and self.step >= self.total

    def message(self) -> str:
        if self.complete:
            return f"already complete at step {self.step}: nothing to do ({self.run_dir})"
        if self.step == 0:
            return f"starting {self.run_dir} (train.steps={self.total})"
        changed = "; ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in self.changes.items())
        return f"resuming from step {self.step} of {self.total} in {self.run_dir}" + (
            f" (changed: {changed})" if changed else ""
        )


def checkpoint_dir(cfg, run_dir: Path) -> Path:
    return Path(cfg.checkpoint.dir or Path(run_dir) / "checkpoints")


def _stored_checkpoint_dir(stored: Mapping, run_dir: Path) -> Path:
    """The checkpoint dir a stored config.yaml trained with."""
    return Path(((stored.get("checkpoint") or {}).get("dir")) or Path(run_dir) / "checkpoints")


# the files the trainer writes in a run dir: it never follows a link there (a link planted
# at one of these names would make it write, append or read elsewhere)
WRITTEN = (CONFIG, METRICS, HISTORY, ".hydra", "metrics.jsonl.bad", "metrics.jsonl.superseded")


def check_run_dir_files(run_dir: Path) -> None:
    for name in WRITTEN:
        p = Path(run_dir) / name
        if p.is_symlink():
            raise ConfigError(
                f"{p} is a symbolic link (to {os.readlink(p)}); the trainer "
                "writes its run dir's files itself and never through a link: "
                "remove it"
            )
        if name != ".hydra" and p.exists() and not p.is_file():
            raise ConfigError(f"{p} is not a regular file; remove it")


def plan_start(cfg, run_dir: Path) -> StartPlan:
    """What starting `cfg` in `run_dir` means; raises ConfigError when it must not start."""
    from ..checkpoint import CheckpointError, check_owner, check_start, owner, steps_on_disk

    run_dir = Path(run_dir)
    ckpt_dir = checkpoint_dir(cfg, run_dir)
    check_run_dir_files(run_dir)
    stored = _load(run_dir / CONFIG)
    if stored is not None:  # the checkpoints of this run dir are where it trained them
        theirs = _stored_checkpoint_dir(stored, run_dir)
        if theirs.resolve() != ckpt_dir.resolve() and (
            steps_on_disk(theirs) or (theirs / "latest").exists()
        ):
            raise ConfigError(
                f"{run_dir} keeps its checkpoints in {theirs} (its {CONFIG}), but this start "
                f"uses {ckpt_dir}: it would start or resume this run from another dir's "
                f"steps and cut its {METRICS}. Drop the checkpoint.dir override (or set "
                f"checkpoint.dir={theirs}); to move the checkpoints, move the step dirs and "
                f"`latest` from {theirs} to {ckpt_dir} first"
            )
    # a checkpoint converted from Megatron-LM's layout (train/checkpoint_megatron_lm.py) that
    # this run dir has not trained from yet pins no config: a start refused before step 1
    # (say, for a model its tensors do not fit) must not keep the right one out
    fresh_conversion = (
        not _has_lines(run_dir / METRICS) and bool(steps_on_disk(ckpt_dir)) and _converted(ckpt_dir)
    )
    trained = (bool(steps_on_disk(ckpt_dir)) and not fresh_conversion) or _has_lines(
        run_dir / METRICS
    )
    if stored is not None and trained:  # (a start that failed before step 1 pins nothing)
        differ = identity.differences(stored, cfg)
        if differ:
            raise ConfigError(
                f"{run_dir} holds another run: its {CONFIG} differs in {', '.join(differ)}. "
                "To start a fresh run, drop hydra.run.dir (the default dir follows the "
                "config) or give a new one; to continue that run, use its config"
            )
    try:  # resume=false over saved steps, no intact step left, another run's checkpoints:
        found = check_start(ckpt_dir, cfg.checkpoint.resume)  # refused before any write
        check_owner(found.common, owner(cfg, run_dir), ckpt_dir, run_dir)
    except CheckpointError as e:
        raise ConfigError(str(e)) from None
    step = found.step
    if not cfg.checkpoint.resume and _has_lines(run_dir / METRICS):
        raise ConfigError(
            f"checkpoint.resume=false but {run_dir} holds the {METRICS} of an earlier run; "
            f"starting over there would cut it. Start a fresh run in a new run dir "
            "(hydra.run.dir=... or another experiment=/seed), or delete that run dir; drop "
            "checkpoint.resume=false to continue the run"
        )
    if not cfg.checkpoint.resume:
        step = None
    if step is None:
        return StartPlan(run_dir, ckpt_dir, 0, cfg.train.steps)
    if fresh_conversion:  # no config trained it: this one is recorded; the load still
        return StartPlan(run_dir, ckpt_dir, step, cfg.train.steps)  # refuses another model
    if stored is None:
        raise ConfigError(
            f"{ckpt_dir} holds a checkpoint (step {step}) but {run_dir / CONFIG}, the config "
            "it was trained with, is missing, so the resume cannot be checked; resume in the "
            "run dir that wrote it, or set a new checkpoint.dir (or checkpoint.resume=false) "
            "to start fresh"
        )
    changes = _changed(stored, _as_dict(cfg))
    return StartPlan(run_dir, ckpt_dir, step, cfg.train.steps, changes)


def _converted(ckpt_dir: Path) -> bool:
    """Whether the newest intact step was converted from Megatron-LM's layout (a damaged or
    planted one is left to check_start, which says why)."""
    from ..checkpoint import PREFIX, CheckpointError, find

    try:
        return bool((find(ckpt_dir).common or {}).get(f"{PREFIX}.converted_from"))
    except CheckpointError:
        return False


def record(plan: StartPlan, config_yaml: str, hydra_files: Mapping[str, str]) -> None:
    """Writes the run dir's record of this start (call on one rank, after plan_start)."""
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    _write(plan.run_dir / CONFIG, config_yaml)
    for name, text in hydra_files.items():  # what Hydra writes when output_subdir is set
        (plan.run_dir / ".hydra").mkdir(exist_ok=True)
        _write(plan.run_dir / ".hydra" / name, text)
    if plan.step > 0:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "step": plan.step,
            "steps": plan.total,
            "changes": plan.changes,
            "argv": sys.argv[1:],
        }
        fd = os.open(
            plan.run_dir / HISTORY, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644
        )
        with os.fdopen(fd, "a") as f:
            f.write(json.dumps(entry, default=str) + "\n")


def _load(path: Path) -> dict | None:
    if not path.exists():
        return None
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as e:  # a truncated or hand-edited file: say which, on one line (the
        # YAML parser's own message spans several, with a caret under the column)
        why = " ".join(str(e).split())
        raise ConfigError(
            f"cannot read {path} ({type(e).__name__}: {why}); repair or remove "
            "it (it records the config this run dir was started with)"
        ) from None


def _has_lines(path: Path) -> bool:
    return path.exists() and path.stat().st_size > 0


def _as_dict(cfg) -> dict:
    import dataclasses

    return dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else dict(cfg)


def _changed(old: Mapping, new: Mapping) -> dict[str, list]:
    """Dotted keys whose value differs, {key: [old, new]} (identity keys are already equal)."""
    out: dict[str, list] = {}

    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            for k in sorted(set(a) | set(b)):
                walk(a.get(k), b.get(k), f"{path}.{k}" if path else k)
        elif a != b:
            out[path] = [a, b]

    walk(old, new, "")
    return out


def _write(path: Path, text: str) -> None:
    from ..checkpoint import write_atomic

    write_atomic(path, text, sync_dir=False)

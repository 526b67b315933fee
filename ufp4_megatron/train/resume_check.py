"""Start, resume or refuse: decided from the run dir before anything is written to it.

    plan = resume_check.plan_start(cfg, run_dir)    reads only; ConfigError when refused
    resume_check.record(plan, config_yaml, hydra)   writes config.yaml, .hydra/, resumes.jsonl

A run dir holds one run: `config.yaml` is the resolved config it was started with. A new
command in the same dir (the same command again, a requeue, or an explicit hydra.run.dir)
is checked against it:

- a difference in the run's identity (train/identity.py: model, precision, data, optim,
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from . import identity
from .validate import ConfigError

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
        return (f"resuming from step {self.step} of {self.total} in {self.run_dir}"
                + (f" (changed: {changed})" if changed else ""))


def checkpoint_dir(cfg, run_dir: Path) -> Path:
    return Path(cfg.checkpoint.dir or Path(run_dir) / "checkpoints")


def plan_start(cfg, run_dir: Path) -> StartPlan:
    """What starting `cfg` in `run_dir` means; raises ConfigError when it must not start."""
    from .checkpoint import CheckpointError, check_start, latest_step

    run_dir = Path(run_dir)
    ckpt_dir = checkpoint_dir(cfg, run_dir)
    try:  # resume=false over saved steps, or no intact step left: refused before any write
        check_start(ckpt_dir, cfg.checkpoint.resume)
    except CheckpointError as e:
        raise ConfigError(str(e)) from None
    stored = _load(run_dir / CONFIG)
    step = latest_step(ckpt_dir)
    trained = step is not None or _has_lines(run_dir / METRICS)
    if stored is not None and trained:  # (a start that failed before step 1 pins nothing)
        differ = identity.differences(stored, cfg)
        if differ:
            raise ConfigError(
                f"{run_dir} holds another run: its {CONFIG} differs in {', '.join(differ)}. "
                "To start a fresh run, drop hydra.run.dir (the default dir follows the "
                "config) or give a new one; to continue that run, use its config")
    if not cfg.checkpoint.resume:
        step = None
    if step is None:
        return StartPlan(run_dir, ckpt_dir, 0, cfg.train.steps)
    if stored is None:
        raise ConfigError(
            f"{ckpt_dir} holds a checkpoint (step {step}) but {run_dir / CONFIG}, the config "
            "it was trained with, is missing, so the resume cannot be checked; resume in the "
            "run dir that wrote it, or set a new checkpoint.dir (or checkpoint.resume=false) "
            "to start fresh")
    changes = _changed(stored, _as_dict(cfg))
    return StartPlan(run_dir, ckpt_dir, step, cfg.train.steps, changes)


def record(plan: StartPlan, config_yaml: str, hydra_files: Mapping[str, str]) -> None:
    """Writes the run dir's record of this start (call on one rank, after plan_start)."""
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    _write(plan.run_dir / CONFIG, config_yaml)
    for name, text in hydra_files.items():  # what Hydra writes when output_subdir is set
        (plan.run_dir / ".hydra").mkdir(exist_ok=True)
        _write(plan.run_dir / ".hydra" / name, text)
    if plan.step > 0:
        entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "step": plan.step,
                 "steps": plan.total, "changes": plan.changes, "argv": sys.argv[1:]}
        with open(plan.run_dir / HISTORY, "a") as f:
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
        raise ConfigError(f"cannot read {path} ({type(e).__name__}: {why}); repair or remove "
                          "it (it records the config this run dir was started with)") from None


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
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)

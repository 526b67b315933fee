"""<study>/study.json: the grid(s), each run's dir, overrides and status.

    {"version": 1, "name": ..., "reference": "bf16", "baseline": "e2m1", "last_frac": 0.2,
     "grids": [every grid this study was run with],
     "runs": [{"name", "arm", "seed", "axis", "overrides", "model", "recipe", "steps",
               "status", "attempts", "returncode", "slot", "started", "ended"}, ...]}

Status: pending (never started), running (a runner holds it, or was killed holding it),
stopped (stopped on a signal or the time limit, resumes from its checkpoint), failed (exited
non-zero), done. The files on disk decide: a run whose metrics.jsonl reaches its last step is
done whatever the manifest says; anything else is started again, and the trainer resumes it
from <run>/checkpoints.

Running a grid into a study dir that has a manifest adds its new runs (more seeds, more arms)
and keeps the old ones with their status; a run of the same name with other overrides is an
error, never a silent replacement.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from .grid import RunSpec, StudyGrid
from .resolve import RunInfo

VERSION = 1
FILE = "study.json"


def run_dir(study: Path, name: str) -> Path:
    return Path(study) / "runs" / name


def load(study: Path) -> dict | None:
    path = Path(study) / FILE
    if not path.exists():
        return None
    manifest = json.loads(path.read_text())
    if manifest.get("version") != VERSION:
        raise SystemExit(
            f"ufp4-launch study: {path} has version {manifest.get('version')}, "
            f"this runner reads version {VERSION}"
        )
    return manifest


def save(study: Path, manifest: dict) -> None:
    """Atomic: a reader (or a runner killed mid-write) never sees half a manifest."""
    path = Path(study) / FILE
    tmp = path.with_name(f"{FILE}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, path)


def merge(
    manifest: dict | None, grid: StudyGrid, runs: list[RunSpec], infos: dict[str, RunInfo]
) -> dict:
    """The manifest with this grid's runs added (existing runs keep their status)."""
    grid_record = asdict(grid)
    if manifest is None:
        manifest = {
            "version": VERSION,
            "name": grid.name,
            "reference": grid.reference,
            "baseline": grid.baseline,
            "last_frac": grid.last_frac,
            "grids": [],
            "runs": [],
        }
    elif (manifest["reference"], manifest["baseline"]) != (grid.reference, grid.baseline):
        raise SystemExit(
            f"ufp4-launch study: this study compares against reference "
            f"{manifest['reference']!r} and baseline {manifest['baseline']!r}; the "
            f"grid says {grid.reference!r} and {grid.baseline!r}: use another --out"
        )
    if grid_record not in manifest["grids"]:
        manifest["grids"].append(grid_record)
    by_name = {r["name"]: r for r in manifest["runs"]}
    for spec in runs:
        old = by_name.get(spec.name)
        if old is not None:
            if old["overrides"] != list(spec.overrides):
                changed = sorted(set(spec.overrides) ^ set(old["overrides"]))
                raise SystemExit(
                    f"ufp4-launch study: run {spec.name} is already in this study "
                    f"with other overrides (differing: {changed}); use another "
                    f"--out, or the overrides it was planned with"
                )
            continue
        info = infos[spec.name]
        record = {
            "name": spec.name,
            "arm": spec.arm,
            "seed": spec.seed,
            "axis": spec.axis,
            "overrides": list(spec.overrides),
            "model": info.model,
            "recipe": info.recipe,
            "steps": info.steps,
            "status": "pending",
            "attempts": 0,
            "returncode": None,
            "slot": None,
            "started": None,
            "ended": None,
        }
        manifest["runs"].append(record)
        by_name[spec.name] = record
    return manifest


def specs(manifest: dict) -> list[RunSpec]:
    """The manifest's runs as RunSpecs (what --resume plans from)."""
    return [
        RunSpec(
            name=r["name"],
            arm=r["arm"],
            seed=r["seed"],
            axis=r["axis"],
            overrides=tuple(r["overrides"]),
        )
        for r in manifest["runs"]
    ]


def last_step(path: Path) -> int:
    """The step of the last complete line of a metrics.jsonl (0 when none)."""
    path = Path(path)
    if not path.exists():
        return 0
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 8192))
        tail = f.read().split(b"\n")
    for line in reversed(tail[:-1]):  # the last piece is b"" or a line still being written
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError):
            continue
    return 0


LAUNCH = "launch.json"


def write_launch(run: Path, *, attempt: int, from_step: int, mps: bool = False) -> None:
    """<run>/launch.json: the trainer process started last, the step it starts from (0:
    from scratch) and whether it shared its GPU through CUDA MPS (mps.py). The process that
    completes a run is the last one started, so a complete run's launch.json says whether
    one process trained all its steps (from_step 0)."""
    path = Path(run) / LAUNCH
    tmp = path.with_name(f"{LAUNCH}.tmp{os.getpid()}")
    record = {"attempt": attempt, "from_step": from_step, "mps": mps}
    tmp.write_text(json.dumps(record) + "\n")
    os.replace(tmp, path)


def checkpoint_step(run: Path) -> int | None:
    f = Path(run) / "checkpoints" / "latest"
    return int(f.read_text()) if f.exists() else None


def is_complete(study: Path, record: dict) -> bool:
    """On disk: metrics.jsonl reaches the run's last step (the trainer logs the last step
    whatever logging.log_interval). Checkpoints do not count: a study may delete them to save
    space, or come back from a machine without them, and its runs are still complete."""
    return last_step(run_dir(study, record["name"]) / "metrics.jsonl") >= record["steps"]

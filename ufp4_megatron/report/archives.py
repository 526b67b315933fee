"""Runs read straight from a study's archives (`roundN.tar.gz`, as gpu/study.sh writes them and
docs/results/ commits them), without unpacking: per-step losses, the run's config, and how it
was trained (from which step each trainer process started).

    load_study(folder)   {run name: ArchivedRun} over every round*.tar.gz of one study folder

An archive holds, per completed run, runs/<name>/metrics.jsonl, runs/<name>/config.yaml and
logs/<name>.log (the runner's log: one header line per trainer process it started, "=====
<date> attempt K ... from step S: <argv>"), and with newer runners runs/<name>/launch.json
({"attempt": K, "from_step": S}) for the process that completed it. The same run in two
archives must have the same losses (a round repacked with runs of an earlier one); anything
else is a BadInput naming both.
"""

from __future__ import annotations

import json
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import BadInput

_HEADER = re.compile(rb"^===== .* attempt (\d+) .* from step (\d+): ", re.MULTILINE)
_RUN_FILE = re.compile(r"^(?:\./)?runs/([^/]+)/(metrics\.jsonl|config\.yaml|launch\.json)$")
_LOG_FILE = re.compile(r"^(?:\./)?logs/([^/]+)\.log$")


@dataclass
class ArchivedRun:
    name: str
    archive: str  # the archive it was read from
    config: dict  # its config.yaml
    loss: np.ndarray  # loss[i] = training loss at step i + 1 (NaN where not logged)
    val_loss: dict[int, float]  # step -> validation loss
    grad_norm: np.ndarray  # as loss
    logged: np.ndarray  # logged[i]: step i + 1 has a record with a loss
    # the steps each trainer process of the run started from, in order (from launch.json or
    # the runner's log headers); empty when neither was archived
    starts: list[int] = field(default_factory=list)
    corpus_sha256: str | None = None  # the archive's corpus.manifest.json (pysrc), if any

    @property
    def model(self) -> str:
        return self.config["model"]["name"]

    @property
    def recipe(self) -> str:
        return self.config["precision"]["name"]

    @property
    def seed(self) -> int:
        return int(self.config["train"]["seed"])

    @property
    def steps(self) -> int:
        return int(self.config["train"]["steps"])

    @property
    def complete(self) -> bool:
        """Every step 1..train.steps logged, with a finite loss."""
        return len(self.loss) == self.steps and bool(np.isfinite(self.loss).all())

    @property
    def diverged(self) -> bool:
        """Some logged loss is not finite (NaN or infinite)."""
        return bool((self.logged & ~np.isfinite(self.loss)).any())

    @property
    def one_process(self) -> bool | None:
        """Whether one trainer process trained every step (its last start was from step 0);
        None when the archive does not say."""
        return None if not self.starts else self.starts[-1] == 0


def _metrics(raw: bytes, source: str):
    """(loss, val_loss, grad_norm, logged) of a metrics.jsonl's bytes."""
    rows = {}
    for n, line in enumerate(raw.decode().splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            rows[int(r["step"])] = r
        except (ValueError, KeyError, TypeError):
            raise BadInput(f"{source}: line {n} of metrics.jsonl is not a step record") from None
    last = max(rows, default=0)
    loss, gnorm = np.full(last, np.nan), np.full(last, np.nan)
    logged = np.zeros(last, dtype=bool)
    val = {}
    for s, r in rows.items():
        if s >= 1 and r.get("loss") is not None:
            loss[s - 1] = float(r["loss"])
            gnorm[s - 1] = r.get("grad_norm", np.nan)
            logged[s - 1] = True
        if "val_loss" in r:
            val[s] = float(r["val_loss"])
    return loss, val, gnorm, logged


def _starts(log: bytes | None, launch: bytes | None) -> list[int]:
    """launch.json's start (the completing process's), else every header of the log."""
    if launch is not None:
        try:
            return [int(json.loads(launch)["from_step"])]
        except (ValueError, KeyError, TypeError):
            pass  # unreadable: the log's headers say the same
    return [int(m[2]) for m in _HEADER.finditer(log)] if log is not None else []


def read_archive(path: Path) -> dict[str, ArchivedRun]:
    """The runs with metrics and config in one archive."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's when built with it
    files: dict[str, dict[str, bytes]] = {}
    logs: dict[str, bytes] = {}
    corpus = None
    try:
        with tarfile.open(path) as tf:
            for m in tf:
                if not m.isfile():
                    continue
                if hit := _RUN_FILE.match(m.name):
                    files.setdefault(hit[1], {})[hit[2]] = tf.extractfile(m).read()
                elif hit := _LOG_FILE.match(m.name):
                    logs[hit[1]] = tf.extractfile(m).read()
                elif m.name.lstrip("./") == "corpus.manifest.json":
                    corpus = json.loads(tf.extractfile(m).read()).get("sha256")
    except (tarfile.TarError, OSError, ValueError) as e:  # ValueError: JSON
        raise BadInput(f"{path}: not a readable study archive ({e})") from None
    out = {}
    for name, f in files.items():
        if "metrics.jsonl" not in f or "config.yaml" not in f:
            continue
        config = yaml.load(f["config.yaml"], Loader=loader)  # the trainer's plain YAML dump
        loss, val, gnorm, logged = _metrics(f["metrics.jsonl"], f"{path}: {name}")
        out[name] = ArchivedRun(
            name=name,
            archive=str(path),
            config=config,
            loss=loss,
            val_loss=val,
            grad_norm=gnorm,
            logged=logged,
            starts=_starts(logs.get(name), f.get("launch.json")),
            corpus_sha256=corpus,
        )
    return out


def archives(folder: Path) -> list[Path]:
    """round*.tar.gz of a folder in round order (round2 before round10)."""

    def key(p: Path):
        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]

    return sorted(Path(folder).glob("round*.tar.gz"), key=key)


def load_study(folder: Path) -> dict[str, ArchivedRun]:
    """Every run of every archive of one study folder; a run in two archives must agree."""
    runs: dict[str, ArchivedRun] = {}
    for a in archives(folder):
        for name, run in read_archive(a).items():
            old = runs.get(name)
            if old is not None and not np.array_equal(old.loss, run.loss, equal_nan=True):
                raise BadInput(
                    f"run {name} differs between {old.archive} and {run.archive}: "
                    f"one study folder must hold each run once"
                )
            runs.setdefault(name, run)
    return runs

"""<run dir>/metrics.jsonl: one JSON object per logged step (the console view: log_line.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

BAD = ".bad"  # metrics.jsonl.bad: unreadable lines, as they were
SUPERSEDED = ".superseded"  # metrics.jsonl.superseded: records of steps trained again


class MetricsFile:
    """Appends step records. On resume the file is made to read as one unbroken run, and
    nothing recorded is dropped silently: records past the checkpoint's step (steps that
    train again) go to metrics.jsonl.superseded, unreadable lines (a line cut by a kill, a
    damaged or hand-edited one, a step that is not a number) to metrics.jsonl.bad, each with
    a line saying so. The file is rewritten atomically (a fresh temp file, renamed), and no
    link at its name is followed."""

    def __init__(self, path: Path, resumed_step: int):
        self.path = Path(path)
        if self.path.exists():
            rows, bad, last = _parse(self.path)
            lines = self.path.read_text(errors="replace").splitlines()
            if bad:
                _aside(self.path, BAD, [lines[n - 1] for n in bad])
                why = (
                    "cut short (a run killed mid-write)"
                    if bad == [last]
                    else "not JSON step records (damaged or edited)"
                )
                print(
                    f"WARNING: {self.path}: line(s) {', '.join(map(str, bad))} {why}: "
                    f"moved to {self.path}{BAD}; kept {len(rows)}",
                    file=sys.stderr,
                    flush=True,
                )
            past = [(line, row) for line, row in rows if row["step"] > resumed_step]
            if past:
                _aside(self.path, SUPERSEDED, [line for line, _ in past])
                steps = [row["step"] for _, row in past]
                where = (
                    f"the checkpoint's step {resumed_step}"
                    if resumed_step
                    else "step 0 (no checkpoint to resume)"
                )
                print(
                    f"note: {self.path}: {len(past)} record(s) of steps {min(steps)}-"
                    f"{max(steps)} are past {where}; those steps train again: moved to "
                    f"{self.path}{SUPERSEDED}",
                    file=sys.stderr,
                    flush=True,
                )
            if bad or past:
                from ..checkpoint import write_atomic

                kept = [line for line, row in rows if row["step"] <= resumed_step]
                write_atomic(self.path, "".join(line + "\n" for line in kept), sync_dir=False)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        self._f = os.fdopen(fd, "a")

    def write(self, record: dict) -> None:
        self._f.write(json.dumps(record) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def _aside(path: Path, suffix: str, lines: list[str]) -> None:
    fd = os.open(f"{path}{suffix}", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "a") as f:
        f.write("".join(line + "\n" for line in lines))
        f.flush()
        os.fsync(f.fileno())


def _is_step(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _parse(path: Path) -> tuple[list[tuple[str, dict]], list[int], int]:
    """([(line, record)], numbers of unreadable lines, number of the last non-blank line),
    1-based; one read of the file. A record needs an integer "step"."""
    rows, bad, last = [], [], 0
    for n, line in enumerate(Path(path).read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        last = n
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            bad.append(n)
            continue
        if not isinstance(row, dict) or not _is_step(row.get("step")):
            bad.append(n)
            continue
        rows.append((line, row))
    return rows, bad, last


def read_metrics(path: Path, note=None) -> list[dict]:
    """The records of a metrics.jsonl, for every reader (resume, compare, round reports): a
    last line still being written (or cut by a kill) is skipped, with `note(message)` called
    when given; an unreadable line elsewhere is a ValueError naming the file and line."""
    rows, bad, last = _parse(path)
    if bad == [last]:
        if note is not None:
            note(f"{path}: skipped a partial last line (a run killed mid-write)")
    elif bad:
        raise ValueError(
            f"{path}:{bad[0]}: not a JSON step record ({len(bad)} unreadable "
            "line(s)); repair or remove it (a resume of its run moves them to "
            f"{Path(path).name}{BAD})"
        )
    return [row for _, row in rows]

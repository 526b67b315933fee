"""roundN.md of gpu/study.sh: what one round of the study trained, and how fast.

    python3 gpu/round_report.py STUDY ROUND T_START T_TRAIN PER_DEVICE [NEW_RUN ...]

Throughput counts the steps every run trained in this round (from the runner's own log of
the round: where each run started or resumed), not whole runs: a run paused over several
rounds (PAUSE=1) or resumed from an earlier round's checkpoint trained only part of its
tokens here, and dividing whole runs' tokens by one round's time would overstate the rate
many times over.
"""

from __future__ import annotations

import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from ufp4_megatron.study import manifest as mf
from ufp4_megatron.train.logs.metrics import read_metrics

START = re.compile(r"^start (\S+) on slot \d+.*?(?:, resuming at step (\d+))?$")
END = re.compile(r"^(?:done|stopped|failed) (\S+) at step (\d+) \(exit")


def steps_in_round(log: Path) -> dict[str, tuple[int, int | None]]:
    """Each run the runner started in this round -> (the step it started from, the step it
    ended at; None in a log without it, then the run's last line counts)."""
    out: dict[str, tuple[int, int | None]] = {}
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        if m := START.match(line.strip()):
            out.setdefault(m.group(1), (int(m.group(2) or 0), None))
        elif (m := END.match(line.strip())) and m.group(1) in out:
            out[m.group(1)] = (out[m.group(1)][0], int(m.group(2)))
    return out


def rows(study: Path, name: str) -> list[dict]:
    path = mf.run_dir(study, name) / "metrics.jsonl"
    return read_metrics(path) if path.exists() else []  # a paused run's cut last line skipped


def report(study: Path, rnd: str, t0: int, t_train: int, per_device: str, new: list[str]) -> str:
    m = mf.load(study)
    runs = {r["name"]: r for r in m["runs"]}
    tokens = 0  # trained in this round by every run it started
    for name, (start, end) in steps_in_round(study / f"runner-round{rnd}.log").items():
        got = [r for r in rows(study, name) if start < r["step"] <= (end or r["step"])]
        if got:  # every step of a run trains the same tokens
            tokens += len(got) * got[0]["tokens"] // got[0]["step"]
    per = defaultdict(list)
    for name in new:
        got = rows(study, name)
        per[runs[name]["arm"]].append(statistics.median(r["step_time"] for r in got[10:] or got))
    counts: dict[str, int] = defaultdict(int)
    for r in m["runs"]:
        counts[r["status"]] += 1
    wall = max(1, t_train - t0)
    lines = [
        f"# Study round {rnd} ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"{len(new)} runs new to the archives (completed in this round, or on this node "
        "earlier and not archived); study: "
        + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
        + f" of {len(m['runs'])}.",
        f"Runner wall time {t_train - t0} s ({per_device} runs per GPU); the runs trained "
        f"{tokens:,} tokens in it ({tokens / wall:,.0f} tokens/s in all, counting only the "
        "steps each trained in this round).",
        "",
        "| arm | runs completed this round | median step time (s), packed |",
        "| --- | --- | --- |",
    ]
    lines += [
        f"| {arm} | {len(t)} | {statistics.median(t):.3f} |" for arm, t in sorted(per.items())
    ]
    done = sorted(r["name"] for r in m["runs"] if r["status"] == "done")
    lines += ["", f"done: {' '.join(done)}"]
    return "\n".join(lines)


if __name__ == "__main__":
    study, rnd, t0, t_train, per_device, *new = sys.argv[1:]
    print(report(Path(study), rnd, int(t0), int(t_train), per_device, new))

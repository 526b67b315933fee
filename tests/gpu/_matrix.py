"""The command-line end of a GPU matrix script (tests/gpu/test_*_gpu.py run as scripts): every
run's output to OUT/NAME.log as it ends, the rows to OUT/NAME.json, a table printed last."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path


def report(out: Path, name: str, label: str, run: Callable, table: Callable) -> int:
    """run(log) -> rows, where log(case, completed_process) records one run; 0 iff every
    row passes."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with (out / f"{name}.log").open("w") as logf:

        def log(case, r):
            logf.write(
                f"===== {case}: rc={r.returncode}\n--- stdout\n{r.stdout[-20000:]}\n"
                f"--- stderr\n{r.stderr[-20000:]}\n"
            )
            logf.flush()

        rows = run(log)
        print(f"{label}: {len(rows)} cases, {time.time() - t0:.0f} s", flush=True)
    (out / f"{name}.json").write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0 if all(r["pass"] for r in rows) else 1


def refuse_used_work(ap: argparse.ArgumentParser, work: Path) -> None:
    """Refuse a --work dir that holds files: a run there would resume an earlier run's
    checkpoint (or find it complete) and the matrix would compare old curves as new ones."""
    if work.exists() and (not work.is_dir() or any(work.iterdir())):
        ap.error(
            f"--work {work} holds an earlier run's files, which these runs would resume: "
            "remove it or give a new dir"
        )

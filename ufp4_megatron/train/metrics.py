"""<run dir>/metrics.jsonl (one JSON object per logged step) and the console progress view."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path


class MetricsFile:
    """Appends step records; on resume, drops records past the checkpoint's step so the file
    reads as one unbroken run. A line cut short by a kill mid-write (or otherwise unreadable)
    is dropped with a warning; the rest is kept. The file is rewritten atomically."""

    def __init__(self, path: Path, resumed_step: int):
        self.path = Path(path)
        if self.path.exists():
            rows, bad, _ = _parse(self.path)
            if bad:
                print(f"WARNING: {self.path}: dropped unreadable line(s) "
                      f"{', '.join(map(str, bad))} (a run killed mid-write); kept {len(rows)}",
                      file=sys.stderr, flush=True)
            kept = [line for line, row in rows if row["step"] <= resumed_step]
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text("".join(line + "\n" for line in kept))
            os.replace(tmp, self.path)
        self._f = self.path.open("a")

    def write(self, record: dict) -> None:
        self._f.write(json.dumps(record) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def _parse(path: Path) -> tuple[list[tuple[str, dict]], list[int], int]:
    """([(line, record)], numbers of unreadable lines, number of the last non-blank line),
    1-based; one read of the file."""
    rows, bad, last = [], [], 0
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        last = n
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            bad.append(n)
            continue
        if not isinstance(row, dict) or "step" not in row:
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
        raise ValueError(f"{path}:{bad[0]}: not a JSON step record ({len(bad)} unreadable "
                         "line(s)); repair or remove it (a resume of its run drops them)")
    return [row for _, row in rows]


class Progress:
    """tqdm bar with tokens/s and ETA on a terminal; plain lines when output is a file/pipe.

    The validation loss is always printed on the steps that evaluate (a line of its own under
    the bar; in plain mode the step's line, printed whatever print_interval says)."""

    def __init__(self, mode: str, total: int, initial: int, print_interval: int):
        tty = sys.stderr.isatty()
        self.total, self.print_interval = total, max(1, print_interval)
        self.bar = None
        if mode == "bar" or (mode == "auto" and tty):
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)
        elif mode not in ("auto", "plain", "bar"):
            raise ValueError(f"logging.progress={mode!r}; valid: auto, bar, plain")

    def update(self, record: dict) -> None:
        """Called every step; plain mode prints every print_interval steps, eval steps and the
        last."""
        step, val = record["step"], record.get("val_loss")
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{record['loss']:.4f}",
                                 tok_s=f"{record['tokens_per_s']:.0f}")
            self.bar.update(1)
            if val is not None:
                self.bar.write(f"step {step:>6} val_loss {val:.4f}")
        elif step % self.print_interval == 0 or step == self.total or val is not None:
            line = (f"step {step:>6} loss {record['loss']:.4f} lr {record['lr']:.2e} "
                    f"grad_norm {record['grad_norm']:.3f} tok/s {record['tokens_per_s']:.0f}")
            print(line + (f" val_loss {val:.4f}" if val is not None else ""), flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

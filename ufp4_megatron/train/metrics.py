"""<run dir>/metrics.jsonl (one JSON object per logged step) and the console progress view."""
from __future__ import annotations

import json
import sys
from pathlib import Path


class MetricsFile:
    """Appends step records; on resume, drops records past the checkpoint's step so the file
    reads as one unbroken run."""

    def __init__(self, path: Path, resumed_step: int):
        self.path = Path(path)
        if self.path.exists():
            kept = [line for line in self.path.read_text().splitlines()
                    if line and json.loads(line)["step"] <= resumed_step]
            self.path.write_text("".join(line + "\n" for line in kept))
        self._f = self.path.open("a")

    def write(self, record: dict) -> None:
        self._f.write(json.dumps(record) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line]


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

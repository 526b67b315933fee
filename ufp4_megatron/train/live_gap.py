"""The BF16-relative gap, live in W&B: a quantized run logs `gap_vs_bf16` (and `gap_vs_e2m1`)
while it trains, from the metrics.jsonl of its reference runs.

The references are the runs of the same experiment that differ from this one only in
precision (equal `identity.sibling_key`: same model, data, seed, batch, schedule) and are
named `bf16` / `e2m1` (precision.name); they are looked for among the run dirs next to this
one, then under runs/<experiment>/ (their config.yaml, up to two levels down: a sweep dir
included); two matches in the same place are ambiguous and neither is used (said once).
Logged with each key is its own x value, the tokens at the step it was computed
for (`gap_vs_bf16_at_tokens`; W&B charts it against that):

- At each logged step s, the gap is computed at the newest step s' <= s that both this run
  and the reference logged, if it is newer than the last one logged. A reference that keeps
  up gives s' = s every time; one that lags gives one point per log at the step it has
  reached, so the curve catches up as the reference advances (the steps skipped meanwhile are
  not back-filled: W&B cannot write to past steps; `ufp4-compare` after the sweep has them).
- A reference not found at start is looked for again after `rescan_s` seconds, then at
  doubling intervals up to an hour (a sweep may start it later; a scan reads every
  config.yaml there, and the loop waits for it); one note says which references were found
  and which not, another when one is found later.
- The reference's metrics.jsonl is read incrementally; a partial last line (being written) waits
  for the next read, and a file that shrank (the reference resumed) is read again from the top.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml

from .logs.log_line import say
from .rundir import identity

REFERENCES = ("bf16", "e2m1")  # precision.name of the runs gaps are taken against
MAX_RESCAN_S = 3600.0
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when PyYAML has it


class _Curve:
    """step -> loss of one metrics.jsonl, read as it grows."""

    def __init__(self, path: Path):
        self.path, self.offset, self.loss = path, 0, {}

    def poll(self) -> None:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return
        if size < self.offset:  # rewritten shorter (a resume cut it back): read again
            self.offset, self.loss = 0, {}
        if size == self.offset:
            return
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # whole lines only; a partial last one waits
        for line in data[:end].splitlines():
            try:
                row = json.loads(line)
                self.loss[int(row["step"])] = float(row["loss"])
            except (ValueError, KeyError, TypeError):
                continue
        self.offset += end


def _load_config(path: Path) -> dict | None:
    try:
        cfg = yaml.load(path.read_text(), Loader=_LOADER)
    except (OSError, yaml.YAMLError):
        return None  # a run dir being created, or not ours
    return cfg if isinstance(cfg, dict) else None


class LiveGap:
    def __init__(self, cfg, run_dir: Path, wb, rescan_s: float = 30.0):
        self.wb, self.run_dir = wb, Path(run_dir).resolve()
        self.name = cfg.precision.name
        self.sibling = identity.sibling_key(cfg)
        experiment_dir = Path("runs", cfg.experiment).resolve()
        self.roots = list(dict.fromkeys([self.run_dir.parent, experiment_dir]))
        wanted = [] if self.name == REFERENCES[0] else [r for r in REFERENCES if r != self.name]
        self.refs: dict[str, _Curve | None] = dict.fromkeys(wanted)
        self.last: dict[str, int] = dict.fromkeys(wanted, 0)
        self.own: dict[int, tuple[float, int]] = {}
        own = self.run_dir / "metrics.jsonl"  # steps before a resume
        if own.exists():
            for line in own.read_text().splitlines():
                try:
                    row = json.loads(line)
                    self.own[row["step"]] = (row["loss"], row["tokens"])
                except (ValueError, KeyError):
                    continue
        for ref in wanted:
            wb.define_metric(f"gap_vs_{ref}_at_tokens")
            wb.define_metric(f"gap_vs_{ref}", step_metric=f"gap_vs_{ref}_at_tokens")
        self._scanned, self._wait = float("-inf"), rescan_s
        if wanted:
            self._scan(announce=False)
            print(
                "live gap: "
                + "; ".join(
                    f"gap_vs_{r} from {c.path.parent}"
                    if c
                    else f"no {r} run of the same model, data and seed yet under "
                    f"{', '.join(map(str, self.roots))} (looked for again in {rescan_s:.0f} s, then "
                    f"at doubling intervals)"
                    for r, c in self.refs.items()
                ),
                flush=True,
            )

    def _scan(self, announce: bool = True) -> None:
        """Looks for the missing references, nearest first: the dirs next to this run, then
        runs/<experiment>/; two matches in the same place are ambiguous (none is used)."""
        self._scanned = time.monotonic()
        for root in self.roots:
            missing = {r for r, c in self.refs.items() if c is None}
            if not missing:
                return
            found: dict[str, set[Path]] = {r: set() for r in missing}
            for cfg_path in (*root.glob("*/config.yaml"), *root.glob("*/*/config.yaml")):
                run = cfg_path.parent.resolve()
                if run == self.run_dir or run.name.startswith("."):  # .hydra/: Hydra's copy
                    continue
                cfg = _load_config(cfg_path)
                name = ((cfg or {}).get("precision") or {}).get("name")
                if name in missing and identity.sibling_key(cfg) == self.sibling:
                    found[name].add(run)
            for name, runs in found.items():
                if len(runs) == 1:
                    self.refs[name] = _Curve(runs.pop() / "metrics.jsonl")
                    if announce:  # mid-run: above the progress bar, not over it
                        say(f"live gap: gap_vs_{name} from {self.refs[name].path.parent}")
                elif runs:
                    say(
                        f"live gap: {len(runs)} {name} runs match ({', '.join(map(str, runs))})"
                        f"; gap_vs_{name} not logged"
                    )
                    self.refs.pop(name)

    def log(self, record: dict) -> None:
        """Called where the loop logs a step: logs the gaps that became computable."""
        step = record["step"]
        self.own[step] = (record["loss"], record["tokens"])
        if None in self.refs.values() and time.monotonic() - self._scanned >= self._wait:
            self._scan()
            self._wait = min(2 * self._wait, MAX_RESCAN_S)
        out = {}
        for name, ref in self.refs.items():
            if ref is None:
                continue
            ref.poll()
            s = min(step, max(ref.loss, default=0))
            while s > self.last[name] and not (s in self.own and s in ref.loss):
                s -= 1
            if s > self.last[name]:
                loss, tokens = self.own[s]
                out[f"gap_vs_{name}"] = (loss - ref.loss[s]) / ref.loss[s]
                out[f"gap_vs_{name}_at_tokens"] = tokens
                self.last[name] = s
        if out:
            self.wb.log(out, step=step)

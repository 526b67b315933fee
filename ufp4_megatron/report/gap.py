"""The paper's BF16-relative loss gap: (L - L_bf16) / L_bf16 on identical steps."""
from __future__ import annotations

from dataclasses import dataclass

from .runs import Run


def gap_series(run: dict[int, float], ref: dict[int, float]) -> dict[int, float]:
    """Relative gap at every step both curves have."""
    return {s: (run[s] - ref[s]) / ref[s] for s in sorted(run.keys() & ref.keys())}


def latest_steps(series: dict[int, float], last: int) -> list[int]:
    """The logged steps within the latest `last` training steps (logging may skip steps)."""
    if not series:
        raise ValueError("no common steps between the run and its reference")
    end = max(series)
    return [s for s in sorted(series) if s > end - last]


def mean_latest(series: dict[int, float], last: int) -> float:
    """Mean gap over the latest `last` training steps (the paper: last=1000)."""
    steps = latest_steps(series, last)
    return sum(series[s] for s in steps) / len(steps)


@dataclass
class GapRow:
    model: str
    seed: int
    recipe: str
    steps: int  # logged steps in the mean
    last_step: int
    loss_gap: float  # mean relative training-loss gap over the latest steps
    val_gap: float | None  # relative validation-loss gap at the last common eval step
    series: dict[int, float]  # step -> gap, for plots


def compare(runs: list[Run], reference: str = "bf16", last: int = 1000) -> list[GapRow]:
    """One row per non-reference run, against the reference run of the same model and seed."""
    refs = {(r.model, r.seed): r for r in runs if r.recipe == reference}
    rows = []
    for r in runs:
        if r.recipe == reference:
            continue
        ref = refs.get((r.model, r.seed))
        if ref is None:
            raise ValueError(f"{r.source} ({r.model}, seed {r.seed}) has no {reference!r} run "
                             f"of the same model and seed to compare against")
        series = gap_series(r.loss, ref.loss)
        val = gap_series(r.val_loss, ref.val_loss)
        rows.append(GapRow(model=r.model, seed=r.seed, recipe=r.recipe,
                           steps=len(latest_steps(series, last)), last_step=max(series),
                           loss_gap=mean_latest(series, last),
                           val_gap=val[max(val)] if val else None, series=series))
    return rows


def markdown_table(rows: list[GapRow], last: int, baseline: str = "e2m1") -> str:
    """The paper's table: gap in %, and each recipe's reduction of the baseline's gap."""
    base = {(r.model, r.seed): r.loss_gap for r in rows if r.recipe == baseline}
    lines = [f"| model | seed | recipe | logged steps in the mean (latest {last}) | loss gap vs bf16 "
             f"| val-loss gap | gap reduction vs {baseline} |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        b = base.get((r.model, r.seed))
        red = f"{(b - r.loss_gap) / b:+.1%}" if b and r.recipe != baseline else "-"
        val = f"{r.val_gap:+.4%}" if r.val_gap is not None else "-"
        lines.append(f"| {r.model} | {r.seed} | {r.recipe} | {r.steps} (to step {r.last_step}) "
                     f"| {r.loss_gap:+.4%} | {val} | {red} |")
    return "\n".join(lines)

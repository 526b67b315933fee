"""The paper's BF16-relative loss gap, (L - L_bf16) / L_bf16, per run and seed.

Each quantized run is paired with the reference run of the same seed, model, data and schedule
(equal `train.rundir.identity.sibling_key`: same data order and initial weights; and the same
learning rate at every compared step, check_same_schedule: the key leaves out train.steps,
over which a null optim.decay_steps decays). All runs of one
model are compared over the same steps: those every run logged (a longer run is cut to the
common steps, and the output says so), and the mean is over the latest `last` of those steps.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field

from ..train.rundir import identity
from .errors import BadInput
from .runs import Run


def model_order(name: str) -> list:
    """Sort key for model names with numbers in their natural order: study11m, study11m_L3,
    study11m_L12 (a depth sweep's panels and rows in depth order, not L12 before L3)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def gap_series(run: dict[int, float], ref: dict[int, float]) -> dict[int, float]:
    """Relative gap at every step both curves have."""
    return {s: (run[s] - ref[s]) / ref[s] for s in sorted(run.keys() & ref.keys())}


@dataclass
class Window:
    """The steps one model's runs are compared over."""

    model: str
    common: list[int]  # the steps every run of the model logged
    last_common: int  # the last of them
    first: int  # window = common logged steps in [first, last_common]
    steps: list[int]  # common logged steps in the window
    val_steps: list[int]  # common eval steps used for the validation gap
    beyond: list[tuple[str, int]] = field(default_factory=list)  # runs cut: (source, last step)

    def note(self) -> str | None:
        if not self.beyond:
            return None
        cut = ", ".join(f"{src} (to step {last})" for src, last in self.beyond)
        return (
            f"{self.model}: compared over the common steps 1-{self.last_common} only; "
            f"logged further: {cut}"
        )


@dataclass
class SeedGap:
    """One quantized run against its reference."""

    model: str
    recipe: str  # the run's label
    seed: int
    run: Run
    reference: Run
    train_gap: float  # mean relative training-loss gap over the window
    val_gap: float | None  # mean relative validation-loss gap over the window's eval steps
    series: dict[int, float]  # step -> gap on the model's common steps (plots, W&B)
    # mean train gap over the window's later half minus its earlier half: whether the gap is
    # still moving where it is measured (None for a window of one logged step)
    drift: float | None = None


def window_drift(series: dict[int, float], steps: list[int]) -> float | None:
    """Mean of the gap over the latest half of `steps` minus over the half before (equal
    halves; the middle step of an odd count in neither)."""
    h = len(steps) // 2
    if h == 0:
        return None
    late, early = steps[len(steps) - h :], steps[:h]
    return sum(series[s] for s in late) / h - sum(series[s] for s in early) / h


@dataclass
class Comparison:
    windows: dict[str, Window]
    gaps: list[SeedGap]
    notes: list[str]


def assign_labels(runs: list[Run]) -> list[str]:
    """Label = precision.name, unless several settings share it (e.g. an ablation by
    command-line overrides that kept precision.name=ufp4): then recipe#<setting hash> for each,
    so seeds still group by setting. Refuses one run given twice. Returns notes."""
    by_id: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        by_id[r.run_id].append(r)
    for same in by_id.values():
        if len(same) > 1:
            r = same[0]
            raise BadInput(
                f"the same run was given twice: {' and '.join(x.source for x in same)} "
                f"(run id {r.run_id}: {r.model} {r.recipe} seed {r.seed}); pass it once"
            )
    notes = []
    by_name: dict[tuple[str, str], dict[str, list[Run]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        by_name[r.model, r.recipe][r.setting].append(r)
    for (model, recipe), settings in by_name.items():
        if len(settings) < 2:
            continue
        groups = list(settings.values())
        for group in groups:
            for r in group:
                r.label = f"{recipe}#{r.setting}"
        differ = sorted(
            {k for g in groups[1:] for k in identity.differences(groups[0][0].config, g[0].config)}
            - {"train.seed"}
        )
        shown = "; ".join(f"{g[0].label}: {', '.join(r.source for r in g)}" for g in groups)
        notes.append(
            f"{model}: {len(groups)} different settings are labelled {recipe!r} "
            f"(they differ in {', '.join(differ)}); shown as {shown}. Give each its "
            f"own precision.name to name them"
        )
    return notes


def select(runs: list[Run], name: str) -> list[Run]:
    """Runs named `name`: by precision.name, or by label (recipe#setting) to pick one setting."""
    return [r for r in runs if name in (r.label, r.recipe)]


def _window(model: str, runs: list[Run], last: int | None, last_fraction: float | None) -> Window:
    common = set.intersection(*(set(r.loss) for r in runs))
    if not common:
        raise BadInput(
            f"the runs of model {model} share no logged step: {', '.join(r.source for r in runs)}"
        )
    end = max(common)
    n = last if last is not None else max(1, math.ceil(last_fraction * end))
    first = max(end - n + 1, 1)
    val_common = set.intersection(*(set(r.val_loss) for r in runs))
    val = (
        sorted(s for s in val_common if first <= s <= end)
        or sorted(s for s in val_common if s <= end)[-1:]
    )
    beyond = [(r.source, max(r.loss)) for r in runs if max(r.loss) > end]
    return Window(
        model=model,
        common=sorted(common),
        last_common=end,
        first=first,
        steps=sorted(s for s in common if s >= first),
        val_steps=val,
        beyond=beyond,
    )


def check_window(last: int | None, last_fraction: float | None) -> None:
    if (last is None) == (last_fraction is None):
        raise BadInput("give one of --last N (steps) or --last-fraction F")
    if last is not None and last < 1:
        raise BadInput(f"--last {last}: the mean needs at least 1 step (e.g. --last 1000)")
    if last_fraction is not None and not 0 < last_fraction <= 1:
        raise BadInput(f"--last-fraction {last_fraction}: must be in (0, 1], e.g. 0.2")


def planned_schedule(run: Run) -> dict:
    """The LR schedule a run's config plans: optim's schedule keys, with decay_steps null
    resolved as the trainer resolves it (train.steps of the first start, at least warmup + 1;
    train/optim.py decay_steps)."""
    optim = dict(run.config.get("optim") or {})
    steps = (run.config.get("train") or {}).get("steps")
    if optim.get("decay_steps") is None and steps is not None:
        optim["decay_steps"] = max(steps, (optim.get("warmup_steps") or 0) + 1)
    return {
        k: optim.get(k)
        for k in (
            "lr",
            "min_lr",
            "warmup_steps",
            "decay_style",
            "decay_steps",
            "wsd_decay_steps",
            "wsd_decay_style",
        )
    }


def check_same_schedule(run: Run, ref: Run, steps: list[int]) -> None:
    """A run and its reference must have trained with the same learning rate at every step
    they are compared on: the sibling key leaves train.steps out (a run may be extended), and
    with optim.decay_steps=null the schedule decays over train.steps, so a 6-step run and a
    3000-step reference share a key but not a schedule. The logged LRs decide; a run logged
    without them is compared on its planned schedule."""
    both = [s for s in steps if s in run.lr and s in ref.lr]
    first = next((s for s in both if run.lr[s] != ref.lr[s]), None)
    plan, plan_ref = planned_schedule(run), planned_schedule(ref)
    differ = ", ".join(f"{k} {plan[k]} vs {plan_ref[k]}" for k in plan if plan[k] != plan_ref[k])
    if first is not None:
        why = (
            f"trained with different learning rates from step {first} on "
            f"({run.lr[first]:g} vs {ref.lr[first]:g}; their schedules differ in "
            f"{differ or 'the logged LRs'})"
        )
    elif not both and differ:
        why = f"plan different LR schedules ({differ})"
    else:
        return
    raise BadInput(
        f"{run.source} and its {ref.label!r} reference {ref.source} {why}: their "
        "loss gap is not the recipe's. Compare runs of one schedule (the same "
        "train.steps, or an explicit optim.decay_steps)"
    )


def compare(
    runs: list[Run],
    reference: str = "bf16",
    last: int | None = 1000,
    last_fraction: float | None = None,
) -> Comparison:
    """Every non-reference run against its sibling reference run, over common steps."""
    check_window(last, last_fraction)
    notes = assign_labels(runs)
    refs = select(runs, reference)
    if not refs:
        raise BadInput(
            f"no {reference!r} run among the {len(runs)} given: the gap is relative "
            f"to it (pass its run dir, or --reference NAME)"
        )
    by_model: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        by_model[r.model].append(r)
    windows = {
        m: _window(m, by_model[m], last, last_fraction) for m in sorted(by_model, key=model_order)
    }
    notes += [w.note() for w in windows.values() if w.note()]
    gaps = []
    for r in runs:
        if r in refs:
            continue
        mine = [x for x in refs if x.sibling == r.sibling]
        if not mine:
            raise BadInput(
                f"{r.source} ({r.model} {r.label} seed {r.seed}) has no {reference!r} "
                f"run of the same model, data, seed and batch to compare against "
                f"(sibling key {r.sibling}): pass it, or leave this run out"
            )
        if len(mine) > 1:
            raise BadInput(
                f"{r.source} has {len(mine)} {reference!r} runs of the same model, "
                f"data and seed: {', '.join(x.source for x in mine)}; pass one"
            )
        ref, w = mine[0], windows[r.model]
        check_same_schedule(r, ref, w.common)
        series = {s: (r.loss[s] - ref.loss[s]) / ref.loss[s] for s in w.common}
        val = gap_series(r.val_loss, ref.val_loss)
        gaps.append(
            SeedGap(
                model=r.model,
                recipe=r.label,
                seed=r.seed,
                run=r,
                reference=ref,
                train_gap=sum(series[s] for s in w.steps) / len(w.steps),
                val_gap=(sum(val[s] for s in w.val_steps) / len(w.val_steps))
                if w.val_steps
                else None,
                series=series,
                drift=window_drift(series, w.steps),
            )
        )
    return Comparison(windows=windows, gaps=gaps, notes=notes)

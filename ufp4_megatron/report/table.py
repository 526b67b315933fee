"""loss_gap.md: the recipe table with intervals in words, the per-seed table, and the notes.

Beside the reduction (a ratio, wide whenever the baseline's own gap is small), the paired
difference of the two gaps in points. No "gap reduction" is quoted from noise: where an
interval contains zero (or there is one seed, or the baseline's own gap is unresolved) the
cell says "not resolved at this size" and shows the point value only beside its interval.
"""

from __future__ import annotations

from .gap import Comparison, Window
from .stats import MOST_SEEDS, Interval
from .summary import POWER, RecipeSummary

UNRESOLVED = "not resolved at this size"
ONE_SEED = "1 seed: no interval"


def gap_cell(iv: Interval | None) -> str:
    if iv is None:
        return "-"
    if iv.lo is None:
        return f"{iv.mean:+.3%} ({ONE_SEED})"
    text = f"{iv.mean:+.3%} [{iv.lo:+.3%}, {iv.hi:+.3%}]"
    return text if iv.resolved else f"{UNRESOLVED}: {text}"


def reduction_cell(s: RecipeSummary) -> str:
    r = s.vs_baseline
    if s.recipe == s.baseline:
        return "(baseline)"
    if r is None:
        return "-"
    if r.ratio is None:
        return f"n/a ({s.baseline}'s mean gap is 0)"
    point = f"{1 - r.ratio:+.1%}"
    if r.n == 1:
        return f"{UNRESOLVED} ({ONE_SEED}; point value {point})"
    if not r.bounded:
        some = r.n < len(s.seeds) or r.n < s.n_baseline_seeds
        over = f" over the {r.n} paired seeds" if some else ""
        return f"{UNRESOLVED}: {point} [unbounded: {s.baseline}'s own gap is not resolved{over}]"
    text = f"{point} [{1 - r.hi:+.1%}, {1 - r.lo:+.1%}]"
    return text if s.reduction_resolved else f"{UNRESOLVED}: {text}"


def difference_cell(s: RecipeSummary) -> str:
    """The train gap minus the baseline's on the same seeds, in points, paired t."""
    if s.recipe == s.baseline:
        return "(baseline)"
    p = s.vs_baseline_paired
    if p is None:
        return "-"
    d = p.train
    if d.lo is None:
        return f"{d.mean * 100:+.2f} points ({ONE_SEED})"
    text = f"{d.mean * 100:+.2f} points [{d.lo * 100:+.2f}, {d.hi * 100:+.2f}], p = {p.train_p:.2g}"
    return text if d.resolved else f"{UNRESOLVED}: {text}"


def pairing_note(s: RecipeSummary) -> str | None:
    """When a recipe and its baseline do not share all their seeds, how many pairs the
    reduction rests on, and the difference of the two mean gaps over every seed (Welch)."""
    r, d = s.vs_baseline, s.vs_baseline_unpaired
    if d is None or s.recipe == s.baseline:
        return None
    paired = 0 if r is None else r.n
    if paired == len(s.seeds) == s.n_baseline_seeds:
        return None
    if d.lo is None:
        diff = f"{d.mean * 100:+.2f} points ({ONE_SEED} on one side)"
    else:
        diff = f"{d.mean * 100:+.2f} points [{d.lo * 100:+.2f}, {d.hi * 100:+.2f}]"
        diff = diff if d.resolved else f"{UNRESOLVED}: {diff}"
    return (
        f"{s.model} {s.recipe}: {paired} of its {len(s.seeds)} seeds are paired with "
        f"{s.baseline} ({s.n_baseline_seeds} seeds); the reduction rests on those. Train "
        f"gap minus {s.baseline}'s over every seed of each, not paired (Welch): {diff}"
    )


def power_note(s: RecipeSummary, confidence: float) -> str | None:
    """For an unresolved paired difference: how many paired seeds would resolve one of the
    observed size at the observed spread (a planning number for the next study)."""
    p = s.vs_baseline_paired
    if p is None or p.train.resolved or not p.train_sd or not p.train.mean:
        return None
    need = p.seeds_for_power
    seeds = (
        f"~{need} paired seeds" if need is not None else f"more than {MOST_SEEDS:,} paired seeds"
    )
    return (
        f"{s.model} {s.recipe}: to resolve a difference from {s.baseline} of "
        f"{p.train.mean * 100:+.2f} points at the spread of these {p.train.n} seeds (sd "
        f"{p.train_sd * 100:.2f} points) would take {seeds} ({POWER:.0%} power, paired t "
        f"at {confidence:.0%}): a planning number for a next study, not a result"
    )


def drift_note(s: RecipeSummary, window: Window) -> str | None:
    """When the gap still moves within the window (its drift interval excludes zero): the
    mean gap then depends on where the runs stop, and a longer run may give another one."""
    d = s.drift
    if d is None or not d.resolved:
        return None
    h = len(window.steps) // 2
    return (
        f"{s.model} {s.recipe}: its gap is still moving where it is measured: the mean "
        f"over the latest {h} logged steps minus the {h} before is {d.mean * 100:+.2f} "
        f"points [{d.lo * 100:+.2f}, {d.hi * 100:+.2f}] over {d.n} seeds; the gap depends "
        f"on where the runs stop, and longer runs may give another"
    )


def markdown(
    cmp: Comparison,
    summaries: list[RecipeSummary],
    *,
    reference: str,
    baseline: str,
    confidence: float,
    window_text: str,
    notes: list[str],
) -> str:
    pct = f"{confidence:.0%}"
    lines = [
        f"BF16-relative loss gap (L - L_{reference}) / L_{reference}, mean over {window_text} "
        f"of the steps every run of the model logged; {pct} intervals over seeds "
        f"(Student t); reduction = 1 - gap / gap_{baseline}, paired by seed (Fieller); "
        f"difference = gap - gap_{baseline} on the same seeds, in points (paired t).",
        "",
    ]
    for w in cmp.windows.values():
        lines.append(
            f"- {w.model}: mean over steps {w.first}-{w.last_common} "
            f"({len(w.steps)} logged steps), validation at steps "
            f"{', '.join(map(str, w.val_steps)) or 'none'}"
        )
    lines += [
        "",
        f"| model | recipe | seeds | train gap vs {reference} [{pct} CI] | val gap vs "
        f"{reference} [{pct} CI] | gap reduction vs {baseline} [{pct} CI] | train gap "
        f"minus {baseline}'s, paired [{pct} CI] |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in summaries:
        lines.append(
            f"| {s.model} | {s.recipe} | {len(s.seeds)} | {gap_cell(s.train)} | "
            f"{gap_cell(s.val)} | {reduction_cell(s)} | {difference_cell(s)} |"
        )
    lines += [
        "",
        "Per seed:",
        "",
        f"| model | recipe | seed | train gap | val gap | "
        f"{baseline} train gap (same seed) | run | reference |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in summaries:
        for g in s.seeds:
            val = f"{g.val_gap:+.3%}" if g.val_gap is not None else "-"
            base = s.baseline_gaps.get(g.seed)
            lines.append(
                f"| {s.model} | {s.recipe} | {g.seed} | {g.train_gap:+.3%} | {val} | "
                f"{'-' if base is None else f'{base:+.3%}'} | {g.run.source} | "
                f"{g.reference.source} |"
            )
    notes = notes + [n for n in map(pairing_note, summaries) if n]
    notes += [n for s in summaries if (n := drift_note(s, cmp.windows[s.model]))]
    notes += [n for s in summaries if (n := power_note(s, confidence))]
    if notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines)

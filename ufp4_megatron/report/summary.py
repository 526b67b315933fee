"""Per recipe and model, over seeds: the mean gap with its interval, the ratio to the
baseline's gap (the paper's "reduction" = 1 - ratio) with Fieller's interval, paired by seed,
and the paired difference of the two gaps (points, paired t).

`to_json` is the machine-readable result (`loss_gap.json`); its keys are documented in
docs/comparing.md ("Outputs") and versioned by SCHEMA_VERSION.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from .gap import Comparison, SeedGap, model_order
from .stats import (
    Interval,
    Ratio,
    fieller_ratio,
    paired_difference,
    seeds_for_power,
    t_interval,
    welch_difference,
)

SCHEMA_VERSION = 1
GAP_METHOD = "Student t over seeds: mean +- t(n-1) * sd / sqrt(n)"
RATIO_METHOD = (
    "Fieller, paired by seed: the ratios rho whose paired t-test of "
    "gap_recipe - rho * gap_baseline = 0 does not reject; unbounded when the "
    "baseline's own gap is not resolved"
)
DIFFERENCE_METHOD = (
    "Welch, not paired: mean gap_recipe - mean gap_baseline over every seed "
    "of each, Welch-Satterthwaite degrees of freedom"
)
PAIRED_METHOD = (
    "paired t over the seeds both have: mean of gap_recipe - gap_baseline per "
    "seed, t(n-1) interval, two-sided p of a zero mean difference; "
    "seeds_for_power: the pairs a paired t-test would need to detect the observed "
    "mean difference at the observed spread (noncentral t), a planning number"
)
POWER = 0.8  # the power the planning number is for


@dataclass(frozen=True)
class PairedDifference:
    """gap_recipe - gap_baseline on the seeds both have (train; val where every pair has it),
    each with its paired t-interval and p-value (None for one pair)."""

    train: Interval
    train_p: float | None
    val: Interval | None
    val_p: float | None
    train_sd: float | None = None  # sd of the per-seed differences (None for one pair)
    # pairs a paired t-test would need to detect train.mean at train_sd with POWER; None for
    # one pair, a zero difference or spread, or more than stats.seeds_for_power's `most`
    seeds_for_power: int | None = None


@dataclass
class RecipeSummary:
    model: str
    recipe: str
    seeds: list[SeedGap]  # sorted by seed
    train: Interval
    val: Interval | None  # None unless every seed has a validation gap
    vs_baseline: Ratio | None  # None for the baseline itself or when it has no paired seed
    baseline: str
    baseline_gaps: dict[int, float]  # seed -> the paired baseline run's train gap
    # mean train gap minus the baseline's, over every seed of each (Welch); None for the
    # baseline itself or without baseline runs
    vs_baseline_unpaired: Interval | None = None
    # the gap's drift within the window over seeds (gap.window_drift); None without it
    drift: Interval | None = None
    # gap minus the baseline's gap on the paired seeds; None for the baseline or without pairs
    vs_baseline_paired: PairedDifference | None = None

    @property
    def n_baseline_seeds(self) -> int:
        """The baseline's seeds (all of them, paired or not); 0 without a difference."""
        d = self.vs_baseline_unpaired
        return 0 if d is None else d.n - len(self.seeds)

    @property
    def reduction_resolved(self) -> bool:
        return self.vs_baseline is not None and self.vs_baseline.excludes(1.0)


def _baseline_label(model: str, labels: set[str], baseline: str) -> tuple[str | None, list[str]]:
    """The label of the model's baseline runs: `baseline` itself, or the one label#setting
    of that precision.name; None (with a note) when it names several settings."""
    if baseline in labels:
        return baseline, []
    named = sorted(r for r in labels if r.split("#")[0] == baseline)
    if len(named) > 1:
        return None, [
            f"{model}: baseline {baseline!r} names {len(named)} settings "
            f"({', '.join(named)}): no ratio; pass --baseline with one of them"
        ]
    return (named[0] if named else None), []


def summarize(
    cmp: Comparison, baseline: str = "e2m1", confidence: float = 0.95
) -> tuple[list[RecipeSummary], list[str]]:
    """One summary per (model, recipe label); notes for a baseline that cannot be chosen."""
    groups: dict[tuple[str, str], list[SeedGap]] = defaultdict(list)
    for g in cmp.gaps:
        groups[g.model, g.recipe].append(g)
    notes, out = [], []
    for model in sorted({m for m, _ in groups}, key=model_order):
        base_label, more = _baseline_label(model, {r for m, r in groups if m == model}, baseline)
        notes += more
        base = {g.run.sibling: g for g in groups.get((model, base_label), [])}
        for (m, recipe), seeds in sorted(groups.items()):
            if m != model:
                continue
            seeds.sort(key=lambda g: g.seed)
            pairs = [
                (g, base[g.run.sibling])
                for g in seeds
                if g.run.sibling in base and recipe != base_label
            ]
            ratio = paired = None
            if pairs:
                ratio = fieller_ratio(
                    [g.train_gap for g, _ in pairs], [b.train_gap for _, b in pairs], confidence
                )
                paired = _paired(pairs, confidence)
            vals = [g.val_gap for g in seeds]
            drifts = [g.drift for g in seeds]
            base_all = [b.train_gap for b in base.values()]
            unpaired = None
            if base_all and recipe != base_label:
                unpaired = welch_difference([g.train_gap for g in seeds], base_all, confidence)
            out.append(
                RecipeSummary(
                    model=model,
                    recipe=recipe,
                    seeds=seeds,
                    train=t_interval([g.train_gap for g in seeds], confidence),
                    val=t_interval(vals, confidence) if None not in vals else None,
                    vs_baseline=ratio,
                    baseline=base_label or baseline,
                    baseline_gaps={g.seed: b.train_gap for g, b in pairs},
                    vs_baseline_unpaired=unpaired,
                    drift=t_interval(drifts, confidence) if None not in drifts else None,
                    vs_baseline_paired=paired,
                )
            )
    out.sort(key=lambda s: (model_order(s.model), s.recipe != s.baseline, s.recipe))
    return out, notes


def _paired(pairs, confidence: float) -> PairedDifference:
    train, train_p, sd = paired_difference(
        [g.train_gap for g, _ in pairs], [b.train_gap for _, b in pairs], confidence
    )
    val = val_p = None
    if all(g.val_gap is not None and b.val_gap is not None for g, b in pairs):
        val, val_p, _ = paired_difference(
            [g.val_gap for g, _ in pairs], [b.val_gap for _, b in pairs], confidence
        )
    seeds = None if sd is None else seeds_for_power(train.mean, sd, POWER, confidence)
    return PairedDifference(train, train_p, val, val_p, sd, seeds)


def _interval(iv: Interval | None) -> dict | None:
    if iv is None:
        return None
    return {"mean": iv.mean, "lo": iv.lo, "hi": iv.hi, "n": iv.n, "resolved": iv.resolved}


def _ratio(s: RecipeSummary) -> dict | None:
    r = s.vs_baseline
    if r is None:
        return None
    flip = lambda v: None if v is None else 1 - v
    return {
        "baseline": s.baseline,
        "n_pairs": r.n,
        "ratio": r.ratio,
        "ratio_lo": r.lo,
        "ratio_hi": r.hi,
        "bounded": r.bounded,
        "reduction": flip(r.ratio),
        "reduction_lo": flip(r.hi),
        "reduction_hi": flip(r.lo),
        "resolved": s.reduction_resolved,
    }


def _difference(s: RecipeSummary) -> dict | None:
    d = s.vs_baseline_unpaired
    if d is None:
        return None
    return {
        "baseline": s.baseline,
        "difference": d.mean,
        "lo": d.lo,
        "hi": d.hi,
        "n_seeds": len(s.seeds),
        "n_baseline_seeds": s.n_baseline_seeds,
        "resolved": d.resolved,
    }


def _paired_json(s: RecipeSummary) -> dict | None:
    p = s.vs_baseline_paired
    if p is None:
        return None
    return {
        "baseline": s.baseline,
        "n_pairs": p.train.n,
        "train": _interval(p.train),
        "train_p": p.train_p,
        "val": _interval(p.val),
        "val_p": p.val_p,
        "train_sd": p.train_sd,
        "power": POWER,
        "seeds_for_power": p.seeds_for_power,
    }


def to_json(
    cmp: Comparison,
    summaries: list[RecipeSummary],
    *,
    reference: str,
    baseline: str,
    confidence: float,
    last: int | None,
    last_fraction: float | None,
    notes: list[str],
) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "reference": reference,
        "baseline": baseline,
        "confidence": confidence,
        "window": {"last": last, "last_fraction": last_fraction},
        "methods": {
            "gap": GAP_METHOD,
            "ratio": RATIO_METHOD,
            "difference": DIFFERENCE_METHOD,
            "paired_difference": PAIRED_METHOD,
        },
        "notes": notes,
        "models": [
            {
                "model": w.model,
                "last_common_step": w.last_common,
                "window_first_step": w.first,
                "window_logged_steps": len(w.steps),
                "val_steps": w.val_steps,
                "cut_runs": [{"source": s, "last_step": n} for s, n in w.beyond],
            }
            for w in cmp.windows.values()
        ],
        "recipes": [
            {
                "model": s.model,
                "recipe": s.recipe,
                "precision_name": s.seeds[0].run.recipe,
                "setting": s.seeds[0].run.setting,
                "n_seeds": len(s.seeds),
                "seeds": [g.seed for g in s.seeds],
                "train_gap": _interval(s.train),
                "val_gap": _interval(s.val),
                "vs_baseline": _ratio(s),
                "vs_baseline_unpaired": _difference(s),
                "vs_baseline_paired": _paired_json(s),
                "drift": _interval(s.drift),
                "per_seed": [
                    {
                        "seed": g.seed,
                        "train_gap": g.train_gap,
                        "val_gap": g.val_gap,
                        "drift": g.drift,
                        "baseline_train_gap": s.baseline_gaps.get(g.seed),
                        "source": g.run.source,
                        "run_id": g.run.run_id,
                        "reference_source": g.reference.source,
                    }
                    for g in s.seeds
                ],
            }
            for s in summaries
        ],
    }

"""The pre-registered study's analysis, exactly as docs/results.md ("Pre-registration") states
it, on the runs of its archives (docs/results/prereg/round*.tar.gz).

    DESIGN                  the fixed design: arms, seeds, window, the ablation's family
    count_runs(runs)        the runs that count, by arm and seed, and why the others do not
    analyse(runs)           every pre-registered number; each group only once it is complete

Notation: L(a, s, t) the training loss of arm a, seed s at step t; B(t) the mean of the BF16
runs' L at step t over the BF16 seeds; W the last 200 steps (801-1000).

- Primary: D[s] = mean over t in W of (L(ufp4, s, t) - L(e2m1, s, t)) / B(t), in points (x100),
  s = 1..28; a paired (one-sample) t-test of mean D = 0, two-sided, 95%. Run once, at 28 pairs.
- Each recipe's gap vs BF16, seeds 1-12: g[a, s] = mean over W of (L[a, s] - L[bf16, s]) / B,
  mean over the seeds with a t interval; the reduction 1 - mean g[ufp4] / mean g[e2m1] with
  Fieller's interval on the same seeds; the validation difference as D, on the fixed
  validation set (data.valid_seed), over the evaluations in W.
- Ablation: y[a, s] = mean over W of L[a, s] / B (points), every quantized arm of seeds 1-12,
  in one two-way model (report/pooled.py); the family of DESIGN.family tested with Holm.

A run counts when: its config is the design's (DESIGN.config, the pysrc corpus by its sha256);
it logged a finite loss at every step 1..1000; and one trainer process trained all of them
(launch.json, or the runner's log, says its last process started at step 0). A run whose loss
is not finite is a divergence: reported, never silently dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .archives import ArchivedRun
from .loss_drop import drop_step, r_squared
from .pooled import Contrast, PooledFit, family, fit_two_way
from .stats import fieller_ratio

ABLATION_ARMS = (
    "ufp4_rht_none",
    "ufp4_rht_wgrad",
    "ufp4_rht_dgrad_wgrad",
    "ufp4_rht_fprop_wgrad",
    "ufp4_no_sr",
    "e2m1_rht_all",
    "e2m1_uniform",
)
RECIPE_ARMS = ("ufp4_int4", "nvfp4", "mxfp4")


@dataclass(frozen=True)
class Design:
    steps: int = 1000
    window: int = 200  # the last steps every mean is over
    reference: str = "bf16"
    baseline: str = "e2m1"
    candidate: str = "ufp4"
    primary_seeds: tuple[int, ...] = tuple(range(1, 29))
    seeds: tuple[int, ...] = tuple(range(1, 13))  # BF16, the ablation and the other recipes
    ablation_arms: tuple[str, ...] = ABLATION_ARMS
    recipe_arms: tuple[str, ...] = RECIPE_ARMS
    # the ablation's family, tested together with Holm (a - b, points of loss relative to B)
    family: tuple[tuple[str, str], ...] = (
        ("ufp4", "ufp4_rht_wgrad"),  # RHT16 on all three GEMMs vs wgrad only (E1M2)
        ("ufp4_rht_fprop_wgrad", "ufp4_rht_wgrad"),  # adding fprop's RHT
        ("ufp4_rht_dgrad_wgrad", "ufp4_rht_wgrad"),  # adding dgrad's RHT
        ("ufp4_rht_wgrad", "ufp4_rht_none"),  # wgrad's RHT vs none
        ("ufp4_no_sr", "ufp4"),  # SR on dY off
        ("e2m1_rht_all", "e2m1"),  # E2M1 with RHT16 on all three GEMMs
        ("e2m1_uniform", "e2m1"),  # E2M1 capped to {0, 0.5, 1, 1.5, 2}
        ("ufp4_int4", "e2m1"),
        ("nvfp4", "e2m1"),
        ("mxfp4", "e2m1"),
    )
    # the same grid up to scale (paper): its true difference is zero; a check of the model
    negative_control: tuple[str, str] = ("ufp4_int4", "ufp4")
    alpha: float = 0.05
    corpus_sha256: str = "69fa418b0fd13e9d84bb7c56536e67a95b15a0f5e9205cb36563c0dd55147b30"
    # dotted config keys every counted run has at these values (configs/study/prereg.yaml)
    config: tuple[tuple[str, object], ...] = (
        ("model.name", "study11m"),
        ("model.num_layers", 6),
        ("model.hidden_size", 384),
        ("train.steps", 1000),
        ("train.seq_len", 256),
        ("train.global_batch", 128),
        ("train.eval_interval", 50),
        ("train.eval_iters", 4),
        ("data.valid_seed", 99),
        ("data.split", "98,2,0"),
        ("data.tokenizer.type", "byte-level"),
        ("optim.lr", 0.002),
        ("optim.min_lr", 0.0002),
        ("optim.warmup_steps", 100),
        ("optim.decay_style", "cosine"),
        ("optim.weight_decay", 0.1),
        ("optim.clip_grad", 1.0),
    )

    @property
    def arms(self) -> tuple[str, ...]:
        return (
            self.reference,
            self.baseline,
            self.candidate,
            *self.ablation_arms,
            *self.recipe_arms,
        )

    def seeds_of(self, arm: str) -> tuple[int, ...]:
        return self.primary_seeds if arm in (self.baseline, self.candidate) else self.seeds


DESIGN = Design()


def _get(cfg: dict, dotted: str):
    node = cfg
    for k in dotted.split("."):
        if not isinstance(node, dict) or k not in node:
            return None
        node = node[k]
    return node


def why_not_counted(run: ArchivedRun, design: Design = DESIGN) -> str | None:
    """None when the run counts; otherwise the reason, in a few words."""
    for key, want in design.config:
        have = _get(run.config, key)
        if have != want and not (
            isinstance(want, float) and isinstance(have, (int, float)) and math.isclose(have, want)
        ):
            return f"{key}={have!r}, the design has {want!r}"
    prefixes = _get(run.config, "data.prefixes") or []
    if len(prefixes) != 1 or not str(prefixes[0]).rstrip("/").endswith("pysrc"):
        return f"data.prefixes={prefixes}: not the pysrc corpus"
    if run.corpus_sha256 != design.corpus_sha256:
        return f"corpus sha256 {run.corpus_sha256}: not the design's pysrc corpus"
    if len(run.logged) != design.steps or not run.logged.all():
        return f"{int(run.logged[: design.steps].sum())} of {design.steps} steps logged"
    if run.one_process is not True:
        return (
            "resumed from a checkpoint (steps from " + ", ".join(map(str, run.starts)) + ")"
            if run.starts
            else "no record of how it was trained (launch.json)"
        )
    return None


@dataclass
class Counted:
    runs: dict[str, dict[int, ArchivedRun]]  # arm -> seed -> run
    excluded: list[tuple[str, str]]  # (run name, why)
    diverged: list[str]  # runs with a non-finite loss (complete otherwise)
    unplanned: list[str]  # runs of arms or seeds outside the design

    def seeds(self, arm: str) -> set[int]:
        return set(self.runs.get(arm, {}))


def _arm(run: ArchivedRun) -> str:
    return run.name.rsplit("-s", 1)[0]


def count_runs(runs: dict[str, ArchivedRun], design: Design = DESIGN) -> Counted:
    out = Counted(runs={}, excluded=[], diverged=[], unplanned=[])
    for name, run in sorted(runs.items()):
        arm = _arm(run)
        if arm not in design.arms or run.seed not in design.seeds_of(arm):
            out.unplanned.append(name)
            continue
        if run.diverged:
            out.diverged.append(name)
            continue
        if (why := why_not_counted(run, design)) is not None:
            out.excluded.append((name, why))
            continue
        out.runs.setdefault(arm, {})[run.seed] = run
    return out


# -- the statistics ------------------------------------------------------------------------
@dataclass(frozen=True)
class Paired:
    """A mean over seeds of per-seed values (differences, or gaps), with its t-test."""

    values: dict[int, float]  # seed -> value (points)
    mean: float
    lo: float
    hi: float
    p: float
    sd: float
    below: int  # values below zero
    wilcoxon_p: float | None

    @property
    def n(self) -> int:
        return len(self.values)


def paired(values: dict[int, float], confidence: float = 0.95) -> Paired:
    from scipy import stats

    v = np.array([values[s] for s in sorted(values)], dtype=float)
    if len(v) < 2:
        raise ValueError(f"{len(v)} values: a t interval needs 2 or more")
    t = stats.ttest_1samp(v, 0.0)
    ci = t.confidence_interval(confidence)
    w = stats.wilcoxon(v).pvalue if np.any(v != 0) else None
    return Paired(
        values=dict(sorted(values.items())),
        mean=float(v.mean()),
        lo=float(ci.low),
        hi=float(ci.high),
        p=float(t.pvalue),
        sd=float(v.std(ddof=1)),
        below=int((v < 0).sum()),
        wilcoxon_p=None if w is None else float(w),
    )


def bf16_curve(counted: Counted, design: Design = DESIGN) -> np.ndarray:
    """B(t): the mean BF16 training loss at each step over its counted seeds."""
    refs = counted.runs.get(design.reference, {})
    if not refs:
        raise ValueError("no counted BF16 run: every number is relative to the BF16 curve")
    return np.mean([r.loss for r in refs.values()], axis=0)


def _w(design: Design) -> slice:
    return slice(design.steps - design.window, design.steps)


def relative_difference(
    a: ArchivedRun, b: ArchivedRun, curve: np.ndarray, design: Design = DESIGN
) -> float:
    """mean over W of (L_a - L_b) / B, in points."""
    w = _w(design)
    return float(np.mean((a.loss[w] - b.loss[w]) / curve[w]) * 100)


def val_difference(
    a: ArchivedRun, b: ArchivedRun, refs: list[ArchivedRun], design: Design = DESIGN
) -> float | None:
    """The same on the validation losses at the evaluations in W, relative to BF16's mean."""
    first = design.steps - design.window + 1
    steps = sorted(
        s
        for s in a.val_loss
        if s >= first and s in b.val_loss and all(s in r.val_loss for r in refs)
    )
    if not steps:
        return None
    return float(
        np.mean(
            [
                (a.val_loss[s] - b.val_loss[s]) / np.mean([r.val_loss[s] for r in refs])
                for s in steps
            ]
        )
        * 100
    )


@dataclass
class Primary:
    d: Paired  # D[s]
    val: Paired | None  # the same on the fixed validation set
    drop_r2: float | None  # exploratory: share of var(D) explained by the drop-step difference


@dataclass
class Gaps:
    gaps: dict[str, Paired]  # arm -> g[a, s] over the BF16 seeds
    reduction: tuple[float | None, float | None, float | None]  # 1 - ratio, lo, hi (Fieller)


@dataclass
class Ablation:
    fit: PooledFit
    contrasts: list[Contrast]  # the family, with Holm
    control: Contrast  # the negative control (not in the family)
    own: dict[tuple[str, str], Paired]  # each contrast's own paired t (secondary)
    residual_sd: dict[str, float]  # per arm: SD of its residuals (a check of one sigma)


@dataclass
class Analysis:
    counted: Counted
    primary: Primary | None = None
    gaps: Gaps | None = None
    ablation: Ablation | None = None
    missing: dict[str, list[str]] = field(default_factory=dict)  # group -> runs not there


def _missing(counted: Counted, arms, seeds_of) -> list[str]:
    return [f"{a}-s{s}" for a in arms for s in seeds_of(a) if s not in counted.seeds(a)]


def analyse(runs: dict[str, ArchivedRun], design: Design = DESIGN) -> Analysis:
    """Each group's numbers once all of its planned runs count (a diverged run aside, which
    is reported), never before: the pre-registration has no interim test."""
    c = count_runs(runs, design)
    out = Analysis(counted=c)
    ref, base, cand = design.reference, design.baseline, design.candidate
    diverged = set(c.diverged)
    primary = _missing(c, (ref, base, cand), design.seeds_of)
    # the ablation is at the design's seeds for every arm (E2M1's and UFP4's 1-12 among them)
    abl = _missing(
        c, (ref, base, cand, *design.ablation_arms, *design.recipe_arms), lambda arm: design.seeds
    )
    out.missing = {
        "primary": [n for n in primary if n not in diverged],
        "ablation": [n for n in abl if n not in diverged],
    }
    if out.missing["primary"]:
        return out
    curve = bf16_curve(c, design)
    refs = list(c.runs[ref].values())
    both = sorted(c.seeds(base) & c.seeds(cand))
    d = {s: relative_difference(c.runs[cand][s], c.runs[base][s], curve, design) for s in both}
    vals = {
        s: v
        for s in both
        if (v := val_difference(c.runs[cand][s], c.runs[base][s], refs, design)) is not None
    }
    drops = {s: (drop_step(c.runs[cand][s].loss), drop_step(c.runs[base][s].loss)) for s in both}
    keep = [s for s in both if None not in drops[s]]
    r2 = (
        r_squared([drops[s][0] - drops[s][1] for s in keep], [d[s] for s in keep])
        if len(keep) > 2
        else None
    )
    out.primary = Primary(d=paired(d), val=paired(vals) if len(vals) > 1 else None, drop_r2=r2)

    gaps = {}
    for arm in (base, cand, *design.ablation_arms, *design.recipe_arms):
        # an ablation or recipe arm's gap waits until all its seeds count, as its test does
        if [n for n in _missing(c, (arm,), design.seeds_of) if n not in diverged]:
            continue
        seeds = sorted(c.seeds(arm) & c.seeds(ref) & set(design.seeds))
        if len(seeds) > 1:
            gaps[arm] = paired(
                {
                    s: relative_difference(c.runs[arm][s], c.runs[ref][s], curve, design)
                    for s in seeds
                }
            )
    common = sorted(set(gaps[base].values) & set(gaps[cand].values))
    ratio = fieller_ratio(
        [gaps[cand].values[s] for s in common], [gaps[base].values[s] for s in common]
    )
    out.gaps = Gaps(
        gaps=gaps,
        reduction=(
            None if ratio.ratio is None else 1 - ratio.ratio,
            None if ratio.hi is None else 1 - ratio.hi,
            None if ratio.lo is None else 1 - ratio.lo,
        ),
    )

    if not out.missing["ablation"]:
        out.ablation = ablation(c, curve, design)
    return out


def ablation(c: Counted, curve: np.ndarray, design: Design = DESIGN) -> Ablation:
    """The pooled two-way model over every quantized arm at the design's seeds."""
    w = _w(design)
    arms = (design.baseline, design.candidate, *design.ablation_arms, *design.recipe_arms)
    y = {
        (a, s): float(np.mean(c.runs[a][s].loss[w] / curve[w]) * 100)
        for a in arms
        for s in design.seeds
        if s in c.seeds(a)
    }
    fit = fit_two_way(y)
    contrasts = family(fit, list(design.family), 1 - design.alpha)
    control = fit.contrast(*design.negative_control, confidence=1 - design.alpha)
    own = {}
    for a, b in design.family:
        seeds = [s for s in design.seeds if (a, s) in y and (b, s) in y]
        own[(a, b)] = paired({s: y[a, s] - y[b, s] for s in seeds})
    resid = {}
    coef = dict(zip(fit.arms, fit.coef))
    beta = {
        s: (fit.coef[len(fit.arms) + fit.seeds.index(s) - 1] if fit.seeds.index(s) else 0.0)
        for s in fit.seeds
    }
    for a in fit.arms:
        r = [y[a, s] - coef[a] - beta[s] for s in fit.seeds if (a, s) in y]
        resid[a] = float(np.sqrt(np.sum(np.square(r)) / max(1, len(r) - 1)))
    return Ablation(fit=fit, contrasts=contrasts, control=control, own=own, residual_sd=resid)

"""Every table of docs/results.md, computed from the committed archives' per-step losses.

    tables(archives)          {block name: markdown} for every generated block
    check(doc, archives)      the blocks of doc that differ from what the archives give
    write(doc, archives)      rewrites those blocks in place

A block in the doc sits between `<!-- table:NAME -->` and `<!-- /table:NAME -->`; the text
around the blocks is prose, the blocks are this module's output and nothing else (so a number
in a table is one the data gives). `python -m ufp4_megatron.cli.results` runs it.

Folders under `archives` (docs/results/): prereg/ (the pre-registered design), study-pysrc/
(the earlier design: seq 512 x 64 on pysrc; its ablation and depth runs), study/ (the stdlib
corpus), study-pysrc-600steps/ (125M).

The earlier designs' gaps follow compare's definition (report/gap.py): per seed, the mean
over the window of (L - L_bf16) / L_bf16 against the BF16 run of the same seed; the
pre-registered design's are report/prereg.py's.
"""

from __future__ import annotations

import itertools
import math
import re
import tarfile
from pathlib import Path

import numpy as np

from .archives import ArchivedRun, archives, load_study
from .errors import BadInput
from .loss_drop import LEVEL, drop_step, r_squared
from .pooled import family, fit_two_way
from .power import detectable, paired_power
from .prereg import DESIGN, analyse, paired
from .stats import fieller_ratio, seeds_for_power

BLOCK = re.compile(r"<!-- table:([\w-]+) -->\n(.*?)<!-- /table:\1 -->", re.DOTALL)
EARLIER_RECIPES = ("e2m1", "ufp4", "ufp4_int4", "nvfp4", "mxfp4")
EARLIER_ABLATION = (
    "e2m1",
    "ufp4",
    "ufp4_rht_none",
    "ufp4_rht_wgrad",
    "ufp4_rht_dgrad_wgrad",
    "ufp4_rht_fprop_wgrad",
    "ufp4_no_sr",
    "e2m1_rht_all",
    "e2m1_uniform",
    "ufp4_int4",
    "nvfp4",
    "mxfp4",
)


# -- formatting ----------------------------------------------------------------------------
def _s(x: float, digits: int = 2) -> str:
    return f"{x:+.{digits}f}"


def iv(mean: float, lo: float | None, hi: float | None, unit: str = "", digits: int = 2) -> str:
    if lo is None or hi is None:
        return f"{_s(mean, digits)}{unit} [unbounded]"
    return f"{_s(mean, digits)}{unit} [{_s(lo, digits)}, {_s(hi, digits)}]"


def pv(p: float | None) -> str:
    if p is None:
        return "-"
    return f"{p:.2g}" if p >= 0.001 else f"{p:.1e}"


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def per_seed(values: dict[int, float]) -> str:
    return ", ".join(f"{_s(values[s])}" for s in sorted(values))


# -- the earlier designs' per-seed gaps (compare's definition) -----------------------------
def gap(run: ArchivedRun, ref: ArchivedRun, window: int) -> float:
    """mean over the last `window` steps of (L - L_ref) / L_ref, in points."""
    n = min(len(run.loss), len(ref.loss))
    w = slice(n - window, n)
    return float(np.mean((run.loss[w] - ref.loss[w]) / ref.loss[w]) * 100)


def val_gap(run: ArchivedRun, ref: ArchivedRun, window: int) -> float | None:
    n = min(len(run.loss), len(ref.loss))
    steps = [s for s in sorted(run.val_loss) if n - window < s <= n and s in ref.val_loss]
    if not steps:
        return None
    return float(
        np.mean([(run.val_loss[s] - ref.val_loss[s]) / ref.val_loss[s] for s in steps]) * 100
    )


def seed_gaps(
    runs: dict[str, ArchivedRun],
    arm: str,
    window: int,
    seeds=None,
    ref: str = "bf16",
    val: bool = False,
) -> dict[int, float]:
    """seed -> gap (or val gap) of <arm>-s<seed> against <ref>-s<seed>, where both exist."""
    out = {}
    for name, r in runs.items():
        a, _, s = name.rpartition("-s")
        if a != arm or not s.isdigit() or (seeds is not None and int(s) not in seeds):
            continue
        b = runs.get(f"{ref}-s{s}")
        if b is None:
            continue
        v = val_gap(r, b, window) if val else gap(r, b, window)
        if v is not None:
            out[int(s)] = v
    return out


def diff(x: dict[int, float], y: dict[int, float]) -> dict[int, float]:
    return {s: x[s] - y[s] for s in sorted(x.keys() & y.keys())}


def holm(ps: list[float]) -> list[float]:
    from .pooled import holm as _holm

    return _holm(ps)


def reduction(x: dict[int, float], y: dict[int, float]) -> str:
    """1 - mean x / mean y on the common seeds, with Fieller's interval (in %)."""
    seeds = sorted(x.keys() & y.keys())
    r = fieller_ratio([x[s] for s in seeds], [y[s] for s in seeds])
    if r.ratio is None:
        return "-"
    if r.lo is None:
        return f"{(1 - r.ratio) * 100:+.0f}% [unbounded]"
    return f"{(1 - r.ratio) * 100:+.0f}% [{(1 - r.hi) * 100:+.0f}%, {(1 - r.lo) * 100:+.0f}%]"


# -- the pre-registered design -------------------------------------------------------------
def prereg_blocks(folder: Path) -> dict[str, str]:
    runs = load_study(folder) if folder.is_dir() else {}
    a = analyse(runs)
    c = a.counted
    counts = table(
        ["arm", "seeds planned", "runs that count", "not counted", "diverged"],
        [
            [
                arm,
                _seeds_text(DESIGN.seeds_of(arm)),
                str(len(c.seeds(arm))),
                str(sum(n.rsplit("-s", 1)[0] == arm for n, _ in c.excluded)),
                str(sum(n.rsplit("-s", 1)[0] == arm for n in c.diverged)),
            ]
            for arm in DESIGN.arms
        ],
    )
    if c.excluded:
        counts += "\nNot counted: " + "; ".join(f"{n} ({why})" for n, why in c.excluded) + ".\n"
    out = {"prereg-runs": counts}
    if a.primary is None:
        left = len(a.missing["primary"])
        out["prereg-primary"] = (
            f"Not tested: {left} of the primary's 68 runs do not exist "
            f"yet. The test is run once, when all 68 count.\n"
        )
    else:
        p = a.primary
        rows = [
            [
                "UFP4 - E2M1, training loss (primary)",
                str(p.d.n),
                iv(p.d.mean, p.d.lo, p.d.hi, " points"),
                pv(p.d.p),
                f"{p.d.sd:.2f}",
                f"{p.d.below} of {p.d.n}",
                pv(p.d.wilcoxon_p),
            ]
        ]
        if p.val is not None:
            rows.append(
                [
                    "UFP4 - E2M1, fixed validation set",
                    str(p.val.n),
                    iv(p.val.mean, p.val.lo, p.val.hi, " points"),
                    pv(p.val.p),
                    f"{p.val.sd:.2f}",
                    f"{p.val.below} of {p.val.n}",
                    pv(p.val.wilcoxon_p),
                ]
            )
        out["prereg-primary"] = (
            table(
                [
                    "difference",
                    "seeds",
                    "mean [95% CI]",
                    "p (t)",
                    "SD",
                    "seeds below 0",
                    "p (Wilcoxon)",
                ],
                rows,
            )
            + (
                f"\nPer seed (D, points): {per_seed(p.d.values)}. Exploratory: the difference in "
                f"the step of the loss drop explains R^2 = {p.drop_r2:.2f} of D's variance.\n"
                if p.drop_r2 is not None
                else ""
            )
            + _val_against_train(p)
        )
        g = a.gaps
        rows = [[arm, str(x.n), iv(x.mean, x.lo, x.hi, "%")] for arm, x in g.gaps.items()]
        red, lo, hi = g.reduction
        if red is None:
            said = "-"
        elif lo is None:
            said = f"{red * 100:+.0f}% [unbounded]"
        else:
            said = f"{red * 100:+.0f}% [{lo * 100:+.0f}%, {hi * 100:+.0f}%]"
        out["prereg-gaps"] = table(["recipe", "seeds", "gap vs BF16 [95% CI]"], rows) + (
            f"\nReduction of E2M1's gap by UFP4 (secondary; Fieller, seeds "
            f"{_seeds_text(DESIGN.seeds)}): {said}.\n"
        )
    if "prereg-gaps" not in out:
        out["prereg-gaps"] = "Not computed: they come with the primary.\n"
    if a.ablation is None:
        out["prereg-ablation"] = (
            f"Not tested: {len(a.missing['ablation'])} of its runs do not "
            f"exist yet. Tested once, when all count.\n"
        )
    else:
        ab = a.ablation
        rows = [
            [
                f"{x.a} - {x.b}",
                iv(x.estimate, x.lo, x.hi),
                pv(x.p),
                pv(x.p_holm),
                "yes" if x.p_holm < DESIGN.alpha else "no",
                pv(ab.own[(x.a, x.b)].p),
            ]
            for x in ab.contrasts
        ]
        ctl = ab.control
        out["prereg-ablation"] = table(
            [
                "contrast (points)",
                "estimate [95% CI]",
                "p (pooled)",
                "p (Holm, 10)",
                "resolved",
                "own paired p (secondary)",
            ],
            rows,
        ) + (
            f"\nPooled model: {len(ab.fit.arms)} arms x {len(ab.fit.seeds)} seeds, residual SD "
            f"{ab.fit.sigma:.2f} points on {ab.fit.df} degrees of freedom. Negative control "
            f"{ctl.a} - {ctl.b}: {iv(ctl.estimate, ctl.lo, ctl.hi)} points, p = {pv(ctl.p)}.\n"
        )
    return out


def _val_against_train(p) -> str:
    """Exploratory, after the fact: how the validation D follows the training D over seeds."""
    if p.val is None or len(p.val.values) < 3:
        return ""
    seeds = sorted(set(p.val.values) & set(p.d.values))
    x = np.array([p.d.values[s] for s in seeds])
    y = np.array([p.val.values[s] for s in seeds])
    if x.std() == 0 or y.std() == 0:
        return ""
    slope, intercept = np.polyfit(x, y, 1)
    return (
        f"\nExploratory, chosen after the data: validation D against training D over the "
        f"{len(seeds)} seeds, correlation {np.corrcoef(x, y)[0, 1]:.2f}, slope {slope:.1f}, "
        f"intercept {intercept:+.2f} points.\n"
    )


def _seeds_text(seeds) -> str:
    seeds = sorted(seeds)
    if seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(map(str, seeds))


def power_block() -> str:
    """The primary's power at n = 28 and the ablation's smallest detectable contrast."""
    n, df_pooled = len(DESIGN.primary_seeds), (12 - 1) * (12 - 1)
    rows = []
    for sd in (0.8, 0.9, 1.0, 2.77):
        rows.append(
            [
                f"{sd:.2f}",
                f"{paired_power(0.5, sd, n):.2f}",
                f"{paired_power(0.25, sd, n):.2f}",
                f"{detectable(sd / math.sqrt(n), n - 1):.2f}",
                str(seeds_for_power(0.5, sd)),
                f"{detectable(sd / math.sqrt(12), df_pooled, 0.05 / 10):.2f}",
                f"{detectable(sd / math.sqrt(12), df_pooled, 0.05):.2f}",
            ]
        )
    return table(
        [
            "SD of D (points)",
            "power at 0.5 points, n = 28",
            "at 0.25 points",
            "detected at 80% power, n = 28",
            "n for 0.5 at 80%",
            "ablation contrast at 80%, Holm's first step (0.005)",
            "at Holm's last step (0.05)",
        ],
        rows,
    )


# -- the earlier design (seq 512 x 64, pysrc) ----------------------------------------------
def earlier_main_block(runs: dict[str, ArchivedRun]) -> str:
    seeds = range(1, 9)
    tr = {a: seed_gaps(runs, a, 200, seeds) for a in EARLIER_RECIPES}
    va = {a: seed_gaps(runs, a, 200, seeds, val=True) for a in EARLIER_RECIPES}
    tests = {a: paired(diff(tr[a], tr["e2m1"])) for a in EARLIER_RECIPES[1:]}
    adj = dict(zip(tests, holm([t.p for t in tests.values()])))
    rows = []
    for a in EARLIER_RECIPES:
        g, v = paired(tr[a]), paired(va[a])
        t = tests.get(a)
        rows.append(
            [
                a,
                str(g.n),
                iv(g.mean, g.lo, g.hi, "%"),
                iv(v.mean, v.lo, v.hi, "%"),
                "(baseline)" if t is None else iv(t.mean, t.lo, t.hi),
                "-" if t is None else pv(t.p),
                "-" if t is None else pv(adj[a]),
                "-" if t is None else reduction(tr[a], tr["e2m1"]),
            ]
        )
    lines = [
        "Per seed (training gap, %, seeds 1-8): "
        + "; ".join(f"{a} {per_seed(tr[a])}" for a in EARLIER_RECIPES)
        + "."
    ]
    return (
        table(
            [
                "recipe",
                "seeds",
                "training gap vs BF16 [95% CI]",
                "validation gap [95% CI] (seed-dependent batches)",
                "minus E2M1, paired (points) [95% CI]",
                "p",
                "p (Holm, 4)",
                "reduction of E2M1's gap (Fieller)",
            ],
            rows,
        )
        + "\n"
        + "\n".join(lines)
        + "\n"
    )


def earlier_audit_block(runs: dict[str, ArchivedRun]) -> str:
    """Why the earlier design did not resolve the question: the numbers of the audit."""
    from scipy import stats

    seeds = range(1, 9)
    e, u = seed_gaps(runs, "e2m1", 200, seeds), seed_gaps(runs, "ufp4", 200, seeds)
    d = diff(u, e)
    dv = np.array(list(d.values()))
    sd = float(dv.std(ddof=1))
    corr = float(np.corrcoef([u[s] for s in d], [e[s] for s in d])[0, 1])
    e_mean = float(np.mean(list(e.values())))
    recipes = ("bf16", *EARLIER_RECIPES)
    drops = {(a, s): drop_step(runs[f"{a}-s{s}"].loss) for a in recipes for s in seeds}
    allsteps = [v for v in drops.values() if v is not None]
    dd = [drops["ufp4", s] - drops["e2m1", s] for s in d]
    r2 = r_squared(dd, [d[s] for s in d])
    m = np.array([[drops[a, s] for a in recipes] for s in seeds], dtype=float)
    k, n = m.shape[1], m.shape[0]
    msb = k * m.mean(1).var(ddof=1)
    msw = ((m - m.mean(1, keepdims=True)) ** 2).sum() / (n * (k - 1))
    icc = (msb - msw) / (msb + (k - 1) * msw)
    corr_drop = float(
        np.corrcoef([drops["ufp4", s] for s in seeds], [drops["e2m1", s] for s in seeds])[0, 1]
    )
    # the late trend of each gap against its drop timing relative to BF16
    drift, ddrop = [], []
    for a in EARLIER_RECIPES:
        for s in seeds:
            x, b = runs[f"{a}-s{s}"].loss, runs[f"bf16-s{s}"].loss
            g = (x - b) / b * 100
            drift.append(g[900:].mean() - g[800:900].mean())
            ddrop.append(drops[a, s] - drops["bf16", s])
    rt = stats.pearsonr(ddrop, drift)
    main = [f"{a}-s{s}" for a in recipes for s in seeds]
    gn = np.concatenate([runs[n].grad_norm[100:] for n in main])
    clip = runs[main[0]].config["optim"]["clip_grad"]
    excess = max(
        float(
            (
                runs[n].loss[100:-13] - np.convolve(runs[n].loss, np.ones(25) / 25, "same")[100:-13]
            ).max()
        )
        for n in main
    )
    resumed = sum(runs[n].one_process is False for n in main)
    rows = [
        ["SD over seeds of D = UFP4 - E2M1 (points)", f"{sd:.2f}"],
        ["correlation of UFP4's and E2M1's gaps over seeds", f"{corr:+.2f}"],
        [
            f"seeds for 80% power at 20% of E2M1's gap ({0.2 * e_mean:.2f} points) at that SD",
            str(seeds_for_power(0.2 * e_mean, sd)),
        ],
        [
            f"step of the loss drop (25-step mean below {LEVEL} nats/byte), 48 runs",
            f"{min(allsteps)}-{max(allsteps)}",
        ],
        ["share of var(D) explained by the drop-step difference (R^2)", f"{r2:.2f}"],
        ["correlation of UFP4's and E2M1's drop steps over seeds", f"{corr_drop:+.2f}"],
        ["share of the drop step's variance that is the seed's (ICC, 6 recipes)", f"{icc:.2f}"],
        [
            (
                "correlation of a gap's late trend (801-900 to 901-1000) with its drop step minus "
                "BF16's, 40 runs"
            ),
            f"{rt.statistic:+.2f} (p = {pv(rt.pvalue)})",
        ],
        [
            f"steps after 100 with the gradient norm above the clip ({clip})",
            f"{(gn > clip).mean() * 100:.1f}%",
        ],
        [
            "largest single-step loss above its 25-step mean after step 100 (nats/byte)",
            f"{excess:.2f}",
        ],
        ["runs resumed from a checkpoint by a second process", f"{resumed} of {len(main)}"],
    ]
    return table(["quantity (seq 512 x 64, pysrc, seeds 1-8)", "value"], rows)


def earlier_ablation_block(runs: dict[str, ArchivedRun]) -> str:
    """The ablation at 4 seeds, read through the pre-registered analysis applied post hoc:
    one pooled model over the 12 quantized arms of seeds 1-4, the family with Holm."""
    seeds = range(1, 5)
    g = {a: seed_gaps(runs, a, 200, seeds) for a in EARLIER_ABLATION}
    fit = fit_two_way({(a, s): v for a in EARLIER_ABLATION for s, v in g[a].items()})
    cs = family(fit, list(DESIGN.family))
    sds = sorted(
        float(np.std(list(diff(g[a], g[b]).values()), ddof=1))
        for a, b in itertools.combinations(EARLIER_ABLATION, 2)
    )
    rows = []
    for c in cs:
        own = paired(diff(g[c.a], g[c.b]))
        rank = sum(x < own.sd for x in sds) + 1
        rows.append(
            [
                f"{c.a} - {c.b}",
                iv(own.mean, own.lo, own.hi),
                pv(own.p),
                f"{own.sd:.2f} ({rank} of {len(sds)})",
                iv(c.estimate, c.lo, c.hi),
                pv(c.p),
                pv(c.p_holm),
            ]
        )
    arms = []
    for a in EARLIER_ABLATION:
        x = paired(g[a])
        arms.append([a, iv(x.mean, x.lo, x.hi, "%"), per_seed(g[a])])
    flips = list(itertools.product((1, -1), repeat=4))
    return (
        table(["arm", "training gap vs BF16, seeds 1-4 [95% CI]", "per seed (%)"], arms)
        + "\n"
        + table(
            [
                "contrast (points)",
                "paired [95% CI]",
                "p (paired t, 3 df)",
                "paired SD (rank among the 66 pairs)",
                "pooled model [95% CI]",
                f"p (pooled, {fit.df} df)",
                "p (Holm, 10)",
            ],
            rows,
        )
        + f"\nPooled residual SD {fit.sigma:.2f} points; an exact sign-flip test on 4 seeds "
        f"cannot go below {2 / len(flips):.3f}.\n"
    )


def small_block(runs: dict[str, ArchivedRun]) -> str:
    seeds = range(1, 4)
    rows = []
    tr = {a: seed_gaps(runs, f"{a}-small", 120, seeds, ref="bf16-small") for a in ("e2m1", "ufp4")}
    va = {
        a: seed_gaps(runs, f"{a}-small", 120, seeds, ref="bf16-small", val=True)
        for a in ("e2m1", "ufp4")
    }
    t = paired(diff(tr["ufp4"], tr["e2m1"]))
    for a in ("e2m1", "ufp4"):
        x, v = paired(tr[a]), paired(va[a])
        rows.append(
            [
                a,
                str(x.n),
                iv(x.mean, x.lo, x.hi, "%"),
                iv(v.mean, v.lo, v.hi, "%"),
                "(baseline)" if a == "e2m1" else f"{iv(t.mean, t.lo, t.hi)}, p = {pv(t.p)}",
            ]
        )
    return table(
        [
            "recipe",
            "seeds",
            "training gap vs BF16 [95% CI]",
            "validation gap [95% CI]",
            "minus E2M1, paired (points)",
        ],
        rows,
    ) + (
        f"\nPer seed (training gap over steps 481-600, %): e2m1 {per_seed(tr['e2m1'])}; "
        f"ufp4 {per_seed(tr['ufp4'])}. SD of the paired difference {t.sd:.2f} points.\n"
    )


def depth_block(runs: dict[str, ArchivedRun]) -> str:
    rows = []
    for label, tag, seeds in (
        ("3", "-L3", range(1, 4)),
        ("6 (seeds 1-3)", "", range(1, 4)),
        ("6 (seeds 1-8)", "", range(1, 9)),
        ("12", "-L12", range(1, 4)),
    ):
        e = seed_gaps(runs, f"e2m1{tag}", 200, seeds, ref=f"bf16{tag}")
        u = seed_gaps(runs, f"ufp4{tag}", 200, seeds, ref=f"bf16{tag}")
        pe, pu, t = paired(e), paired(u), paired(diff(u, e))
        rows.append(
            [
                label,
                str(pe.n),
                iv(pe.mean, pe.lo, pe.hi, "%"),
                iv(pu.mean, pu.lo, pu.hi, "%"),
                f"{iv(t.mean, t.lo, t.hi)}, p = {pv(t.p)}",
            ]
        )
    e6 = seed_gaps(runs, "e2m1", 200, range(1, 4))
    e12 = seed_gaps(runs, "e2m1-L12", 200, range(1, 4), ref="bf16-L12")
    u6, u12 = (
        seed_gaps(runs, "ufp4", 200, range(1, 4)),
        seed_gaps(runs, "ufp4-L12", 200, range(1, 4), ref="bf16-L12"),
    )
    ch = paired(diff(e12, e6))
    dd = paired(diff(diff(u12, e12), diff(u6, e6)))
    need = seeds_for_power(1.0, ch.sd)
    return table(
        [
            "layers",
            "seeds",
            "E2M1 gap [95% CI]",
            "UFP4 gap [95% CI]",
            "UFP4 - E2M1, paired (points)",
        ],
        rows,
    ) + (
        f"\nFrom 6 to 12 layers on seeds 1-3: E2M1's gap changes by {iv(ch.mean, ch.lo, ch.hi)} "
        f"points; UFP4 - E2M1 changes by {iv(dd.mean, dd.lo, dd.hi)} points (p = {pv(dd.p)}). "
        f"At the SD of E2M1's change over those seeds ({ch.sd:.2f} points), seeing it grow by 1 "
        f"point with 80% power would take {need} paired seeds per depth.\n"
    )


def stdlib_block(runs: dict[str, ArchivedRun]) -> str:
    tr = {a: seed_gaps(runs, a, 200) for a in ("e2m1", "ufp4")}
    va = {a: seed_gaps(runs, a, 200, val=True) for a in ("e2m1", "ufp4")}
    t = paired(diff(tr["ufp4"], tr["e2m1"]))
    rows = []
    for a in ("e2m1", "ufp4"):
        x, v = paired(tr[a]), paired(va[a])
        rows.append(
            [
                a,
                _seeds_text(tr[a]),
                iv(x.mean, x.lo, x.hi, "%"),
                iv(v.mean, v.lo, v.hi, "%"),
                "(baseline)"
                if a == "e2m1"
                else f"{iv(t.mean, t.lo, t.hi)} ({t.n} seeds), p = {pv(t.p)}",
            ]
        )
    return table(
        [
            "recipe",
            "seeds",
            "training gap vs BF16 [95% CI]",
            "validation gap [95% CI]",
            "minus E2M1, paired (points)",
        ],
        rows,
    )


def _mechanism_json(folder: Path, run: str) -> dict:
    import json

    for a in archives(folder):
        with tarfile.open(a) as tf:
            for m in tf:
                if m.name.lstrip("./") == f"mechanism/{run}/mechanism.json":
                    return json.loads(tf.extractfile(m).read())
    raise BadInput(f"no mechanism/{run}/mechanism.json in {folder}'s archives")


def mechanism_block(folder: Path) -> str:
    """Means over the layers of the bf16-trained model (stdlib, seed 1), per GEMM operand."""
    rows = _mechanism_json(folder, "bf16-s1")["rows"]
    out = []
    for gemm, op in (
        ("fprop", "x"),
        ("fprop", "w"),
        ("dgrad", "dy"),
        ("wgrad", "dy"),
        ("wgrad", "x"),
    ):
        cell = {}
        for grid in ("e2m1", "e1m2"):
            sel = [r for r in rows if (r["gemm"], r["operand"], r["grid"]) == (gemm, op, grid)]
            cell[grid] = (
                np.mean([r["alpha_none"] for r in sel]),
                np.mean([r["dsqnr"] for r in sel]),
            )
        out.append(
            [
                f"{gemm}.{op}",
                f"{cell['e2m1'][0]:.4f}",
                f"{cell['e1m2'][0]:.4f}",
                f"{cell['e2m1'][1]:+.2f}",
                f"{cell['e1m2'][1]:+.2f}",
            ]
        )
    e2m1 = [r for r in rows if r["grid"] == "e2m1"]
    by = {
        (r["layer"], r["linear"], r["gemm"], r["operand"]): r["alpha_none"]
        for r in rows
        if r["grid"] == "e1m2"
    }
    below_one = sum(r["alpha_none"] < 1 for r in e2m1)
    below_e1m2 = sum(
        r["alpha_none"] < by[r["layer"], r["linear"], r["gemm"], r["operand"]] for r in e2m1
    )
    lowers = sum(r["dsqnr"] < -0.1 for r in e2m1)
    raises = sum(r["dsqnr"] > 0.1 for r in rows if r["grid"] == "e1m2")
    return table(
        [
            "GEMM.operand",
            "alpha E2M1",
            "alpha E1M2 (= INT4)",
            "dSQNR of RHT16, E2M1 (dB)",
            "dSQNR of RHT16, E1M2 (dB)",
        ],
        out,
    ) + (
        f"\nE2M1's alpha is below 1 on {below_one} of {len(e2m1)} operand measurements (layer x "
        f"linear x operand) and below E1M2's on {below_e1m2}; RHT16 lowers E2M1's SQNR by more "
        f"than 0.1 dB on {lowers} of them and raises E1M2's by more than 0.1 dB on {raises}.\n"
    )


def mechanism_products_block(root: Path) -> str:
    """The product of alpha_A alpha_B over the forward GEMMs, on each model measured."""
    rows = []
    for label, folder, run in (
        ("11M, stdlib", "study", "bf16-s1"),
        ("11M, stdlib", "study", "e2m1-s1"),
        ("11M, stdlib", "study", "ufp4-s1"),
        ("11M, pysrc", "study-pysrc", "bf16-s1"),
        ("11M, pysrc", "study-pysrc", "e2m1-s1"),
        ("11M, pysrc", "study-pysrc", "ufp4-s1"),
        ("125M, pysrc", "study-pysrc-600steps", "bf16-small-s1"),
        ("125M, pysrc", "study-pysrc-600steps", "e2m1-small-s1"),
        ("125M, pysrc", "study-pysrc-600steps", "ufp4-small-s1"),
    ):
        prod = _mechanism_json(root / folder, run)["products"]
        k = len(prod["e2m1/none/fprop"])
        e2m1 = prod["e2m1/none/fprop"][-1]
        rows.append(
            [
                label,
                run.split("-")[0],
                str(k),
                f"{e2m1:.3f}",
                f"{prod['e2m1/rht/fprop'][-1]:.3f}",
                f"{prod['e1m2/none/fprop'][-1]:.3f}",
                f"{prod['e1m2/rht/fprop'][-1]:.3f}",
                f"{(1 - e2m1 ** (1 / k)) * 100:.2f}%",
            ]
        )
    return table(
        [
            "model (seed 1)",
            "trained with",
            "forward GEMMs",
            "E2M1",
            "E2M1 with RHT16",
            "E1M2",
            "E1M2 with RHT16",
            "E2M1's shrinkage per GEMM",
        ],
        rows,
    )


def tables(root: Path) -> dict[str, str]:
    root = Path(root)
    pysrc = load_study(root / "study-pysrc")
    out = prereg_blocks(root / "prereg")
    out["prereg-power"] = power_block()
    out["earlier-main"] = earlier_main_block(pysrc)
    out["earlier-audit"] = earlier_audit_block(pysrc)
    out["earlier-ablation"] = earlier_ablation_block(pysrc)
    out["depth"] = depth_block(pysrc)
    out["small"] = small_block(load_study(root / "study-pysrc-600steps"))
    out["stdlib"] = stdlib_block(load_study(root / "study"))
    out["mechanism"] = mechanism_block(root / "study")
    out["mechanism-products"] = mechanism_products_block(root)
    return out


def blocks(doc: str) -> dict[str, str]:
    return {m[1]: m[2] for m in BLOCK.finditer(doc)}


def check(doc_path: Path, root: Path) -> list[str]:
    """The problems: a block that differs, one the doc lacks, one the doc has in excess."""
    have, want = blocks(Path(doc_path).read_text()), tables(root)
    problems = [
        f"table {k}: differs from what the archives give"
        for k in want
        if k in have and have[k] != want[k]
    ]
    problems += [
        f"table {k}: missing (add <!-- table:{k} --> ... <!-- /table:{k} -->)"
        for k in want
        if k not in have
    ]
    problems += [f"table {k}: no such table" for k in have if k not in want]
    return problems


def write(doc_path: Path, root: Path) -> list[str]:
    """Rewrites every block the doc has; returns the names changed."""
    text = Path(doc_path).read_text()
    want = tables(root)
    changed = []

    def sub(m):
        name = m[1]
        if name in want and want[name] != m[2]:
            changed.append(name)
            return f"<!-- table:{name} -->\n{want[name]}<!-- /table:{name} -->"
        return m[0]

    Path(doc_path).write_text(BLOCK.sub(sub, text))
    return changed

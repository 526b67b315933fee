"""The compare run in W&B: gap curves per recipe and seed against tokens, their mean and
confidence band over seeds, the latest-N table with intervals, the plot; in the group of the
training runs (the experiment), so they sit together.

One compare run per experiment: its id is a function of (entity, project, group), so every
compare of the experiment (each sweep's, each `ufp4-compare` by hand) updates the same run
(`resume="allow"`) instead of leaving stale ones beside it. So that an update replaces rather
than appends, the curves are tables (W&B shows the latest logged table of a key), the numbers
are summary values (overwritten), and nothing is a history series that a second compare would
draw twice.

    gap_curves/<model>                    wandb.Table (tokens, train_step, recipe, series, gap):
                                          series "<recipe> s<seed>" per seed (smoothed as the
                                          plot), "<recipe> mean|lo|hi" over seeds (the band)
    loss_gap_table, loss_gap_per_seed     wandb.Table: the latest-N means with intervals
    loss_gap/<model>/<recipe>/{mean,lo,hi}, reduction/<model>/<recipe>/{value,lo,hi},
    difference/<model>/<recipe>/{value,lo,hi,p}   summary (difference: minus the baseline's gap,
                                                  paired by seed)
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .gap import Comparison
from .plot import seed_curves
from .stats import t_band
from .summary import RecipeSummary
from .table import difference_cell, gap_cell, reduction_cell

SUMMARY_ROOTS = ("loss_gap", "reduction", "difference")  # the summary keys written below
CURVE_COLUMNS = ["tokens", "train_step", "recipe", "series", "gap"]
TABLE_COLUMNS = [
    "model",
    "recipe",
    "n_seeds",
    "train_gap",
    "train_lo",
    "train_hi",
    "train_resolved",
    "val_gap",
    "val_lo",
    "val_hi",
    "reduction",
    "reduction_lo",
    "reduction_hi",
    "reduction_resolved",
    "train_gap_text",
    "reduction_text",
    "difference",
    "difference_lo",
    "difference_hi",
    "difference_p",
    "difference_text",
]


def _rows(s: RecipeSummary) -> list:
    v, r, p = s.val, s.vs_baseline, s.vs_baseline_paired
    d = p and p.train
    flip = lambda x: None if x is None else 1 - x
    return [
        s.model,
        s.recipe,
        len(s.seeds),
        s.train.mean,
        s.train.lo,
        s.train.hi,
        s.train.resolved,
        v and v.mean,
        v and v.lo,
        v and v.hi,
        r and flip(r.ratio),
        r and flip(r.hi),
        r and flip(r.lo),
        s.reduction_resolved,
        gap_cell(s.train),
        reduction_cell(s),
        d and d.mean,
        d and d.lo,
        d and d.hi,
        p and p.train_p,
        difference_cell(s),
    ]


def compare_id(entity: str | None, project: str, group: str) -> str:
    """The W&B id of an experiment's compare run: the same for every compare of it."""
    where = hashlib.sha256(f"{entity or ''}/{project}/{group}".encode()).hexdigest()[:12]
    return f"compare-{where}"


def log_compare(
    cmp: Comparison,
    summaries: list[RecipeSummary],
    *,
    table_md: str,
    png: Path,
    out: Path,
    mode: str,
    project: str,
    entity: str | None,
    group: str,
    config: dict,
    smooth: int,
    confidence: float,
):
    """Logs the comparison as one W&B run (job_type compare); returns it, finished."""
    import wandb

    from ..train.logs.wandb_run import init

    run = init(
        str(out),
        project=project,
        entity=entity,
        group=group,
        name=f"compare-{group}",
        id=compare_id(entity, project, group),
        resume="allow",
        job_type="compare",
        mode=mode,
        dir=str(out),
        config=config,
        settings=wandb.Settings(quiet=True),
    )
    run.config.update(config, allow_val_change=True)  # this compare's runs and window
    for key in list(run.summary.keys()):  # a resumed run's numbers of recipes no longer here
        if key.split("/")[0] in SUMMARY_ROOTS:
            del run.summary[key]
    curves = {}
    for model, w in cmp.windows.items():
        table = wandb.Table(columns=CURVE_COLUMNS)
        for s in (s for s in summaries if s.model == model):
            x, rows = seed_curves(cmp, s, smooth)
            named = dict(zip(("mean", "lo", "hi"), t_band(rows, confidence)))
            named |= {f"s{g.seed}": row for g, row in zip(s.seeds, rows)}
            for series, values in named.items():
                for i, step in enumerate(w.common):  # one row per common step
                    table.add_data(x[i], step, s.recipe, f"{s.recipe} {series}", float(values[i]))
        curves[f"gap_curves/{model}"] = table
    table = wandb.Table(columns=TABLE_COLUMNS)
    per_seed = wandb.Table(
        columns=[
            "model",
            "recipe",
            "seed",
            "train_gap",
            "val_gap",
            "baseline_train_gap",
            "source",
            "reference",
        ]
    )
    for s in summaries:
        table.add_data(*_rows(s))
        for g in s.seeds:
            per_seed.add_data(
                s.model,
                s.recipe,
                g.seed,
                g.train_gap,
                g.val_gap,
                s.baseline_gaps.get(g.seed),
                g.run.source,
                g.reference.source,
            )
        run.summary[f"loss_gap/{s.model}/{s.recipe}/mean"] = s.train.mean
        run.summary[f"loss_gap/{s.model}/{s.recipe}/lo"] = s.train.lo
        run.summary[f"loss_gap/{s.model}/{s.recipe}/hi"] = s.train.hi
        if s.vs_baseline is not None and s.vs_baseline.ratio is not None:
            r = s.vs_baseline
            run.summary[f"reduction/{s.model}/{s.recipe}/value"] = 1 - r.ratio
            run.summary[f"reduction/{s.model}/{s.recipe}/lo"] = None if r.hi is None else 1 - r.hi
            run.summary[f"reduction/{s.model}/{s.recipe}/hi"] = None if r.lo is None else 1 - r.lo
        if s.vs_baseline_paired is not None:
            p = s.vs_baseline_paired
            for key, value in (
                ("value", p.train.mean),
                ("lo", p.train.lo),
                ("hi", p.train.hi),
                ("p", p.train_p),
            ):
                run.summary[f"difference/{s.model}/{s.recipe}/{key}"] = value
    run.log(
        curves
        | {
            "loss_gap_table": table,
            "loss_gap_per_seed": per_seed,
            "loss_gap_plot": wandb.Image(str(png)),
            "loss_gap_markdown": wandb.Html(f"<pre>{table_md}</pre>"),
        }
    )
    run.finish()
    return run

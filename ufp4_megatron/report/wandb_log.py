"""The compare run in W&B: gap curves per recipe and seed against tokens, their mean and
confidence band over seeds, the latest-N table with intervals, the plot; in the group of the
training runs (the experiment), so they sit together.

    gap/<model>/<recipe>/s<seed>          per seed, x = tokens (smoothed as the plot)
    gap/<model>/<recipe>/{mean,lo,hi}     over seeds, the pointwise band
    loss_gap_table, loss_gap_per_seed     wandb.Table: the latest-N means with intervals
    loss_gap/<model>/<recipe>/{mean,lo,hi}, reduction/<model>/<recipe>/{value,lo,hi},
    difference/<model>/<recipe>/{value,lo,hi,p}   summary (difference: minus the baseline's gap,
                                                  paired by seed)
"""
from __future__ import annotations

from pathlib import Path

from .gap import Comparison
from .plot import seed_curves
from .summary import RecipeSummary
from .stats import t_band
from .table import difference_cell, gap_cell, reduction_cell

TABLE_COLUMNS = ["model", "recipe", "n_seeds", "train_gap", "train_lo", "train_hi",
                 "train_resolved", "val_gap", "val_lo", "val_hi", "reduction", "reduction_lo",
                 "reduction_hi", "reduction_resolved", "train_gap_text", "reduction_text",
                 "difference", "difference_lo", "difference_hi", "difference_p",
                 "difference_text"]


def _rows(s: RecipeSummary) -> list:
    v, r, p = s.val, s.vs_baseline, s.vs_baseline_paired
    d = p and p.train
    flip = (lambda x: None if x is None else 1 - x)
    return [s.model, s.recipe, len(s.seeds), s.train.mean, s.train.lo, s.train.hi,
            s.train.resolved, v and v.mean, v and v.lo, v and v.hi,
            r and flip(r.ratio), r and flip(r.hi), r and flip(r.lo), s.reduction_resolved,
            gap_cell(s.train), reduction_cell(s),
            d and d.mean, d and d.lo, d and d.hi, p and p.train_p, difference_cell(s)]


def log_compare(cmp: Comparison, summaries: list[RecipeSummary], *, table_md: str, png: Path,
                out: Path, mode: str, project: str, entity: str | None, group: str,
                config: dict, smooth: int, confidence: float):
    """Logs the comparison as one W&B run (job_type compare); returns it, finished."""
    import wandb

    from ..train.wandb_run import init

    run = init(str(out), project=project, entity=entity, group=group, name=f"compare-{group}",
               job_type="compare", mode=mode, dir=str(out), config=config,
               settings=wandb.Settings(quiet=True))
    run.define_metric("tokens")
    run.define_metric("gap/*", step_metric="tokens")
    for model, w in cmp.windows.items():
        x, series = None, {}
        for s in (s for s in summaries if s.model == model):
            x, rows = seed_curves(cmp, s, smooth)
            base = f"gap/{model}/{s.recipe}"
            series |= dict(zip((f"{base}/mean", f"{base}/lo", f"{base}/hi"),
                               t_band(rows, confidence)))
            series |= {f"{base}/s{g.seed}": row for g, row in zip(s.seeds, rows)}
        for i, step in enumerate(w.common if x else []):  # one row per common step
            run.log({"tokens": x[i], "train_step": step} |
                    {k: float(v[i]) for k, v in series.items()})
    table = wandb.Table(columns=TABLE_COLUMNS)
    per_seed = wandb.Table(columns=["model", "recipe", "seed", "train_gap", "val_gap",
                                    "baseline_train_gap", "source", "reference"])
    for s in summaries:
        table.add_data(*_rows(s))
        for g in s.seeds:
            per_seed.add_data(s.model, s.recipe, g.seed, g.train_gap, g.val_gap,
                              s.baseline_gaps.get(g.seed), g.run.source, g.reference.source)
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
            for key, value in (("value", p.train.mean), ("lo", p.train.lo),
                               ("hi", p.train.hi), ("p", p.train_p)):
                run.summary[f"difference/{s.model}/{s.recipe}/{key}"] = value
    run.log({"loss_gap_table": table, "loss_gap_per_seed": per_seed,
             "loss_gap_plot": wandb.Image(str(png)),
             "loss_gap_markdown": wandb.Html(f"<pre>{table_md}</pre>")})
    run.finish()
    return run

"""`python -m ufp4_megatron.compare RUN...` (`ufp4-compare`): BF16-relative loss gaps.

RUN is a training run dir (with metrics.jsonl), an offline W&B run (dir or .wandb file) or an
online W&B run path entity/project/run_id. For every non-BF16 run, against the BF16 run of the
same model and seed: the gap (L - L_bf16) / L_bf16 on identical steps, its mean over the
latest --last steps (1000, as in the paper), and the validation-loss gap. Writes
<out>/loss_gap.md and <out>/loss_gap.png and logs both (plus the gap curves) to W&B.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from .gap import GapRow, compare, markdown_table
from .plot import plot_gaps
from .runs import load_run


def log_to_wandb(rows: list[GapRow], table_md: str, png: Path, args) -> None:
    import wandb

    from ..train.wandb_run import resolve_mode

    mode = resolve_mode(args.wandb_mode)
    if mode == "disabled":
        return
    run = wandb.init(project=args.project, group=args.group, name=f"compare-{args.group}",
                     job_type="compare", mode=mode, dir=str(args.out),
                     settings=wandb.Settings(quiet=True))
    table = wandb.Table(columns=["model", "seed", "recipe", "steps", "loss_gap", "val_gap"])
    for r in rows:
        table.add_data(r.model, r.seed, r.recipe, r.steps, r.loss_gap, r.val_gap)
        run.summary[f"loss_gap/{r.model}/{r.recipe}"] = r.loss_gap
    steps = sorted({s for r in rows for s in r.series})
    for s in steps:  # one chart per recipe, x = training step
        run.log({f"gap/{r.model}/{r.recipe}": r.series[s] for r in rows if s in r.series}, step=s)
    run.log({"loss_gap_table": table, "loss_gap_plot": wandb.Image(str(png)),
             "loss_gap_markdown": wandb.Html(f"<pre>{table_md}</pre>")})
    run.finish()


def run(argv: list[str] | None = None) -> list[GapRow]:
    ap = argparse.ArgumentParser(prog="ufp4-compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run dirs, offline W&B runs, or entity/project/run_id")
    ap.add_argument("--reference", default="bf16", help="precision name of the reference runs")
    ap.add_argument("--baseline", default="e2m1", help="recipe whose gap others are measured by")
    ap.add_argument("--last", type=int, default=1000, help="steps in the mean (latest N)")
    ap.add_argument("--smooth", type=int, default=1, help="moving-average window of the plot")
    ap.add_argument("--out", type=Path, default=Path("runs/compare"))
    ap.add_argument("--wandb-mode", default="auto", help="auto | offline | online | disabled")
    ap.add_argument("--project", default="ufp4-megatron")
    ap.add_argument("--group", default="compare", help="W&B group (the experiment)")
    args = ap.parse_args(argv)

    runs = [load_run(src) for src in args.runs]
    rows = compare(runs, reference=args.reference, last=args.last)
    table = markdown_table(rows, args.last, baseline=args.baseline)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "loss_gap.md").write_text(table + "\n")
    png = plot_gaps(rows, runs, args.out / "loss_gap.png", smooth=args.smooth)
    print(table)
    print(f"wrote {args.out / 'loss_gap.md'} and {png}")
    log_to_wandb(rows, table, png, args)
    return rows


def main(argv: list[str] | None = None) -> None:
    """Console-script entry (`ufp4-compare`): returns None, so the exit status is 0."""
    run(argv)


if __name__ == "__main__":
    main()

"""`ufp4-compare RUN...` (`python -m ufp4_megatron.cli.compare`): BF16-relative loss gaps over runs
and seeds, with confidence intervals.

RUN is a training run dir (with metrics.jsonl), an offline W&B run (dir or .wandb file), or
an online W&B run `entity/project/run_id` (`wandb:entity/project/run_id` to be explicit).
Every non-BF16 run is paired with the BF16 run of the same seed, model, data and batch; all runs
of a model are compared over the steps they all logged. Per recipe: the mean over seeds of
the gap (L - L_bf16) / L_bf16 averaged over the latest --last steps (1000, as in the paper),
with a Student-t interval over seeds; the validation gap likewise; the ratio to E2M1's gap,
paired by seed, with Fieller's interval ("reduction" = 1 - ratio). An interval that contains
zero is reported as "not resolved at this size".

Writes <out>/loss_gap.md, <out>/loss_gap.json (keys: docs/comparing.md), <out>/loss_gap.png,
<out>/wandb_workspace.json, and a W&B run (job_type compare) in the training runs' group.
Bad input (a missing run, --last 0, a run given twice, no BF16 sibling, a sibling trained on
another LR schedule, a run whose loss went NaN, an --out that is a file) ends with one line
and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import BadInput
from .gap import Comparison, check_window, compare
from .plot import plot_gaps
from .runs import Run, config_value, load_run
from .summary import RecipeSummary, summarize, to_json
from .table import markdown


def _prog() -> str:
    return (
        "ufp4-compare"
        if Path(sys.argv[0]).name == "ufp4-compare"
        else "python -m ufp4_megatron.cli.compare"
    )


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=_prog(), description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="run dirs, offline W&B runs, or entity/project/run_id",
    )
    ap.add_argument("--reference", default="bf16", help="precision name of the reference runs")
    ap.add_argument(
        "--baseline",
        default="e2m1",
        help="recipe whose gap the others are divided by (the paper's reduction)",
    )
    window = ap.add_mutually_exclusive_group()
    window.add_argument(
        "--last", type=int, default=None, help="mean over the latest N common steps (default 1000)"
    )
    window.add_argument(
        "--last-fraction",
        type=float,
        default=None,
        metavar="F",
        help="mean over the latest fraction F of the common steps, e.g. 0.2",
    )
    ap.add_argument("--confidence", type=float, default=0.95, help="interval level (0.95)")
    ap.add_argument(
        "--smooth",
        type=int,
        default=1,
        help="moving-average window (steps) of the plot and the W&B curves",
    )
    ap.add_argument("--out", type=Path, default=Path("runs/compare"))
    ap.add_argument("--wandb-mode", default="auto", help="auto | offline | online | disabled")
    ap.add_argument(
        "--project", default=None, help="W&B project (default: the runs' logging.wandb.project)"
    )
    ap.add_argument("--entity", default=None, help="W&B entity (default: the runs')")
    ap.add_argument(
        "--group",
        default=None,
        help="W&B group (default: the runs' experiment, when they share one)",
    )
    return ap


def _check(args) -> None:
    if args.last is None and args.last_fraction is None:
        args.last = 1000
    check_window(args.last, args.last_fraction)
    if not 0 < args.confidence < 1:
        raise BadInput(f"--confidence {args.confidence}: must be in (0, 1), e.g. 0.95")
    if args.smooth < 1:
        raise BadInput(f"--smooth {args.smooth}: must be >= 1 (1: no smoothing)")
    if args.out.exists() and not args.out.is_dir():
        raise BadInput(
            f"--out {args.out}: a file is there; give a directory (loss_gap.md, "
            ".json and .png are written into it)"
        )


def _shared(runs: list[Run], *keys, default=None):
    """The value all runs' configs agree on, else the default."""
    values = {config_value(r.config, *keys) for r in runs} - {None}
    return values.pop() if len(values) == 1 else default


@dataclass
class CompareResult:
    comparison: Comparison
    summaries: list[RecipeSummary]
    data: dict  # what loss_gap.json holds
    out: Path


def run(argv: list[str] | None = None) -> CompareResult:
    """The whole comparison; raises BadInput on bad input (main() turns it into exit 2)."""
    args = parser().parse_args(argv)
    _check(args)
    runs = [load_run(src) for src in args.runs]
    cmp = compare(runs, reference=args.reference, last=args.last, last_fraction=args.last_fraction)
    summaries, more = summarize(cmp, baseline=args.baseline, confidence=args.confidence)
    notes = cmp.notes + more
    window = (
        f"the latest {args.last} steps"
        if args.last is not None
        else f"the latest {args.last_fraction:.0%}"
    )
    kw = dict(reference=args.reference, baseline=args.baseline, confidence=args.confidence)
    table = markdown(cmp, summaries, window_text=window, notes=notes, **kw)
    data = to_json(
        cmp, summaries, last=args.last, last_fraction=args.last_fraction, notes=notes, **kw
    )
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "loss_gap.md").write_text(table + "\n")
    (out / "loss_gap.json").write_text(json.dumps(data, indent=1) + "\n")
    png = plot_gaps(
        cmp, summaries, out / "loss_gap.png", smooth=args.smooth, confidence=args.confidence
    )
    print(table)
    print(f"wrote {out / 'loss_gap.md'}, {out / 'loss_gap.json'} and {png}")
    _to_wandb(args, runs, cmp, summaries, table, png)
    return CompareResult(cmp, summaries, data, out)


def _to_wandb(args, runs, cmp, summaries, table, png) -> None:
    from ..train.logs.wandb_run import resolve_mode
    from . import workspace
    from .wandb_log import log_compare

    group = args.group or _shared(runs, "experiment", default="compare")
    project = args.project or _shared(runs, "logging", "wandb", "project", default="ufp4-megatron")
    entity = args.entity or _shared(runs, "logging", "wandb", "entity")
    mode = resolve_mode(args.wandb_mode)
    if mode != "disabled":
        config = {
            "reference": args.reference,
            "baseline": args.baseline,
            "confidence": args.confidence,
            "last": args.last,
            "last_fraction": args.last_fraction,
            "smooth": args.smooth,
            "runs": [r.source for r in runs],
        }
        wb = log_compare(
            cmp,
            summaries,
            table_md=table,
            png=png,
            out=args.out,
            mode=mode,
            project=project,
            entity=entity,
            group=group,
            config=config,
            smooth=args.smooth,
            confidence=args.confidence,
        )
        if mode == "online" and wb.settings.mode == "offline":  # no W&B server: said there
            mode = "offline"
        entity = entity or (wb.entity if mode == "online" else None)
        print(f"W&B ({mode}): run compare-{group} in project {project}, group {group}")
    layers = sorted(
        {
            i
            for r in runs
            for i in (config_value(r.config, "logging", "wandb", "diagnostics_layers") or [0])
        }
    )
    recipes: dict[str, list[str]] = {}
    for s in summaries:
        recipes.setdefault(s.model, []).append(s.recipe)
    try:
        path = workspace.write(
            args.out / "wandb_workspace.json",
            entity=entity,
            project=project,
            group=group,
            recipes=recipes,
            layers=layers,
            reference=args.reference,
            baseline=args.baseline,
        )
    except ImportError:
        print("note: wandb-workspaces is not installed: no dashboard definition written")
        return
    print(f"wrote the W&B dashboard definition {path}")
    if mode == "online":
        print(f"W&B workspace: {workspace.save(path, entity)}")


def main(argv: list[str] | None = None) -> int:
    """Console-script entry: exit status 0, or 2 with one line on bad input."""
    try:
        run(argv)
    except BadInput as e:
        print(f"{_prog()}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

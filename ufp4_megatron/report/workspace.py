"""The gap dashboard as a W&B workspace (`wandb-workspaces`), for one experiment (W&B group).

Sections, each panel against tokens:
  Gap vs BF16 (compare run)     the compare run's table gap_curves/<model> (its latest
                                version: the experiment's latest compare) as a line chart,
                                one line per recipe and series (mean, lo, hi, s<seed>)
  Live gap (training runs)      gap_vs_bf16, gap_vs_e2m1 of each run while it trains, runs
                                grouped by precision.name: mean over seeds, band = +-1 standard
                                error (W&B's own grouping; the 95% band is the compare run's)
  Loss                          loss and val_loss, grouped by precision.name the same way
  Per-layer diagnostics         diag/layer<i>.<linear>/<gemm>.<operand>/<stat> for alpha,
                                sqnr_db, delta_sqnr_db, bucket_ratio (a regex per layer)

Offline (no key or no network) the definition is written as JSON (`wandb_workspace.json`:
the builder's arguments and the view spec W&B would store); online it is also saved to the
project. `python -m ufp4_megatron.report.workspace FILE` saves a written one later.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

STATS = ("alpha", "sqnr_db", "delta_sqnr_db", "bucket_ratio")


def build(
    *,
    entity: str | None,
    project: str,
    group: str,
    recipes: dict[str, list[str]],
    layers: tuple[int, ...] | list[int] = (0,),
    reference: str = "bf16",
    baseline: str = "e2m1",
):
    """recipes: model -> recipe labels of the compare run."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    by_recipe = dict(
        groupby=wr.Config("precision.name"), groupby_aggfunc="mean", groupby_rangefunc="stderr"
    )
    gap = [
        wr.CustomChart(
            query={"summaryTable": {"tableKey": f"gap_curves/{model}"}},
            chart_name="wandb/line/v0",
            chart_fields={"x": "tokens", "y": "gap", "groupKeys": "series"},
            chart_strings={
                "title": f"{model}: gap vs {reference} ({', '.join(labels)}; mean, lo, hi, seeds)"
            },
        )
        for model, labels in recipes.items()
    ]
    live = [
        wr.LinePlot(
            title=f"live gap_vs_{ref} (runs grouped by recipe, +-1 s.e.)",
            x=f"gap_vs_{ref}_at_tokens",
            y=[f"gap_vs_{ref}"],
            **by_recipe,
        )
        for ref in (reference, baseline)
    ]
    loss = [
        wr.LinePlot(title=f"{key} (grouped by recipe, +-1 s.e.)", x="tokens", y=[key], **by_recipe)
        for key in ("loss", "val_loss")
    ]
    diag = [
        wr.LinePlot(
            title=f"layer {i}: {stat}", x="tokens", metric_regex=rf"diag/layer{i}\..*/{stat}"
        )
        for i in layers
        for stat in STATS
    ]
    sections = [
        ws.Section(name=name, panels=panels, is_open=True)
        for name, panels in (
            (f"Gap vs {reference} (compare run)", gap),
            ("Live gap (training runs)", live),
            ("Loss", loss),
            ("Per-layer diagnostics", diag),
        )
    ]
    return ws.Workspace(
        entity=entity or "<entity>",
        project=project,
        name=f"ufp4 gap: {group}",
        sections=sections,
        settings=ws.WorkspaceSettings(x_axis="tokens"),
        runset_settings=ws.RunsetSettings(filters=f"Group == '{group}'"),
    )


def write(path: Path, **kwargs) -> Path:
    """The definition as JSON: {"args": build()'s arguments, "view": the spec W&B stores}."""
    view = build(**kwargs)._to_model().model_dump(mode="json", by_alias=True, exclude_none=True)
    path = Path(path)
    path.write_text(json.dumps({"args": kwargs, "view": view}, indent=1))
    return path


def save(path: Path, entity: str | None = None) -> str:
    """Builds the written definition again and saves it to W&B (online, with a key); its URL."""
    args = json.loads(Path(path).read_text())["args"]
    args["entity"] = entity or args.get("entity")
    if not args["entity"]:
        import wandb

        args["entity"] = wandb.Api().default_entity
    return build(**args).save().url


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m ufp4_megatron.report.workspace",
        description="Save a gap dashboard written by ufp4-compare (wandb_workspace.json) to W&B.",
    )
    ap.add_argument("file", type=Path)
    ap.add_argument("--entity", default=None, help="default: the one in the file, else yours")
    args = ap.parse_args(argv)
    if not args.file.is_file():
        print(f"{ap.prog}: error: no such file: {args.file}", file=sys.stderr)
        return 2
    print(save(args.file, args.entity))
    return 0


if __name__ == "__main__":
    sys.exit(main())

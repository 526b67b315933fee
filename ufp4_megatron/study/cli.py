"""`ufp4-launch study` (also `python -m ufp4_megatron.study`): a grid of runs packed on this
machine, resumable, then the loss-gap comparison over every complete run.

    ufp4-launch study --out runs/study --grid main [--seeds 1-8] [--arms bf16,e2m1,ufp4]
                      [--axis NAME=V1,V2] [--per-device N] [--gpus auto|none|0,1]
                      [--time-limit SECONDS [--pause-at-limit]] [--restart-incomplete]
                      [--dry-run] [-- OVERRIDES ...]
    ufp4-launch study --out runs/study --arms bf16,e2m1,ufp4 --seeds 1-3 -- model=tiny ...
    ufp4-launch study --out runs/study --resume [--compare-only]

An invocation with a grid (or --arms/--seeds) trains that grid's runs, adding the new ones to
the study; runs an earlier invocation planned and left are trained by --resume (or by asking
for them again). Compare covers every complete run of the study.

Exit status: 0 every run asked for done, 3 some left for a later invocation (time limit or
a stop), 1 some run failed (its log: <out>/logs/<run>.log).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import warnings
from pathlib import Path

from . import manifest as mf
from . import mps
from .grid import StudyGrid, check_grid, expand, load_grid, parse_seeds, select_axis_values
from .packing import available_cpus, make_slots, visible_gpus
from .resolve import check_distinct_labels, resolve
from .runner import Options, Runner

COMPARE_MODULE = "ufp4_megatron.cli.compare"
# GPU default measured on an H200 (16 cores): 9 packed trainers of a 10.9M model gave ~1.8x
# the aggregate throughput of one at a time; per run one CPU core at least.
DEFAULT_PER_GPU = 8


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "study",
        help="a grid of runs packed on this machine, then compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, type=Path, help="the study dir (study.json, runs/)")
    p.add_argument("--grid", help="a grid name (configs/study/) or YAML path")
    p.add_argument("--arms", help="comma-separated arms, replacing the grid's")
    p.add_argument("--seeds", help="seeds, e.g. 1-8 or 1,2,5, replacing the grid's")
    p.add_argument(
        "--axis",
        action="append",
        default=[],
        metavar="NAME=V1,V2",
        help="keep only these values of one of the grid's axes (repeatable), e.g. depth=L3,L12",
    )
    p.add_argument("--name", help="the study's name without --grid (default: the out dir's)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the runs of --out's study.json (no grid needed)",
    )
    p.add_argument(
        "--per-device",
        type=int,
        default=None,
        help=f"concurrent runs per GPU, or in total on CPU (default: "
        f"{DEFAULT_PER_GPU} per GPU, 1 on CPU)",
    )
    p.add_argument("--gpus", default="auto", help="auto | none | device ids 0,1,...")
    p.add_argument(
        "--mps",
        default="off",
        choices=mps.MODES,
        help="CUDA MPS for the runs sharing a GPU (study/mps.py): on, auto (where it "
        "starts), off (default: the runs on a GPU take turns)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="OpenMP threads per run (default 1; see study/packing.py for why)",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="start no run that would end after this; stop the rest at it",
    )
    p.add_argument(
        "--stop-grace",
        type=float,
        default=90.0,
        metavar="SECONDS",
        help="time a stopped trainer has to save its checkpoint",
    )
    p.add_argument(
        "--pause-at-limit",
        action="store_true",
        help="the time limit pauses the study: every run trains until it and saves "
        "a checkpoint for a later invocation (runs longer than one allocation); "
        "nothing is shed or held back",
    )
    p.add_argument(
        "--restart-incomplete",
        action="store_true",
        help="a run counts only if one process trained all its steps: an "
        "incomplete run starts over from step 0 (its partial files are moved "
        "to <out>/discarded/), never resumes an earlier invocation's checkpoint",
    )
    p.add_argument("--wandb-mode", default=None, help="logging.wandb.mode of every run")
    p.add_argument("--progress", default="auto", choices=("auto", "bar", "plain"))
    p.add_argument(
        "--last",
        type=int,
        default=None,
        help="steps in the mean gap (default: the grid's last_frac of the steps)",
    )
    p.add_argument("--no-compare", action="store_true", help="train only")
    p.add_argument(
        "--compare-only",
        action="store_true",
        help="compare the study's complete runs, train nothing (e.g. with --resume "
        "on run dirs copied back from a GPU node)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    p.add_argument(
        "overrides", nargs=argparse.REMAINDER, help="Hydra overrides of every run (after --)"
    )
    p.set_defaults(func=study)
    return p


def plan(args) -> tuple[dict | None, StudyGrid | None, list]:
    """(existing manifest, this invocation's grid or None for --resume, its runs)."""
    existing = mf.load(args.out)
    overrides = list(args.overrides or [])
    if args.resume:
        if existing is None:
            raise SystemExit(f"ufp4-launch study: --resume: no {mf.FILE} in {args.out}")
        if args.grid or args.arms or args.seeds or args.axis or overrides:
            raise SystemExit(
                "ufp4-launch study: --resume continues the study as planned; "
                "drop --grid/--arms/--seeds/--axis/overrides, or run without "
                "--resume to add runs"
            )
        return existing, None, mf.specs(existing)
    if args.grid:
        grid = load_grid(args.grid)
    else:
        if not (args.arms and args.seeds):
            raise SystemExit(
                "ufp4-launch study: give --grid, or --arms and --seeds (or "
                "--resume to continue a study)"
            )
        grid = StudyGrid(name=args.name or args.out.resolve().name, arms=[], seeds=[])
    if args.arms:
        grid.arms = [a for a in args.arms.split(",") if a]
    if args.seeds:
        if grid.arm_seeds:
            raise SystemExit(
                f"ufp4-launch study: grid {args.grid} fixes each arm's seeds "
                f"(arm_seeds: its design); drop --seeds, choose arms with --arms"
            )
        grid.seeds = parse_seeds(args.seeds)
    for spec in args.axis:
        select_axis_values(grid, spec)
    grid.overrides = [*grid.overrides, *overrides]
    check_grid(grid)
    return existing, grid, expand(grid)


def study(args) -> int:
    # Megatron's data module (imported to prepare the corpus) warns about apex/TE at import
    warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine|apex|absl).*")
    if args.overrides and args.overrides[0] == "--":
        args.overrides = args.overrides[1:]
    if args.pause_at_limit and args.restart_incomplete:
        raise SystemExit(
            "ufp4-launch study: --pause-at-limit continues runs in a later "
            "invocation, --restart-incomplete starts them over: choose one"
        )
    if args.pause_at_limit and args.time_limit is None:
        raise SystemExit(
            "ufp4-launch study: --pause-at-limit needs --time-limit SECONDS (the "
            "limit it pauses at)"
        )
    for flag, value in (("--time-limit", args.time_limit), ("--stop-grace", args.stop_grace)):
        if value is not None and not value > 0:  # also NaN
            raise SystemExit(
                f"ufp4-launch study: {flag} {value} must be a positive number of seconds"
            )
    existing, grid, runs = plan(args)
    infos = resolve(runs)
    manifest = existing if grid is None else mf.merge(existing, grid, runs, infos)
    earlier = [s for s in mf.specs(manifest) if s.name not in infos]  # runs of earlier grids
    if earlier:
        infos |= resolve(earlier)
        check_distinct_labels(infos)
    gpus = visible_gpus(args.gpus)
    per_device = args.per_device or (DEFAULT_PER_GPU if gpus else 1)
    cpus = available_cpus()
    slots = make_slots(per_device, gpus, cpus)
    mps.check_request(args.mps, gpus)  # before anything is written
    if len(slots) > len(cpus):
        print(
            f"warning: {len(slots)} concurrent runs on {len(cpus)} CPUs share cores; "
            f"expect each to run slower",
            file=sys.stderr,
        )
    if args.dry_run:
        print_plan(manifest, slots)
        return 0
    if args.compare_only:
        for r in manifest["runs"]:
            r["status"] = "done" if mf.is_complete(args.out, r) else r["status"]
        print(summary(manifest))
        compare_study(args.out, manifest, last=args.last, wandb_mode=args.wandb_mode)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    mf.save(args.out, manifest)
    options = Options(
        time_limit=args.time_limit,
        pause_at_limit=args.pause_at_limit,
        restart_incomplete=args.restart_incomplete,
        stop_grace=args.stop_grace,
        threads=args.threads,
        hide_gpus=args.gpus == "none",
        mps=args.mps,
        wandb_mode=args.wandb_mode,
        progress=args.progress,
    )
    names = None if grid is None else {s.name for s in runs}  # this invocation's runs
    runner = Runner(args.out, manifest, infos, slots, options, names=names)
    manifest = runner.run()
    print(summary(manifest))
    left = [
        r["name"]
        for r in manifest["runs"]
        if names is not None and r["name"] not in names and r["status"] != "done"
    ]
    if left:
        print(
            f"{len(left)} runs of earlier invocations left as they are ({', '.join(left[:6])}"
            f"{', ...' if len(left) > 6 else ''}): --resume trains every run of the study"
        )
    if runner.stop_reason not in (None, "time limit"):
        return 3
    if not args.no_compare:
        compare_study(args.out, manifest, last=args.last, wandb_mode=args.wandb_mode)
    statuses = {r["status"] for r in manifest["runs"] if names is None or r["name"] in names}
    return 1 if "failed" in statuses else 0 if statuses == {"done"} else 3


def print_plan(manifest: dict, slots) -> None:
    print(f"study {manifest['name']}: {len(manifest['runs'])} runs on {len(slots)} slots")
    for s in slots:
        print(f"  slot {s.index}: gpu {s.gpu}, cpus {list(s.cpus)}")
    for r in manifest["runs"]:
        print(f"  {r['name']} [{r['status']}] steps {r['steps']}: {' '.join(r['overrides'])}")


def summary(manifest: dict) -> str:
    counts: dict[str, int] = {}
    for r in manifest["runs"]:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return (
        f"study {manifest['name']}: "
        + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
        + f" of {len(manifest['runs'])} runs"
    )


def paired_runs(manifest: dict) -> list[dict]:
    """Done runs that have a done reference run of the same model and seed, and those refs."""
    done = [r for r in manifest["runs"] if r["status"] == "done"]
    refs = {(r["model"], r["seed"]): r for r in done if r["arm"] == manifest["reference"]}
    others = [
        r for r in done if r["arm"] != manifest["reference"] and (r["model"], r["seed"]) in refs
    ]
    used = {id(refs[r["model"], r["seed"]]) for r in others}
    return [r for r in done if id(r) in used or r in others]


def compare_study(
    study: Path, manifest: dict, last: int | None = None, wandb_mode: str | None = None
) -> Path | None:
    """`python -m ufp4_megatron.cli.compare` over every paired complete run: <study>/compare/."""
    runs = paired_runs(manifest)
    if not runs:
        print(
            "nothing to compare yet: no complete run with a complete reference run of the "
            "same model and seed"
        )
        return None
    steps = min(r["steps"] for r in runs)
    last = last or max(1, math.ceil(manifest["last_frac"] * steps))
    out = Path(study) / "compare"
    cmd = [
        sys.executable,
        "-m",
        COMPARE_MODULE,
        *[str(mf.run_dir(study, r["name"])) for r in runs],
        "--out",
        str(out),
        "--last",
        str(last),
        "--group",
        manifest["name"],
    ]
    if wandb_mode:
        cmd += ["--wandb-mode", wandb_mode]
    if manifest["reference"] != "bf16":
        cmd += ["--reference", _recipe_of(manifest, manifest["reference"])]
    if manifest["baseline"] != "e2m1":
        cmd += ["--baseline", _recipe_of(manifest, manifest["baseline"])]
    print(f"compare: {len(runs)} runs, mean over the latest {last} of {steps} steps", flush=True)
    if subprocess.run(cmd).returncode != 0:
        raise SystemExit(f"ufp4-launch study: compare failed: {' '.join(cmd)}")
    return out


def _recipe_of(manifest: dict, arm: str) -> str:
    return next(r["recipe"] for r in manifest["runs"] if r["arm"] == arm)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ufp4-launch")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(["study", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)

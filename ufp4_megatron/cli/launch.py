"""ufp4-launch: the BF16 / E2M1 / UFP4 compare sweep on Slurm.

    ufp4-launch compare --out sweeps/tiny [--precisions bf16,e2m1,ufp4] [--ablations]
                        [--nodes N] [--sbatch-arg=--partition=gpu ...] [--dry-run]
                        [--nproc-per-node G] [--max-restarts R] [--] OVERRIDES ...

submits one Slurm job array (slurm.sbatch, one element per precision: identical seed,
data and overrides, only `precision` differs), then `ufp4-compare` over the run dirs as a job
that starts once every element succeeded (afterok; a requeued element still counts once it
finishes). Each element's run dir is <out>/<name>, its checkpoints <out>/<name>/checkpoints,
its log <out>/logs/; so a requeued element resumes where it stopped. The job ids and the run
list are written to <out>/sweep.json. The Slurm script and torchrun.sh are the installed
package's (ufp4_megatron/scripts/), so a wheel install needs no checkout.

    ufp4-launch task SWEEP.json

runs inside each array element, on every rank torchrun starts: it replaces itself with the
trainer, `python -m ufp4_megatron.train <that element's overrides>` (no shell in between).

Bad input (an option out of range, a sweep.json that is missing or not one this command
wrote, an override every run would fail on) ends with one line `ufp4-launch: error: ...` and
exit status 2, before anything is submitted or written.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from ..scripts import SLURM_SBATCH, TORCHRUN
from ..train.overrides import compose_problem
from ..train.precision import ABLATION_OVERRIDES as ABLATIONS  # recipe.ABLATIONS, as overrides

TRAIN_MODULE = "ufp4_megatron.train"
REPORT_MODULE = "ufp4_megatron.report.compare"
DEFAULT_PRECISIONS = ("bf16", "e2m1", "ufp4")
NPROC_WORDS = ("auto", "gpu", "cpu")  # torchrun's --nproc-per-node besides a number


class LaunchError(ValueError):
    """Bad input to ufp4-launch; main() prints it as one `error:` line and returns 2."""


def plan_runs(
    precisions: list[str], ablations: bool, overrides: list[str], out: Path
) -> list[dict]:
    """One run per precision (+ ablations): the shared overrides, then what makes it unique."""
    runs = [(p, (f"precision={p}",)) for p in precisions]
    if ablations:
        runs += [
            (name, ("precision=ufp4", f"precision.name={name}", *extra))
            for name, extra in ABLATIONS.items()
        ]
    names = [name for name, _ in runs]
    if not names:
        raise LaunchError(
            "--precisions names no precision: give a comma-separated list, e.g. "
            f"--precisions {','.join(DEFAULT_PRECISIONS)}"
        )
    if len(set(names)) != len(names):
        raise LaunchError(f"duplicate run names in {names}: give each precision once")
    plan = []
    for name, own in runs:
        run_dir = out / name
        plan.append(
            {
                "name": name,
                "run_dir": str(run_dir),
                "overrides": [
                    *overrides,
                    *own,
                    f"hydra.run.dir={run_dir}",
                    f"checkpoint.dir={run_dir / 'checkpoints'}",
                ],
            }
        )
    return plan


def sbatch_commands(out: Path, plan: list[dict], args) -> tuple[list[str], list[str]]:
    """The two sbatch command lines; the report's gets `--dependency` once the array id is known."""
    logs = out / "logs"
    array = [
        "sbatch",
        "--parsable",
        f"--array=0-{len(plan) - 1}",
        f"--nodes={args.nodes}",
        f"--job-name={args.job_name}",
        f"--output={logs}/%x-%A_%a.out",
        *args.sbatch_arg,
        str(SLURM_SBATCH),
        *(["--nproc-per-node", str(args.nproc_per_node)] if args.nproc_per_node else []),
        "--max-restarts",
        str(args.max_restarts),
        "--module",
        "ufp4_megatron.cli.launch",
        "--",
        "task",
        str(out / "sweep.json"),
    ]
    report_argv = [
        args.python,
        "-m",
        args.report_module,
        *[run["run_dir"] for run in plan],
        "--out",
        str(out / "report"),
    ]
    report = [
        "sbatch",
        "--parsable",
        "--nodes=1",
        "--ntasks=1",
        f"--job-name={args.job_name}-report",
        f"--output={logs}/%x-%j.out",
        "--kill-on-invalid-dep=yes",
        *args.sbatch_arg,
        f"--wrap=exec {shlex.join(report_argv)}",
    ]
    return array, report


def _sbatch(cmd: list[str], env: dict) -> str:
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(
            f"ufp4-launch: {shlex.join(cmd)} failed ({res.returncode}):\n{res.stderr.strip()}"
        )
    return res.stdout.strip().split(";")[0]  # --parsable prints "jobid[;cluster]"


def check_compare_args(args) -> None:
    """The options of `compare` in range (LaunchError, one line)."""
    if not 1 <= args.nodes < 2**16:
        raise LaunchError(f"--nodes {args.nodes}: give the nodes per run, a number >= 1")
    if not 0 <= args.max_restarts < 2**16:
        raise LaunchError(f"--max-restarts {args.max_restarts}: give a number >= 0 (0: none)")
    n = args.nproc_per_node
    if n is not None and n not in NPROC_WORDS and not (n.isdigit() and int(n) >= 1):
        raise LaunchError(
            f"--nproc-per-node {n!r}: give a number >= 1 or one of "
            f"{', '.join(NPROC_WORDS)} (as torchrun takes it)"
        )
    if not args.job_name.strip() or any(not c.isprintable() for c in args.job_name):
        raise LaunchError(f"--job-name {args.job_name!r}: give a printable, non-empty name")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise LaunchError(f"--out {args.out}: a file is there; give a directory for the sweep")


def compare(args) -> int:
    check_compare_args(args)
    out = Path(args.out).resolve()
    precisions = [p for p in args.precisions.split(",") if p]
    plan = plan_runs(precisions, args.ablations, args.overrides, out)
    for run in plan:  # refuse here what every array element would fail on, one by one
        if problem := compose_problem(run["overrides"]):
            raise LaunchError(f"run {run['name']}: {problem}")
    array_cmd, report_cmd = sbatch_commands(out, plan, args)
    if args.dry_run:
        print(shlex.join(array_cmd))
        print(shlex.join([*report_cmd[:2], "--dependency=afterok:<array>", *report_cmd[2:]]))
        return 0

    (out / "logs").mkdir(parents=True, exist_ok=True)
    sweep = {"runs": plan, "python": args.python}
    (out / "sweep.json").write_text(json.dumps(sweep, indent=2))
    # The jobs inherit this environment (sbatch --export=ALL): the same Python and package.
    env = {**os.environ, "PYTHON": args.python, "UFP4_TORCHRUN": str(TORCHRUN)}
    array_id = _sbatch(array_cmd, env)
    report_id = _sbatch([*report_cmd[:2], f"--dependency=afterok:{array_id}", *report_cmd[2:]], env)
    sweep["jobs"] = {"array": array_id, "report": report_id}
    (out / "sweep.json").write_text(json.dumps(sweep, indent=2))
    names = ", ".join(f"{i}={run['name']}" for i, run in enumerate(plan))
    print(f"array job {array_id} ({names}); report job {report_id} -> {out / 'report'}")
    print(f"logs: {out / 'logs'}   watch: squeue -j {array_id},{report_id}")
    return 0


def read_sweep(path: str) -> list[dict]:
    """The runs of a sweep.json that `compare` wrote (LaunchError, one line, otherwise)."""
    try:
        sweep = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise LaunchError(
            f"task: no such sweep file: {path} (ufp4-launch compare --out DIR "
            "writes DIR/sweep.json)"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise LaunchError(f"task: cannot read {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise LaunchError(
            f"task: {path} is not JSON ({e.msg}, line {e.lineno}); it is "
            "written by ufp4-launch compare: submit the sweep again"
        ) from None
    runs = sweep.get("runs") if isinstance(sweep, dict) else None
    ok = (
        isinstance(runs, list)
        and runs
        and all(
            isinstance(r, dict)
            and isinstance(r.get("overrides"), list)
            and all(isinstance(o, str) for o in r["overrides"])
            for r in runs
        )
    )
    if not ok:
        raise LaunchError(
            f"task: {path} is not a sweep file: it needs a non-empty 'runs' list "
            "of {name, overrides: [strings]} (as ufp4-launch compare writes it)"
        )
    return runs


def task(args) -> int:
    runs = read_sweep(args.sweep)
    index = args.index if args.index is not None else os.environ.get("SLURM_ARRAY_TASK_ID")
    if index is None:
        raise LaunchError("task: no --index and no SLURM_ARRAY_TASK_ID")
    if not str(index).strip().lstrip("-").isdigit():
        raise LaunchError(f"task: SLURM_ARRAY_TASK_ID={index!r} is not an index")
    if not 0 <= int(index) < len(runs):
        raise LaunchError(f"task: index {index} outside 0..{len(runs) - 1}")
    argv = [sys.executable, "-m", args.module, *runs[int(index)]["overrides"]]
    sys.stdout.flush()
    os.execv(argv[0], argv)  # same pid: torchrun's signals reach the trainer directly


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ufp4-launch", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    c = sub.add_parser("compare", help="submit the compare sweep as a Slurm job array + report")
    c.add_argument("--out", required=True, help="sweep directory (run dirs, logs, report)")
    c.add_argument(
        "--precisions",
        default=",".join(DEFAULT_PRECISIONS),
        help="comma-separated precision configs (default: %(default)s)",
    )
    c.add_argument(
        "--ablations",
        action="store_true",
        help=f"also run the UFP4 ablations: {', '.join(ABLATIONS)}",
    )
    c.add_argument("--nodes", type=int, default=1, help="nodes per run (default: 1)")
    c.add_argument("--job-name", default="ufp4-compare")
    c.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra sbatch option for every job, e.g. --sbatch-arg=--partition=gpu",
    )
    c.add_argument(
        "--nproc-per-node",
        default=None,
        help="processes per node (default: the node's GPUs; CPU runs give a number)",
    )
    c.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="torchrun restarts after a failure, each resuming from a checkpoint",
    )
    c.add_argument("--python", default=sys.executable, help="Python of the jobs (default: this)")
    c.add_argument("--report-module", default=REPORT_MODULE)
    c.add_argument("--dry-run", action="store_true", help="print the sbatch commands only")
    c.add_argument(
        "overrides", nargs=argparse.REMAINDER, help="Hydra overrides shared by every run (after --)"
    )
    c.set_defaults(func=compare)

    t = sub.add_parser("task", help="(inside an array job) exec the trainer for this element")
    t.add_argument("sweep")
    t.add_argument("--index", type=int, default=None)
    t.add_argument("--module", default=TRAIN_MODULE)
    t.set_defaults(func=task)

    from ..study.cli import add_parser as add_study_parser  # lazy: only `study` needs its imports

    add_study_parser(sub)

    args = parser.parse_args(argv)
    if getattr(args, "overrides", None) and args.overrides[0] == "--":
        args.overrides = args.overrides[1:]
    try:
        return args.func(args)
    except LaunchError as e:
        print(f"ufp4-launch: error: {e}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""python -m ufp4_megatron.bench [--suite kernels,layer | formats | amax | step | profile]
[--out FILE.md]

--suite kernels,layer   QDQ kernels vs the copy roofline; one linear layer vs BF16
--suite formats         each recipe's QDQ pass of each GEMM operand vs the copy (formats.py)
--suite amax            NVFP4's tensor-amax passes: one per layout vs one for both (amax.py)
--suite step            full trainer steps: every recipe x shape, side by side (step.py)
--suite profile         one profiled trainer step of --model/--recipe (profile.py)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
from pathlib import Path

import torch

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def write_between_markers(path: str, body: str, tag: str = "bench") -> None:
    """Replace the text between the `tag` markers (the notes around them stay)."""
    begin, end = f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->"
    try:
        old = open(path).read()
    except FileNotFoundError:
        old = "# Performance\n"
    if begin not in old or end not in old:
        old = old.rstrip() + f"\n\n{begin}\n{end}\n"
    head, rest = old.split(begin, 1)
    tail = rest.split(end, 1)[1]
    with open(path, "w") as f:
        f.write(f"{head}{begin}\n{body}\n{end}{tail}")


def block_tag(suite: str) -> str:
    """The markers a suite's tables go between in --out, one pair per suite (so a suite run
    alone leaves the others' tables as they are): `bench` for kernels, `bench-SUITE` else."""
    return "bench" if suite == "kernels" else f"bench-{suite}"


def writable_problem(path: str | None, what: str) -> str | None:
    """Why `path` cannot be written at the end of a run, or None: checked before it starts."""
    if path is None:
        return None
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return f"{what} {path} is a directory; give a file"
    if not os.path.isdir(parent):
        return f"{what} {path}: its directory {parent} does not exist; create it first"
    if not os.access(parent, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return f"{what} {path} is not writable; give a path you can write"
    return None


def _csv(text: str) -> tuple[str, ...]:
    return tuple(s for s in text.split(",") if s)


VARIANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")


def parse_variant(text: str) -> tuple[str, tuple[str, ...]]:
    """--variant NAME or NAME:KEY=VALUE[ KEY=VALUE ...] -> (name, overrides); the name goes
    into run dir names, so it is a short plain word."""
    name, _, rest = text.partition(":")
    if not VARIANT_NAME.fullmatch(name):
        raise ValueError(
            f"--variant {text!r}: give NAME or NAME:KEY=VALUE ..., NAME of letters, digits, "
            "'_', '.', '-' (at most 32)"
        )
    sets = tuple(rest.split())
    bad = [kv for kv in sets if "=" not in kv or kv.startswith("=")]
    if bad:
        raise ValueError(
            f"--variant {text!r}: {bad[0]!r} is not KEY=VALUE; separate overrides by spaces"
        )
    return name, sets


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m ufp4_megatron.bench")
    p.add_argument("--out", help="markdown file to write the tables to (between markers)")
    p.add_argument("--json", help="also dump the raw rows as JSON here")
    p.add_argument(
        "--suite",
        "--only",
        dest="suite",
        default="kernels,layer",
        help="comma list: kernels, layer, formats, amax, step, profile",
    )
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile rows")
    step = p.add_argument_group("step")
    step.add_argument("--models", default="small,dense_1p5b,moe_7p9b,moe_124b")
    step.add_argument("--recipes", default="bf16,ufp4,e2m1,ufp4_int4,nvfp4")
    step.add_argument("--steps", type=int, default=12, help="trainer steps per run")
    step.add_argument("--skip", type=int, default=4, help="first steps left out of the median")
    step.add_argument(
        "--checkpoint",
        choices=("end", "off"),
        default="end",
        help="end: every run saves a checkpoint after its last step",
    )
    step.add_argument("--deadline", type=float, help="seconds for the whole step suite")
    step.add_argument("--timeout", type=int, default=240, help="seconds per trainer run")
    step.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs per row, one pass over all rows after another (spread)",
    )
    step.add_argument(
        "--micro-batches",
        type=int,
        default=1,
        metavar="N",
        help="micro-batches per optimizer step (gradient accumulation: global "
        "batch N x the shape's micro batch); also for --suite profile",
    )
    step.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra trainer override for every run (repeatable)",
    )
    step.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME[:KEY=VALUE ...]",
        help="run every row again with these trainer overrides (repeatable), e.g. "
        "'eager' 'graphs:train.cuda_graph=local'; ratios are to BF16 of the same variant",
    )
    prof = p.add_argument_group("profile")
    prof.add_argument("--model", default="moe_7p9b")
    prof.add_argument("--recipe", default="ufp4")
    prof.add_argument(
        "--top", type=int, default=20, metavar="N", help="kernels listed, with their callers"
    )
    args = p.parse_args(argv)
    parts = _csv(args.suite)
    unknown = set(parts) - {"kernels", "layer", "formats", "amax", "step", "profile"}
    if unknown:
        sys.exit(
            f"unknown suite(s) {sorted(unknown)}; valid: kernels, layer, formats, amax, step, "
            "profile"
        )
    from ..quant.recipe import list_recipes
    from . import step as step_suite

    for what, names, valid in (
        ("model", _csv(args.models) + (args.model,), step_suite.SHAPES),
        ("recipe", _csv(args.recipes) + (args.recipe,), list_recipes()),
    ):
        bad = [n for n in names if n not in valid]
        if bad:
            sys.exit(f"unknown {what}(s) {bad}; valid: {', '.join(valid)}")
    if args.repeats < 1:
        sys.exit(f"--repeats {args.repeats}: give 1 or more runs per row")
    if args.steps < 1 or not 0 <= args.skip < args.steps:
        sys.exit(
            f"--steps {args.steps} --skip {args.skip}: give steps >= 1 and 0 <= skip < steps "
            "(the median is of the steps after skip)"
        )
    bad_sets = [kv for kv in args.set if "=" not in kv or kv.startswith("=")]
    if bad_sets:
        sys.exit(f"--set {bad_sets[0]!r}: give KEY=VALUE, a trainer override")
    for flag, seconds in (("--timeout", args.timeout), ("--deadline", args.deadline)):
        if seconds is not None and seconds < 30:  # step.py starts no run with less left
            sys.exit(f"{flag} {seconds}: give 30 seconds or more (a run's start-up alone)")
    if args.micro_batches < 1:
        sys.exit(f"--micro-batches {args.micro_batches}: give 1 or more micro-batches per step")
    try:
        variants = tuple(parse_variant(v) for v in args.variant) or (("", ()),)
    except ValueError as e:
        sys.exit(str(e))
    if len({name for name, _ in variants}) < len(variants):
        sys.exit(f"--variant names repeat: {[name for name, _ in variants]}; give each its own")
    for path, what in ((args.out, "--out"), (args.json, "--json")):
        if problem := writable_problem(path, what):
            sys.exit(problem)
    if "profile" in parts:
        from . import profile

        profile_overrides = [
            *step_suite.shape_overrides(step_suite.SHAPES[args.model], args.micro_batches),
            f"precision={args.recipe}",
            "logging.wandb.mode=disabled",
            "data.cache_dir=/tmp/ufp4-bench-runs/data",
            *args.set,
        ]
        if problem := profile.config_problem(profile_overrides):
            sys.exit(f"--suite profile: {problem}")
    if not torch.cuda.is_available():
        sys.exit("the benchmarks need a CUDA device")
    log = lambda row: print(
        {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()},
        flush=True,
    )
    dev = torch.cuda.get_device_name()
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    cmd = "python -m ufp4_megatron.bench " + " ".join(argv if argv is not None else sys.argv[1:])
    header = f"Device: {dev}; torch {torch.__version__}; {stamp}; command: `{cmd}`"
    raw, blocks = {}, {}  # block tag -> its lines (block_tag), each under the header

    def add(suite: str, *lines: str) -> None:
        blocks.setdefault(block_tag(suite), [header, ""]).extend(lines)

    if "kernels" in parts or "layer" in parts:
        from . import kernels, layer  # imports triton

        if "kernels" in parts:
            raw["kernels"] = kernels.kernel_rows(
                compile_shapes=() if args.no_compile else ((8192, 8192),), log=log
            )
            add(
                "kernels",
                "### Kernels (bf16 in and out, grid e1m2, 1x16 fp32 scales)",
                "",
                kernels.kernel_table(raw["kernels"]),
                "",
            )
        if "layer" in parts:
            raw["layer"] = layer.layer_rows(log=log)
            add(
                "layer",
                f"### Layer ({layer.TOKENS} tokens, forward + backward, dense_1p5b shapes)",
                "",
                layer.layer_table(raw["layer"]),
                "",
            )
    if "formats" in parts:
        from . import formats  # imports triton

        raw["formats"] = formats.format_rows(log=log)
        add(
            "formats",
            f"### Each recipe's operands ({formats.SHAPE[0]}x{formats.SHAPE[1]} bf16 in and "
            "out; e4m3 tensor amax taken beforehand)",
            "",
            formats.format_table(raw["formats"]),
            "",
        )
    if "amax" in parts:
        from . import amax  # imports triton

        raw["amax"] = amax.amax_rows(log=log)
        add(
            "amax",
            "### NVFP4 tensor amax (bf16, e4m3 scales; x and dY 1x16 blocks, w 16x16 tiles)",
            "",
            amax.amax_table(raw["amax"]),
            "",
        )
    if "step" in parts:
        out = Path(args.json).parent if args.json else Path(".")
        raw["step"] = step_suite.run_suite(
            out,
            models=_csv(args.models),
            recipes=_csv(args.recipes),
            steps=args.steps,
            skip=args.skip,
            checkpoint=args.checkpoint,
            deadline_s=args.deadline,
            timeout=args.timeout,
            extra=tuple(args.set),
            repeats=args.repeats,
            micro_batches=args.micro_batches,
            variants=variants,
            log=print,
        )
        peak = raw["step"][0]["tflops_peak"] if raw["step"] else float("nan")
        runs = (
            f"; {args.repeats} runs per row, one pass after another: the median of their "
            "medians, each run's in parentheses"
            if args.repeats > 1
            else ""
        )
        add(
            "step",
            f"### Step (trainer, one GPU; BF16 GEMM rate measured in the same run: "
            f"{peak:.0f} TFLOP/s; median of steps {args.skip + 1}-{args.steps}{runs}; "
            f"checkpoint: {args.checkpoint}; {args.micro_batches} micro-batch(es) per "
            "optimizer step)",
            "",
            step_suite.table(raw["step"]),
            "",
        )
    if "profile" in parts:
        raw["profile"] = profile.profile_step(profile_overrides, top=args.top)
        add("profile", f"### Profile: {args.model} {args.recipe}", "", raw["profile"], "")
    for tag, lines in blocks.items():
        print("\n".join(lines), flush=True)
        if args.out:  # each suite's tables between its own markers
            write_between_markers(args.out, "\n".join(lines), tag)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1, default=str)


if __name__ == "__main__":
    main()

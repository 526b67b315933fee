"""`make demo`: what 4-bit training does to a model, and what this model size can resolve.

1. The loss gap. bf16, e2m1 and ufp4 train over several seeds through the study runner
   (`ufp4-launch study`, packed on this machine's cores or GPU); every recipe of a seed sees
   the same initial weights and batches, so the gaps are paired by seed. compare prints the
   BF16-relative loss gap per recipe over the seeds, with its interval; where the interval
   contains zero the difference is not resolved at this size.
2. The mechanism, which a CPU resolves in seconds: on the trained BF16 model's own
   activations, weights and gradients (one held-out batch), the attenuation alpha and SQNR of
   E2M1 against E1M2/INT4, with and without RHT16, per layer and GEMM operand, and the product
   of alpha through the network (report/mechanism.py): a table and a plot.

On a CPU it trains the tiny model (configs/study/demo.yaml: 3 seeds, 150 steps each; a few
minutes on 2 cores, docs/demo-report.md); with CUDA it runs the study's 11M configuration
(configs/study/main.yaml: bf16, e2m1 and ufp4 over 4 seeds of 32.8M tokens, packed on the
GPU). Outputs:
runs/demo/ (study.json, runs/, compare/, mechanism/).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ..study import manifest as mf
from ..study.cli import main as study_main
from ..study.packing import available_cpus

CPU_GRID, GPU_GRID = "demo", "main"
GPU_ARMS, GPU_SEEDS = "bf16,e2m1,ufp4", "1-4"

READING = """\
How to read this
- Loss gap: (L - L_bf16) / L_bf16 over the latest steps, paired by seed (same initial weights
  and batches for every recipe of a seed), with its interval over the seeds. An interval that
  contains zero means these runs cannot tell the recipes apart: at the demo's size that is a
  finding about the size, not about the recipes. The paper's 20-23% smaller gap for UFP4 is
  measured at 1.5B-124B parameters over billions of tokens; docs/results.md has the project's
  own pre-registered study on an 11M model (28 paired seeds: UFP4's training loss below
  E2M1's; on held-out text, and which part of the recipe does it, not resolved).
- Mechanism: alpha = <Q(t), t> / ||t||^2 is the share of the signal a quantizer keeps. E2M1's
  bins are asymmetric where its spacing doubles (at 2 and 4), so values round low on average
  (shrinkage bias); a uniform grid (E1M2, INT4: the same grid up to scale) has no such bins.
  Each quantized GEMM scales its signal by alpha_A * alpha_B, and these factors multiply along
  the network. RHT16 moves values into the middle magnitudes: E2M1's asymmetric bins, a
  uniform grid's well-resolved ones. The counts above say how often this model's own
  tensors behave so; the plot shows alpha per layer and its product through the network.
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, default=Path("runs/demo"))
    ap.add_argument("--seeds", default=None, help="seeds, e.g. 1-3 (default: the grid's)")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument(
        "--resume",
        action="store_true",
        help="continue the demo in --out instead of starting it afresh",
    )
    ap.add_argument("--wandb-mode", default="offline")
    args = ap.parse_args(argv)

    from ..train.runtime import resolve_device

    try:
        cuda = resolve_device(args.device, key="--device").type == "cuda"
    except ValueError as e:  # --device cuda where no GPU is visible
        ap.error(str(e))
    if not args.resume:
        shutil.rmtree(args.out, ignore_errors=True)  # a fresh demo, not an old one's results
    study = ["--out", str(args.out), "--wandb-mode", args.wandb_mode, "--progress", "plain"]
    if cuda:
        study += ["--grid", GPU_GRID, "--arms", GPU_ARMS, "--seeds", args.seeds or GPU_SEEDS]
    else:  # one run per core, one thread each (study/packing.py says why)
        study += [
            "--grid",
            CPU_GRID,
            "--gpus",
            "none",
            "--per-device",
            str(len(available_cpus())),
            *(["--seeds", args.seeds] if args.seeds else []),
        ]
    t0 = time.perf_counter()
    print(f"== 1. loss gap: ufp4-launch study {' '.join(study)}", flush=True)
    rc = study_main(study)
    t_study = time.perf_counter() - t0
    if rc != 0:
        print(f"the study did not complete (exit {rc}); see {args.out}/logs/", file=sys.stderr)
        return rc

    manifest = mf.load(args.out)
    ref = next(r for r in manifest["runs"] if r["arm"] == manifest["reference"])
    run_dir = mf.run_dir(args.out, ref["name"])
    cmd = [
        sys.executable,
        "-m",
        "ufp4_megatron.report.mechanism",
        str(run_dir),
        "--out",
        str(args.out / "mechanism"),
    ]
    print(f"\n== 2. mechanism: {' '.join(cmd[1:])}", flush=True)
    t1 = time.perf_counter()
    subprocess.run(cmd, check=True)
    t_mech = time.perf_counter() - t1
    print(f"\n{READING}")
    print(
        f"demo: study {t_study:.0f} s, mechanism {t_mech:.0f} s; loss-gap plot "
        f"{args.out / 'compare'}/, mechanism plot {args.out / 'mechanism' / 'mechanism.png'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`make demo`: bf16, e2m1 and ufp4 on the tiny model and the embedded corpus, then the gap.

Each recipe is a separate `python -m ufp4_megatron.train` run with the same seed, so all three
see the same initial weights and the same batches in the same order; then
`python -m ufp4_megatron.compare` prints the BF16-relative loss-gap table and writes the plot.
Sized to finish in a few minutes on 2 CPU cores (the 4-bit recipes emulate quantization in
PyTorch, about 10x the cost of a BF16 step on CPU). Outputs: runs/demo/.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

RECIPES = ("bf16", "e2m1", "ufp4")


def train_overrides(steps: int) -> list[str]:
    return [
        "model=tiny", "experiment=demo", f"train.steps={steps}", "train.seed=1234",
        "train.seq_len=64", "train.micro_batch=4", "train.global_batch=4",
        # a short run: a high peak LR reaches the regime where recipes differ quickly
        "optim.lr=3e-3", "optim.min_lr=3e-4", "optim.warmup_steps=10",
        "logging.progress=plain", "logging.log_interval=1", "logging.print_interval=20",
        "checkpoint.interval=0", "train.eval_interval=50", "train.eval_iters=4",
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--out", type=Path, default=Path("runs/demo"))
    ap.add_argument("--last", type=int, default=100, help="latest steps in the mean gap")
    ap.add_argument("--wandb-mode", default="offline")
    args = ap.parse_args(argv)

    run_dirs = []
    for recipe in RECIPES:
        run_dir = args.out / recipe
        shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run, not a resume of an old demo
        cmd = [sys.executable, "-m", "ufp4_megatron.train", f"precision={recipe}",
               f"hydra.run.dir={run_dir}", f"logging.wandb.mode={args.wandb_mode}",
               *train_overrides(args.steps)]
        print(f"== {recipe}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True)
        print(f"== {recipe}: {time.perf_counter() - t0:.0f} s", flush=True)
        run_dirs.append(str(run_dir))

    from .report.compare import main as compare_main

    compare_main([*run_dirs, "--last", str(args.last), "--smooth", "10",
                  "--out", str(args.out / "compare"), "--wandb-mode", args.wandb_mode,
                  "--group", "demo"])


if __name__ == "__main__":
    main()

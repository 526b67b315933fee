"""`python -m ufp4_megatron.cli.convert_checkpoint --to megatron-lm|ufp4 SRC DST`

Converts a checkpoint between the trainer's layout (step_NNNNNNNN/ + latest) and Megatron-LM's
(iter_NNNNNNN/ + latest_checkpointed_iteration.txt), so that `pretrain_gpt.py --load DST`
continues a ufp4-train run, or `ufp4-train checkpoint.dir=DST` a Megatron-LM run. Weights,
the SR-seed stream, the optimizer state, the LR schedule position, the iteration and consumed
samples, and (when saved on GPU) the RNG states carry over; see docs/megatron-lm.md for what
the other side's command line must match. SRC is a checkpoint dir (its newest intact step, or
the step its tracker names) or one step/iter dir; DST must not exist. Runs on CPU, one process.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import warnings
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m ufp4_megatron.cli.convert_checkpoint",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: python -m ufp4_megatron.cli.convert_checkpoint --to megatron-lm "
        "runs/tiny/checkpoints /data/mlm-ckpt",
    )
    ap.add_argument(
        "--to", required=True, choices=("megatron-lm", "ufp4"), help="the layout to write"
    )
    ap.add_argument(
        "--model-only",
        action="store_true",
        help="--to megatron-lm: leave the optimizer state and LR schedule out "
        "(pretrain_gpt.py then needs --no-load-optim)",
    )
    ap.add_argument("src", type=Path, metavar="SRC")
    ap.add_argument("dst", type=Path, metavar="DST")
    args = ap.parse_args(argv)
    if args.model_only and args.to != "megatron-lm":
        ap.error(
            "--model-only goes with --to megatron-lm (the trainer resumes only complete "
            "checkpoints)"
        )
    if not args.src.exists():
        _fail(f"{args.src}: no such checkpoint dir")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    warnings.filterwarnings("ignore", module="megatron")
    from ..megatron import enable_cpu_compat
    from ..train import checkpoint_megatron_lm as conv
    from ..train.checkpoint import CheckpointError

    enable_cpu_compat()
    conv.single_process_group()
    dst = Path(os.path.abspath(args.dst))
    try:
        if args.to == "megatron-lm":
            done = conv.to_megatron_lm(args.src, dst, model_only=args.model_only)
        else:
            done = conv.to_ufp4(args.src, dst)
    except CheckpointError as e:
        _fail(str(e))
    optim = "optimizer and LR schedule carried" if done["optimizer"] else "optimizer left out"
    if done["rng"]:
        rng = "RNG states carried"
    elif args.to == "megatron-lm":
        rng = "RNG states saved without a CUDA generator (a CPU run): Megatron-LM reseeds"
    else:
        rng = "RNG states carried without a CUDA generator"
    print(
        f"converted {done['source']} -> {done['written']} (iteration {done['step']}; "
        f"{optim}; {rng})"
    )
    if args.to == "megatron-lm":
        print(
            "continue it with pretrain_gpt.py ... --load "
            + shlex.quote(str(dst))
            + " (the model flags of docs/megatron-lm.md's conversion section"
            + (", plus --no-load-optim)" if args.model_only else ")")
        )
    else:
        print(
            "continue it with ufp4-train <the run's config> checkpoint.dir=" + shlex.quote(str(dst))
        )


def _fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()

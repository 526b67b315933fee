"""`ufp4-describe model=... [parallel.tp=...] [train.micro_batch=...]` (python -m ufp4_megatron.cli.describe)

Prints `total_params: <int>`, `active_params: <int>` (per token: top-k routed experts plus
shared ones) and a per-GPU memory estimate for the parallel layout, from the config alone:
nothing is allocated. Counts follow Megatron-Core's GPT with the local spec (RMSNorm, SwiGLU,
GQA, no biases); tests check them against a built model. A layout the trainer would refuse
(tp not dividing the heads, ep not dividing the experts, ...) is refused here by the same
check (train/validate.py), with exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..train.footprint import describe, load_config, with_smallest_dp
from ..train.overrides import describe_error


def main(argv: list[str] | None = None) -> None:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ..train.validate import ConfigError, check_config

    ap = argparse.ArgumentParser(
        prog="ufp4-describe",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: ufp4-describe model=moe_124b parallel.tp=4 parallel.ep=8 "
        "parallel.pp=4 parallel.dp=8",
    )
    ap.add_argument(
        "--config-dir",
        metavar="DIR",
        help="a directory of your own config groups, as for ufp4-train",
    )
    ap.add_argument(
        "overrides",
        nargs="*",
        metavar="OVERRIDE",
        help="Hydra overrides of the training config (as for ufp4-train); "
        "parallel.dp=null describes the smallest world, dp = ep",
    )
    args = ap.parse_args(argv)
    if args.config_dir is not None and not Path(args.config_dir).is_dir():
        ap.error(f"--config-dir {args.config_dir}: no such directory")
    try:
        cfg = with_smallest_dp(load_config(args.overrides, args.config_dir))
        check_config(cfg)
    except (ConfigError, HydraException, OmegaConfBaseException) as e:
        print(f"error: {describe_error(e)}", file=sys.stderr)
        sys.exit(2)
    print(describe(cfg))


if __name__ == "__main__":
    main()

"""Hydra callback: `ufp4-compare` over a multirun's runs once they all finished.

Enabled by `hydra/callbacks/compare.yaml` (in the defaults; `~hydra/callbacks` turns it off).
It compares every run dir under the sweep dir (this sweep's and any earlier sweep's of the same
experiment there: more seeds, one table) and writes <sweep dir>/compare; the W&B compare run
joins the experiment's group, in the training runs' W&B mode and project. A sweep the report
cannot use (no BF16 run, no BF16 run of a seed) is said in one line; the sweep's own result
stands.
"""
from __future__ import annotations

from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from .compare import run
from .errors import BadInput


class CompareAfterSweep(Callback):
    def __init__(self, reference: str = "bf16", baseline: str = "e2m1", last: int | None = 1000,
                 last_fraction: float | None = None, smooth: int = 1):
        window = ["--last-fraction", str(last_fraction)] if last_fraction else ["--last", str(last)]
        self.options = ["--reference", reference, "--baseline", baseline, "--smooth", str(smooth),
                        *window]

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep = Path(config.hydra.sweep.dir)
        runs = sorted({str(p.parent) for p in sweep.glob("**/metrics.jsonl")})
        if not runs:
            print(f"compare after the sweep: no run dirs under {sweep}")
            return
        wandb = config.logging.wandb
        argv = [*runs, "--out", str(sweep / "compare"), "--group", config.experiment,
                "--wandb-mode", wandb.mode, "--project", wandb.project, *self.options]
        if wandb.entity:
            argv += ["--entity", wandb.entity]
        print(f"compare after the sweep: {len(runs)} runs under {sweep}", flush=True)
        try:
            run(argv)
        except BadInput as e:
            print(f"compare after the sweep: not compared: {e}", flush=True)

"""Hydra callback: `ufp4-compare` over a multirun's runs once they all finished.

Enabled by `hydra/callbacks/compare.yaml` (in the defaults; `~hydra/callbacks` turns it off).
It compares the runs of this sweep only: each job that completes appends its run dir to
<sweep dir>/.sweep-<random>.runs (a file of this sweep's own, made at its start: a second
sweep of the same experiment at the same time keeps its own list, and a job launched in
another process, by submitit on Slurm, writes to it through the shared filesystem), so earlier
sweeps' runs under the same sweep dir (a 4-step smoke test) are not pulled in and cannot cut
this sweep's table to their steps. It writes <sweep dir>/compare; the W&B compare run is the
experiment's one (report/wandb_log.py), in the training runs' W&B mode and project. A sweep
the report cannot use (no BF16 run, no BF16 run of a seed) is said in one line; the sweep's
own result stands.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from .compare import run
from .errors import BadInput


class CompareAfterSweep(Callback):
    def __init__(
        self,
        reference: str = "bf16",
        baseline: str = "e2m1",
        last: int | None = 1000,
        last_fraction: float | None = None,
        smooth: int = 1,
    ):
        window = ["--last-fraction", str(last_fraction)] if last_fraction else ["--last", str(last)]
        self.record: str | None = None  # this sweep's list of run dirs (on_multirun_start)
        self.options = [
            "--reference",
            reference,
            "--baseline",
            baseline,
            "--smooth",
            str(smooth),
            *window,
        ]

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        sweep = Path(config.hydra.sweep.dir)
        sweep.mkdir(parents=True, exist_ok=True)
        # absolute: a job may run in another working directory (a Slurm job's)
        fd, self.record = tempfile.mkstemp(prefix=".sweep-", suffix=".runs", dir=sweep.resolve())
        os.close(fd)

    def on_job_end(self, config: DictConfig, job_return, **kwargs) -> None:
        """In the job's process (this one, or a submitit worker given a copy of self)."""
        record = getattr(self, "record", None)
        if record is None or job_return.status != JobStatus.COMPLETED:
            return  # a single run (no sweep), or a job that failed: not compared
        run_dir = Path(job_return.hydra_cfg.hydra.runtime.output_dir).resolve()
        with open(record, "a") as f:  # one short line per append: whole lines, any writer
            f.write(f"{run_dir}\n")

    def sweep_runs(self) -> list[str]:
        """This sweep's completed run dirs that logged steps, sorted, each once."""
        record = Path(self.record)
        dirs = {line for line in record.read_text().splitlines() if line.strip()}
        return sorted(d for d in dirs if (Path(d) / "metrics.jsonl").is_file())

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep = Path(config.hydra.sweep.dir)
        if self.record is None:  # Hydra calls on_multirun_start first; a caller that did not
            print(
                "compare after the sweep: no record of this sweep's runs (on_multirun_start "
                "was not called); compare them with ufp4-compare RUN..."
            )
            return
        try:
            runs = self.sweep_runs()
        finally:
            Path(self.record).unlink(missing_ok=True)
        if not runs:
            print(f"compare after the sweep: no completed runs in this sweep under {sweep}")
            return
        wandb = config.logging.wandb
        argv = [
            *runs,
            "--out",
            str(sweep / "compare"),
            "--group",
            config.experiment,
            "--wandb-mode",
            wandb.mode,
            "--project",
            wandb.project,
            *self.options,
        ]
        if wandb.entity:
            argv += ["--entity", wandb.entity]
        print(f"compare after the sweep: {len(runs)} runs of this sweep under {sweep}", flush=True)
        try:
            run(argv)
        except BadInput as e:
            print(f"compare after the sweep: not compared: {e}", flush=True)

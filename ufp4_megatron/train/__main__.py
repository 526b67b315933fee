"""`python -m ufp4_megatron.train` / `ufp4-train`: the Hydra entry point.

    python -m ufp4_megatron.train model=tiny precision=ufp4 train.steps=200
    torchrun --nproc_per_node 2 -m ufp4_megatron.train parallel.tp=2 ...

Before anything is built or written: the config is validated (train/validate.py) and the run
dir checked (train/rundir/resume_check.py: fresh start, resume, or refusal). A refused config,
and data the trainer's data checks refuse (data/checks.py, at the start of the loop), print
`error: <what to change>` and exit 2, without a traceback; so do overrides Hydra cannot
compose (train/overrides.py: a mistyped key, a wrong type, an unknown group option), names
that would become paths outside runs/ and an empty hydra.run.dir (train/rundir/names.py), a
Hydra launcher whose plugin is not installed (train/launchers.py), and a run dir or checkpoint
dir that another trainer holds (train/rundir/run_lock.py). A run that stops after
it started (a NaN or Inf loss, a save the filesystem refuses) prints `error: ...` and exits 1.
Ctrl-C saves and stops like SIGTERM, with exit status 130 (before the first step it stops at
once, nothing to save); a second Ctrl-C stops at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from ..configs import CONFIG_MODULE
from ..data.checks import DataError
from .checkpoint import CheckpointError, RunFailed
from .launchers import launcher_problem
from .logs.quiet import hide_megatron_noise, say_hidden
from .overrides import compose_problem, precheckable
from .rundir import names, resume_check, run_lock
from .rundir.identity import register_resolver
from .schema import Config, register_configs
from .validate import ConfigError, checked_config

register_configs()
register_resolver()  # ${ufp4.run_id:} in hydra.run.dir / hydra.sweep.subdir


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", 1))


def _is_rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"


def _hydra_files(dcfg: DictConfig) -> dict[str, str]:
    """What Hydra itself writes to .hydra/ (turned off in configs/hydra/default.yaml so that
    nothing is written before the resume check)."""
    hc = HydraConfig.get()
    return {
        "config.yaml": OmegaConf.to_yaml(dcfg),
        "hydra.yaml": OmegaConf.to_yaml(OmegaConf.create({"hydra": hc})),
        "overrides.yaml": OmegaConf.to_yaml(hc.overrides.task),
    }


def start(dcfg: DictConfig, run_dir: Path) -> None:
    """Validate, lock and check the run dir, record the start, train."""
    hide_megatron_noise(say=False)  # Hydra has configured logging; Megatron is not imported yet
    cfg: Config = checked_config(dcfg, world_size=_world_size())  # the typed dataclasses
    hc = HydraConfig.get()
    if hc.mode == RunMode.RUN and (problem := names.run_dir_problem(hc.run.dir)):
        raise ConfigError(problem)
    if problem := names.config_problem(cfg):
        raise ConfigError(problem)
    with contextlib.ExitStack() as held:
        if _is_rank0():  # one lock holder per job; the other ranks wait for rank 0 at init
            held.callback(run_lock.take(run_dir, "run dir").release)
            ckpt_dir = resume_check.checkpoint_dir(cfg, run_dir)
            if ckpt_dir.resolve() != run_dir.resolve():
                held.callback(run_lock.take(ckpt_dir, "checkpoint dir").release)
        plan = resume_check.plan_start(cfg, run_dir)
        if _is_rank0():
            print(plan.message(), flush=True)
        if plan.complete:
            return
        hydra_files = _hydra_files(dcfg)
        if _is_rank0():
            resume_check.record(plan, OmegaConf.to_yaml(dcfg, resolve=True), hydra_files)
        say_hidden()  # the loop imports Megatron
        with _ctrl_c_after_imports():
            from .loop import train

        try:
            train(cfg, run_dir)
        except (ConfigError, DataError):  # refused before the first step (data, process group)
            if _is_rank0() and plan.step == 0:
                _unrecord(run_dir, hydra_files)
            raise


def _unrecord(run_dir: Path, hydra_files: dict) -> None:
    """Removes what `record` wrote for a fresh start that was then refused, so that the run
    dir is as before (a rerun with the fix is a fresh start again, not a changed config)."""
    if (run_dir / resume_check.METRICS).exists():
        return
    for path in [run_dir / resume_check.CONFIG, *(run_dir / ".hydra" / n for n in hydra_files)]:
        path.unlink(missing_ok=True)
    for d in (run_dir / ".hydra", run_dir):
        try:
            d.rmdir()  # only if nothing else is there
        except OSError:
            pass


@contextlib.contextmanager
def _ctrl_c_after_imports():
    """Megatron-Core's modules wrap optional imports in bare `except:` clauses, which swallow
    a KeyboardInterrupt: a Ctrl-C during those seconds of imports was lost and training went
    on. SIGINT is blocked meanwhile, so it stays pending and stops the start right after."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _say(message: str) -> None:
    if os.environ.get("LOCAL_RANK", "0") == "0":  # once per node, not once per rank
        print(message, file=sys.stderr, flush=True)


@hydra.main(version_base="1.3", config_path=CONFIG_MODULE, config_name="config")
def _hydra_main(dcfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        start(dcfg, run_dir)
    except (ConfigError, DataError, CheckpointError) as e:  # what the trainer refuses
        _say(f"error: {e}")
        try:
            run_dir.rmdir()  # Hydra made it; leave nothing behind (only if it is empty)
        except OSError:
            pass
        sys.exit(2)
    except RunFailed as e:  # stopped after it started; what was kept is said
        _say(f"error: {e}")
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C before the loop's handler is up: nothing to save yet
        _say("interrupted (Ctrl-C) before the first step: nothing was trained or saved")
        sys.exit(130)


def main() -> None:
    try:
        plain = precheckable(sys.argv[1:])
        # before Hydra makes the run dir (a name with `..` would make it outside runs/) or
        # says a compose error in 5-10 lines with exit 1; the launcher also for a sweep (-m)
        problem = launcher_problem(sys.argv[1:])
        if problem is None and plain is not None:
            problem = names.overrides_problem(plain[0]) or compose_problem(*plain)
        if problem:
            _say(f"error: {problem}")
            sys.exit(2)
        _hydra_main()
    except KeyboardInterrupt:  # during the checks or Hydra's own start-up
        _say("interrupted (Ctrl-C) before the first step: nothing was trained or saved")
        sys.exit(130)


if __name__ == "__main__":
    main()

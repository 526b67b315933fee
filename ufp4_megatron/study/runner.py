"""Runs a study's pending runs on slots, with a progress view, a time limit and clean stops.

    lock the study -> prepare the data once -> loop: start runs on free slots (seed-major
    order), poll the trainers, record each exit in study.json -> until nothing is left

One trainer subprocess per run (`python -m ufp4_megatron.train <overrides>`), in its own
process group: Ctrl-C or SIGTERM reaches the runner only, which asks every trainer to stop
(SIGTERM: it saves a checkpoint and exits) and records them as stopped. A later run of the
study resumes them from <run>/checkpoints and skips every run that is complete on disk.

With a time limit, a run starts only if it and the running ones are estimated to end before
the limit (from the steps/s this machine is measured to train in all, see Runner._fits); runs
that would not end are stopped early, the highest seed first, so that the others do and the
runs that complete are paired by seed; at the limit every trainer still running is stopped.
Runs not started stay pending for the next invocation, stopped ones resume there from their
checkpoints. With pause_at_limit the limit is a pause, not an end (runs longer than one
allocation, e.g. a 125M model in a Slurm job shorter than its training): every run starts and
trains until the limit, nothing is shed, and the next invocation continues them.

The lock (<study>/study.lock, flock) is inherited by every trainer: while any trainer of a
killed runner still runs, a second runner on the same study waits instead of starting the
same run twice.

With restart_incomplete a run is never continued from an earlier invocation's checkpoint: a
run found incomplete starts over from step 0 (its partial files are moved to
<study>/discarded/), so every complete run was trained by one process; each launch writes
<run>/launch.json, which says from which step the process that completed the run started.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import shutil
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import manifest as mf
from . import mps
from .packing import Slot, child_env, spawn
from .resolve import RunInfo

TRAIN_MODULE = "ufp4_megatron.train"


@dataclass
class Options:
    time_limit: float | None = None  # seconds from the runner's start
    # the limit pauses the study instead of ending it: runs longer than one allocation train
    # until it and stop with a checkpoint for a later invocation; nothing is shed or held back
    pause_at_limit: bool = False
    # a run counts only if one trainer process trained all its steps: a run this invocation
    # finds incomplete starts over from step 0 (its partial files are moved to
    # <study>/discarded/), never from a checkpoint of an earlier invocation
    restart_incomplete: bool = False
    stop_grace: float = 90.0  # seconds a stopped trainer has to save before SIGKILL
    threads: int = 1  # OpenMP threads per run (packing.py says why 1)
    hide_gpus: bool = False  # CUDA_VISIBLE_DEVICES="" for CPU slots on a GPU machine
    mps: str = "off"  # CUDA MPS for the runs sharing a GPU: off | auto | on (mps.py)
    wandb_mode: str | None = None  # logging.wandb.mode of the runs; None: the trainer's
    progress: str = "auto"  # auto (bar on a terminal) | bar | plain
    print_every: float = 30.0  # seconds between plain progress lines
    lock_wait: float = 180.0  # seconds to wait for another runner's trainers to exit
    extra_train_args: list[str] = field(default_factory=list)  # appended to every trainer


@dataclass
class Active:
    record: dict
    proc: object
    slot: Slot
    log: object
    launched: float
    start_step: int  # the checkpoint it resumed from (0: from scratch)
    first_seen: float | None = None  # when its first new step appeared
    first_step: int = 0
    warm_at: float | None = None  # when it had trained WARMUP_STEPS new steps
    step: int = 0
    stop_sent: bool = False
    history: list = field(default_factory=list)  # (time, step) at each new step seen


class StudyLock:
    def __init__(self, study: Path, wait: float):
        self.path = Path(study) / "study.lock"
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline, told = time.monotonic() + wait, False
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise SystemExit(
                        f"ufp4-launch study: {study} is in use by another runner or "
                        f"by trainers it started (lock {self.path}); wait for them "
                        f"to stop, or stop them"
                    ) from None
                if not told:
                    print(
                        f"study {study} is locked (a runner or its trainers still run); "
                        f"waiting up to {wait:.0f} s",
                        flush=True,
                    )
                    told = True
                time.sleep(1.0)
        os.set_inheritable(self.fd, True)

    def release(self) -> None:
        os.close(self.fd)


def prepare_data(study: Path, records: list[dict], infos: dict[str, RunInfo]) -> None:
    """Tokenizes the embedded corpus (and trains its BPE) once into <study>/data, then links
    those files into each run's own data.cache_dir: Megatron writes its dataset index files
    there without locking, so runs of the same seed started at once must not share it."""
    from ..data.datasets import _embedded, tokenizer_config  # the trainer's own preparation

    shared = Path(study) / "data"
    done: set[str] = set()
    for r in records:
        data = infos[r["name"]].embedded_data
        if data is None:
            continue
        here = dataclasses.replace(data, cache_dir=str(shared))
        key = repr(here)
        if key not in done:
            _embedded(here, tokenizer_config(here))
            done.add(key)
        own = mf.run_dir(study, r["name"]) / "data"
        own.mkdir(parents=True, exist_ok=True)
        for src in shared.iterdir():  # the corpus files and BPE files (not Megatron's index/)
            dst = own / src.name
            if src.is_file() and not dst.exists():
                try:
                    os.link(src, dst)
                except OSError:  # another file system: a copy
                    shutil.copyfile(src, dst)


class Runner:
    def __init__(
        self,
        study: Path,
        manifest: dict,
        infos: dict[str, RunInfo],
        slots: list[Slot],
        options: Options,
        names: set[str] | None = None,
    ):
        """names: the runs this invocation trains (its grid's; None: every run of the
        manifest, as --resume); the manifest's other runs keep their status."""
        self.study, self.manifest, self.infos = Path(study), manifest, infos
        self.slots, self.opt, self.names = slots, options, names
        self.active: dict[int, Active] = {}  # slot index -> its run
        self.startups: list[float] = []  # seconds from launch to the first new step
        self.stop_reason: str | None = None
        self._shed_at: float | None = None  # when the last run was shed
        self._ended_at: float | None = None  # when the last trainer exited
        self._last_rate: float | None = None  # the latest aggregate steps/s measured
        self._stop_deadline: float | None = None
        self.t0 = time.monotonic()
        self._last_print = 0.0
        self.bar = None
        self.mps: mps.MPS | None = None

    # -- bookkeeping ----------------------------------------------------------------------
    def _records(self) -> list[dict]:
        return self.manifest["runs"]

    def _save(self) -> None:
        mf.save(self.study, self.manifest)

    def _complete(self, r: dict) -> bool:
        return mf.is_complete(self.study, r)

    def todo(self) -> list[dict]:
        """This invocation's runs not complete on disk, in manifest order; marks complete
        ones done (every run of the manifest: its status is what is on disk)."""
        out = []
        for r in self._records():
            if self._complete(r):
                r["status"] = "done"
            else:
                if r["status"] == "done":  # its files were removed: train it again
                    r["status"] = "pending"
                if self.names is None or r["name"] in self.names:
                    out.append(r)
        return out

    # -- starting runs -------------------------------------------------------------------
    def _argv(self, r: dict) -> list[str]:
        d = mf.run_dir(self.study, r["name"])
        own = [
            f"hydra.run.dir={d}",
            f"data.cache_dir={d / 'data'}",
            "logging.progress=plain",
            f"experiment={self.manifest['name']}",
        ]
        if self.opt.wandb_mode:
            own.append(f"logging.wandb.mode={self.opt.wandb_mode}")
        return [
            sys.executable,
            "-m",
            TRAIN_MODULE,
            *r["overrides"],
            *own,
            *self.opt.extra_train_args,
        ]

    # -- the time limit ------------------------------------------------------------------
    # Model: the machine trains `aggregate` steps/s in total, shared by the running trainers
    # (measured now, over each trainer's recent steady steps), and keeps that rate as runs
    # end (their share goes to the others: optimistic, hence the margin). A set of runs then
    # ends after sum(steps left) / aggregate, plus one start-up for a new run.
    # Three things make a measurement lie low, and a low rate sheds runs that would have fit
    # (packed trainers compiling kernels at once all look slow, and the runner would shed
    # nearly all of them): a trainer's first steps (kernel compiles, data-loader start), the
    # seconds right after a shed (the stopped trainers still hold their CPUs and the GPU while
    # they save), and the steps from before other trainers exited (the survivors then shared
    # the GPU with more runs; measured over them, a run that the others' exit has made fast
    # enough to finish looks as if it would not, late in its run). So a trainer's rate counts
    # only after WARMUP_STEPS new steps, and after a shed or an exit the rate is measured
    # afresh, from SETTLE seconds of steps after it, before anything else is shed. While
    # nothing is measurable (all runs starting, or none running), the latest rate measured
    # stands in, so that runs are not started just before the limit only to be stopped at it.
    # What is shed: the runs of the highest seed first (then the most steps left), so that
    # what completes is whole seeds, paired across recipes. Shedding the most steps left first
    # would always stop the recipe whose kernels compile longest (it is furthest behind
    # early), leaving that recipe's seeds unpaired with the others'.
    MARGIN = 1.15

    WINDOW = 60.0  # seconds of recent progress a trainer's rate is measured over
    SETTLE = 20.0  # seconds of steady progress before a rate counts
    WARMUP_STEPS = 20  # a trainer's first new steps, not counted in its rate
    PAUSE_MIN_TRAIN = 30.0  # pause_at_limit: seconds of training a start must leave

    def _aggregate_rate(self) -> float | None:
        """Steps/s of all running trainers together over their recent steady steps; None
        until every one of them has trained SETTLE seconds past its warm-up, the last shed
        and the last trainer's exit (one still starting would make the machine look slower or
        faster than it is; steps from before an exit, slower than it is)."""
        now, total = time.monotonic(), 0.0
        running = [a for a in self.active.values() if not a.stop_sent]
        for a in running:
            if a.warm_at is None:
                return None
            start = max(a.warm_at, self._shed_at or 0.0, self._ended_at or 0.0)
            if now - start < self.SETTLE:
                return None
            since = max(start, now - self.WINDOW)
            t, step = next(
                ((t, s) for t, s in a.history if t >= since), a.history[-1]
            )  # none recent: it stalled, rate 0
            total += (a.step - step) / max(now - t, 1e-9)
        if running and total > 0:
            self._last_rate = total
            return total
        return None

    def _time_left(self) -> float:
        return self.opt.time_limit - (time.monotonic() - self.t0)

    def _needed(self, runs: list[Active], new: dict | None, rate: float) -> float:
        left = sum(a.record["steps"] - a.step for a in runs)
        startup = 0.0
        if new is not None:
            left += new["steps"] - (mf.checkpoint_step(mf.run_dir(self.study, new["name"])) or 0)
            startup = statistics.median(self.startups) if self.startups else 0.0
        return startup + left / rate

    def _fits(self, r: dict) -> bool:
        """Whether starting r now still lets it and every running run end within the limit
        (True while nothing has been measured: the first runs start regardless)."""
        if self.opt.time_limit is None:
            return True
        if self._time_left() <= 0:
            return False
        if self.opt.pause_at_limit:  # worth starting if it trains a while after its start-up
            startup = statistics.median(self.startups) if self.startups else 0.0
            return self._time_left() > startup + self.PAUSE_MIN_TRAIN
        rate = self._aggregate_rate()
        running = [a for a in self.active.values() if not a.stop_sent]
        if (
            rate is None
            and running
            and self._shed_at is not None
            and time.monotonic() - self._shed_at < self.SETTLE
        ):
            return False  # re-measuring after a shed: nothing new starts meanwhile
        if rate is None:
            rate = self._last_rate
        if rate is None:  # nothing measured yet: the first runs start regardless
            return not self.active or all(a.first_seen is None for a in self.active.values())
        return self._needed(running, r, rate) * self.MARGIN < self._time_left()

    def _shed(self) -> None:
        """Stops the runs that would not end within the limit, the highest seed first (the
        most steps left within a seed), so the others can and the complete runs are whole
        seeds: a round on a machine that is given back keeps only complete runs."""
        if (
            self.opt.time_limit is None
            or self.opt.pause_at_limit
            or self.stop_reason
            or len(self.active) < 2
        ):
            return
        rate = self._aggregate_rate()
        if rate is None:
            return
        running = sorted(
            (a for a in self.active.values() if not a.stop_sent),
            key=lambda a: (a.record.get("seed", 0), a.record["steps"] - a.step),
        )
        while (
            len(running) > 1 and self._needed(running, None, rate) * self.MARGIN > self._time_left()
        ):
            a = running.pop()  # the highest seed; within it, the most steps left
            a.proc.send_signal(signal.SIGTERM)
            a.stop_sent = True
            self._shed_at = time.monotonic()  # measure afresh before shedding again
            self._say(
                f"stop {a.record['name']} at step {a.step}: it would not end within the "
                f"time limit ({rate:.1f} steps/s in all)"
            )

    def _discard_partial(self, queue: list[dict]) -> None:
        """restart_incomplete: moves each queued run's partial files (metrics, checkpoints)
        to <study>/discarded/<run>-attempt<K>, so that it trains from step 0 in one process;
        kept, not deleted, and said."""
        for r in queue:
            d = mf.run_dir(self.study, r["name"])
            if not (d / "metrics.jsonl").exists() and mf.checkpoint_step(d) is None:
                continue
            dest = self.study / "discarded" / f"{r['name']}-attempt{r['attempts']}"
            n = 1
            while dest.exists():  # a name taken by an earlier discard
                dest, n = dest.with_name(f"{r['name']}-attempt{r['attempts']}.{n}"), n + 1
            dest.parent.mkdir(exist_ok=True)
            os.replace(d, dest)
            self._say(
                f"{r['name']}: incomplete ({mf.last_step(dest / 'metrics.jsonl')} steps);"
                f" it starts over from step 0 (the partial run: {dest})"
            )

    def _launch(self, r: dict, slot: Slot, lock_fd: int) -> None:
        d = mf.run_dir(self.study, r["name"])
        d.mkdir(parents=True, exist_ok=True)
        logs = self.study / "logs"
        logs.mkdir(exist_ok=True)
        log = open(logs / f"{r['name']}.log", "ab")
        argv = self._argv(r)
        start_step = mf.checkpoint_step(d) or 0
        shared = self.mps is not None and slot.gpu is not None  # its GPU through MPS
        mf.write_launch(d, attempt=r["attempts"] + 1, from_step=start_step, mps=shared)
        header = (
            f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} attempt {r['attempts'] + 1} "
            f"slot {slot.index} gpu {slot.gpu}{' (MPS)' if shared else ''} cpus "
            f"{list(slot.cpus)} from step "
            f"{start_step}: {' '.join(argv)}\n"
        )
        log.write(header.encode())
        log.flush()
        threads = self.opt.threads
        env = child_env(os.environ, slot, threads, self.opt.hide_gpus)
        if self.mps is not None:
            env.update(self.mps.client_env(slot))
        proc = spawn(argv, slot, env, log, keep_fds=(lock_fd,))
        r.update(
            status="running",
            attempts=r["attempts"] + 1,
            returncode=None,
            slot={"gpu": slot.gpu, "cpus": list(slot.cpus), "threads": threads, "mps": shared},
            started=time.time(),
            ended=None,
        )
        self.active[slot.index] = Active(
            record=r,
            proc=proc,
            slot=slot,
            log=log,
            launched=time.monotonic(),
            start_step=start_step,
            step=start_step,
        )
        self._save()
        resume = f", resuming at step {start_step}" if start_step else ""
        self._say(
            f"start {r['name']} on slot {slot.index} (gpu {slot.gpu}, cpus "
            f"{list(slot.cpus)}){resume}"
        )

    # -- watching runs -------------------------------------------------------------------
    def _poll(self) -> None:
        now = time.monotonic()
        for index, a in list(self.active.items()):
            step = mf.last_step(mf.run_dir(self.study, a.record["name"]) / "metrics.jsonl")
            if step > a.step:
                a.step = step
                if a.first_seen is None:
                    a.first_seen, a.first_step = now, step
                    self.startups.append(now - a.launched)
                if a.warm_at is None and step - a.first_step >= self.WARMUP_STEPS:
                    a.warm_at = now
                a.history = [(t, s) for t, s in a.history if now - t <= self.WINDOW]
                a.history.append((now, step))
            rc = a.proc.poll()
            if rc is None:
                continue
            self._finished(a, rc)
            del self.active[index]
            self._ended_at = time.monotonic()  # the survivors' rate is measured afresh

    def _finished(self, a: Active, rc: int) -> None:
        r = a.record
        a.log.close()
        r.update(returncode=rc, ended=time.time())
        if self._complete(r):
            r["status"] = "done"
        elif rc == 0 or a.stop_sent:  # the trainer stops with 0 after saving on SIGTERM
            r["status"] = "stopped"
        else:
            r["status"] = "failed"
        self._save()
        took = time.time() - r["started"]
        step = mf.last_step(mf.run_dir(self.study, r["name"]) / "metrics.jsonl")  # its last line
        self._say(f"{r['status']} {r['name']} at step {step} (exit {rc}, {took:.0f} s)")
        if r["status"] == "failed":
            tail = (self.study / "logs" / f"{r['name']}.log").read_text(errors="replace")
            self._say("  " + "\n  ".join(tail.strip().splitlines()[-15:]))

    def _stop_all(self, reason: str) -> None:
        for a in self.active.values():
            if not a.stop_sent and a.proc.poll() is None:
                a.proc.send_signal(signal.SIGTERM)
                a.stop_sent = True
        if self._stop_deadline is None:  # the first call
            self.stop_reason = self.stop_reason or reason
            self._say(f"stopping ({self.stop_reason}): each trainer saves a checkpoint and exits")
            self._stop_deadline = time.monotonic() + self.opt.stop_grace

    # -- progress ------------------------------------------------------------------------
    def _say(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.write(msg)
        else:
            print(msg, flush=True)

    def _progress(self) -> None:
        records = self._records()
        done_steps = sum(min(r["steps"], self._steps_of(r)) for r in records)
        counts = {
            s: sum(r["status"] == s for r in records)
            for s in ("done", "running", "pending", "stopped", "failed")
        }
        text = " ".join(f"{k} {v}" for k, v in counts.items() if v)
        if self.bar is not None:
            self.bar.n = done_steps
            self.bar.set_postfix_str(text, refresh=False)
            self.bar.refresh()
        elif time.monotonic() - self._last_print > self.opt.print_every:
            self._last_print = time.monotonic()
            total = sum(r["steps"] for r in records)
            print(
                f"[study {time.monotonic() - self.t0:.0f} s] steps {done_steps}/{total} "
                f"runs: {text}",
                flush=True,
            )

    def _steps_of(self, r: dict) -> int:
        for a in self.active.values():
            if a.record is r:
                return a.step
        if r["status"] == "done":
            return r["steps"]
        return mf.last_step(mf.run_dir(self.study, r["name"]) / "metrics.jsonl")

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> dict:
        lock = StudyLock(self.study, self.opt.lock_wait)
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            queue = self.todo()
            for r in self._records():
                if r["status"] == "running":  # a runner was killed holding it
                    r["status"] = "stopped"
            for r in queue:
                if r["status"] == "failed":
                    self._say(f"{r['name']} failed before (exit {r['returncode']}): trying again")
            if self.opt.restart_incomplete:
                self._discard_partial(queue)
            self._save()
            prepare_data(self.study, queue, self.infos)
            if queue:
                gpus = list(dict.fromkeys(s.gpu for s in self.slots if s.gpu is not None))
                self.mps = mps.start(self.opt.mps, gpus, self.study / "logs" / "mps", say=self._say)
            if self.opt.progress == "bar" or (self.opt.progress == "auto" and sys.stderr.isatty()):
                from tqdm import tqdm

                self.bar = tqdm(
                    total=sum(r["steps"] for r in self._records()),
                    unit="step",
                    dynamic_ncols=True,
                    desc=self.manifest["name"],
                )
            self._loop(queue, lock.fd)
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            if self.bar is not None:
                self.bar.close()
            if self.mps is not None:  # after the loop, which ends when no trainer is left
                self.mps.stop()
            self._save()
            lock.release()
        return self.manifest

    def _on_signal(self, signum, frame) -> None:
        self.stop_reason = self.stop_reason or signal.Signals(signum).name

    def _loop(self, queue: list[dict], lock_fd: int) -> None:
        waiting = list(queue)
        while waiting or self.active:
            if self.stop_reason and self._stop_deadline is None:
                self._stop_all(self.stop_reason)
            limit = self.opt.time_limit
            if limit is not None and time.monotonic() - self.t0 > limit and self.active:
                self._stop_all("time limit")
            if self.stop_reason is None:
                for slot in self.slots:
                    if slot.index in self.active or not waiting:
                        continue
                    if not self._fits(waiting[0]):
                        break
                    self._launch(waiting.pop(0), slot, lock_fd)
            if not self.active and (self.stop_reason or (waiting and not self._fits(waiting[0]))):
                break
            self._poll()
            self._shed()
            self._progress()
            if self._stop_deadline is not None and time.monotonic() > self._stop_deadline:
                for a in self.active.values():
                    a.proc.kill()
            time.sleep(0.5)
        if waiting:
            why = ""
            if self.stop_reason is None:
                why = (
                    " (too little time left to start them)"
                    if self.opt.pause_at_limit
                    else " (they would not finish within the time limit)"
                )
            self._say(f"{len(waiting)} runs not started{why}; run the study again to continue")

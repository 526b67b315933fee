"""train.deterministic on one GPU at real shapes (make test-gpu; gpu/deterministic.sh runs it).

Two shapes, UFP4 (Triton kernels, RHT16, SR on dy), checkpoints every INTERVAL steps:
    small    model=small (125M), seq 1024, 2 micro-batches of 4
    dense2   model=dense_1p5b's layers (width 2048, 16 heads of 128, GQA 4, FFN 6144) with
             model.num_layers=2, seq 4096, 4 micro-batches of 1; its vocabulary is
             DENSE_VOCAB rows (default 32768, see below)
Per shape, with train.deterministic=true, every loss and grad norm bitwise equal to an
unbroken run's (A, run alone first):
    again       a second unbroken run (B)
    kill-step   SIGKILL at a random moment inside a random step, resumed
    kill-save   SIGKILL inside a save (a random save and phase of it), resumed
    sigterm     SIGTERM after a random step (save, exit 0), resumed
    sigint      SIGINT (Ctrl-C) after a random step (save, exit 130), resumed
and without the mode, a pair of unbroken runs: the first step that differs and by how much
(reported, not asserted). The step time of the deterministic run against the other, both run
alone (median over the steps after the second): the mode's cost.

Each shape runs alone: its two timed runs one after the other, then its other runs side by
side, then the resumes side by side. Disk: a checkpoint of dense_1p5b's full 128256-row table
is 9 GB, and six runs holding two at a save would not fit a 64-GiB disk: DENSE_VOCAB=32768
keeps every layer at the paper's shape (the byte-level data uses 258 rows of either table);
DENSE_VOCAB=128256 on a node with ~120 GB free. checkpoint.keep=1.

Run as a script (`python tests/gpu/test_deterministic_gpu.py --out DIR`) it writes
DIR/deterministic.json and DIR/deterministic.log and prints a table last.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from _cli import ROOT
from _kill import TAG, kill_tagged
from _matrix import refuse_used_work

from ufp4_megatron.train import checkpoint

STEPS, INTERVAL = 12, 4
DENSE_VOCAB = int(os.environ.get("DENSE_VOCAB", "32768"))
SHAPES = {
    "small": ["model=small", "train.seq_len=1024", "train.micro_batch=4", "train.global_batch=8"],
    "dense2": [
        "model=dense_1p5b",
        "model.num_layers=2",
        f"model.vocab_size={DENSE_VOCAB}",
        "train.seq_len=4096",
        "train.micro_batch=1",
        "train.global_batch=4",
    ],
}
GPU_SHAPES = tuple(SHAPES)
# a dry run of the harness on a CPU (--shapes tiny): the mode's plumbing, not its GPU claim
SHAPES["tiny"] = [
    "model=tiny",
    "train.seq_len=32",
    "train.micro_batch=2",
    "train.global_batch=4",
    "data.corpus_max_bytes=1500000",
]
COMMON = [
    "precision=ufp4",
    f"train.steps={STEPS}",
    f"checkpoint.interval={INTERVAL}",
    "checkpoint.keep=1",
    "logging.wandb.mode=disabled",
    "logging.progress=plain",
    "logging.print_interval=1",
]
INTERRUPTED = ("kill-step", "kill-save", "sigterm", "sigint")
EXPECTED_RC = {"kill-step": -9, "kill-save": -9, "sigterm": 0, "sigint": 130}
ACTIVE: set[str] = set()  # the tags of the trainers running now (killed if the driver is)


def _env(work: Path) -> dict:
    e = dict(
        os.environ,
        OMP_NUM_THREADS="2",
        PYTHONWARNINGS="ignore",
        WANDB_MODE="disabled",
        TRITON_CACHE_DIR=os.environ.get("TRITON_CACHE_DIR", "/tmp/triton-cache"),
    )
    for k in ("CUBLAS_WORKSPACE_CONFIG", "NCCL_ALGO", "NVTE_ALLOW_NONDETERMINISTIC_ALGO"):
        e.pop(k, None)  # a run without the mode runs as a user's default run does
    return e


def _cmd(work: Path, shape: str, name: str, deterministic: bool) -> list[str]:
    return [
        sys.executable,
        "-m",
        "ufp4_megatron.train",
        *SHAPES[shape],
        *COMMON,
        f"train.deterministic={str(deterministic).lower()}",
        f"hydra.run.dir={work / shape / name}",
        f"data.cache_dir={work / 'data'}",
    ]


class Run:
    """One trainer process, its stdout read line by line; `on_step(step, proc)` per step."""

    def __init__(self, cmd, work: Path, log: list, label: str, extra_env=None, on_step=None):
        self.cmd, self.label, self.log = cmd, label, log
        self.env = _env(work) | (extra_env or {}) | {TAG: uuid.uuid4().hex}
        self.on_step = on_step

    def __call__(self) -> int:
        t0 = time.time()
        ACTIVE.add(self.env[TAG])
        proc = subprocess.Popen(
            self.cmd,
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        out: list[str] = []

        def read():  # a thread: the checkpoint writer's workers outlive a SIGKILLed trainer
            for line in proc.stdout:  # and keep the pipe open until kill_tagged below
                out.append(line)
                parts = line.split()
                if self.on_step and len(parts) > 1 and parts[0] == "step" and parts[1].isdigit():
                    self.on_step(int(parts[1]), proc)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=600)
        finally:
            kill_tagged(self.env[TAG])
            ACTIVE.discard(self.env[TAG])
        reader.join(timeout=30)
        self.log.append(
            f"===== {self.label}: rc={rc} in {time.time() - t0:.0f} s\n{''.join(out)[-15000:]}\n"
        )
        return rc


def _signal_after(step: int, sig: int, delay: float = 0.0):
    def on_step(s, proc):
        if s == step:
            if delay:
                fire = lambda: proc.poll() is None and proc.send_signal(sig)
                threading.Timer(delay, fire).start()
            else:
                proc.send_signal(sig)

    return on_step


def _metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _curve(rows: list[dict]) -> list[tuple]:
    return [(r["step"], r["loss"], r["grad_norm"]) for r in rows]


def _drop_checkpoints(run_dir: Path) -> None:
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)


def _variation(a: list[dict], b: list[dict]) -> dict:
    """How two runs of one command differ: the first step and the largest differences."""
    pairs = list(zip(a, b))
    first = next(
        (x["step"] for x, y in pairs if (x["loss"], x["grad_norm"]) != (y["loss"], y["grad_norm"])),
        None,
    )
    return {
        "first_step_differing": first,
        "max_abs_dloss": max((abs(x["loss"] - y["loss"]) for x, y in pairs), default=None),
        "max_rel_dgrad_norm": max(
            (abs(x["grad_norm"] - y["grad_norm"]) / y["grad_norm"] for x, y in pairs), default=None
        ),
    }


def _step_time(rows: list[dict]) -> float | None:
    times = [r["step_time"] for r in rows if r["step"] > 2]
    return statistics.median(times) if times else None


def run_shape(work: Path, shape: str, rng: random.Random, log: list) -> dict:
    """Every run of one shape; the rows of the table and the shape's measurements."""
    d = work / shape
    ref = d / "A"
    Run(_cmd(work, shape, "A", True), work, log, f"{shape} A (deterministic, alone)")()
    Run(_cmd(work, shape, "N1", False), work, log, f"{shape} N1 (default, alone)")()
    a_rows, n1_rows = _metrics(ref), _metrics(d / "N1")
    for name in ("A", "N1"):
        _drop_checkpoints(d / name)
    step_s = _step_time(a_rows) or 0.5
    moments = {
        "kill-step": {
            "after_step": rng.randint(INTERVAL + 1, STEPS - 2),
            "delay_s": round(rng.uniform(0.1, 0.9) * step_s, 3),
        },
        "kill-save": {
            "phase": rng.choice(["tmp_created", "shards_written"]),
            # not the first save: the resume then starts from the one before
            "save_step": rng.choice(range(2 * INTERVAL, STEPS, INTERVAL)),
        },
        "sigterm": {"after_step": rng.randint(2, STEPS - 2)},
        "sigint": {"after_step": rng.randint(2, STEPS - 2)},
    }
    m = moments
    first = {
        "B": Run(_cmd(work, shape, "B", True), work, log, f"{shape} B (deterministic)"),
        "N2": Run(_cmd(work, shape, "N2", False), work, log, f"{shape} N2 (default)"),
        "kill-step": Run(
            _cmd(work, shape, "kill-step", True),
            work,
            log,
            f"{shape} kill-step",
            on_step=_signal_after(
                m["kill-step"]["after_step"], signal.SIGKILL, m["kill-step"]["delay_s"]
            ),
        ),
        "kill-save": Run(
            _cmd(work, shape, "kill-save", True),
            work,
            log,
            f"{shape} kill-save",
            extra_env={
                checkpoint.KILL_HOOK: f"{m['kill-save']['phase']}:{m['kill-save']['save_step']}"
            },
        ),
        "sigterm": Run(
            _cmd(work, shape, "sigterm", True),
            work,
            log,
            f"{shape} sigterm",
            on_step=_signal_after(m["sigterm"]["after_step"], signal.SIGTERM),
        ),
        "sigint": Run(
            _cmd(work, shape, "sigint", True),
            work,
            log,
            f"{shape} sigint",
            on_step=_signal_after(m["sigint"]["after_step"], signal.SIGINT),
        ),
    }
    with ThreadPoolExecutor(max_workers=len(first)) as pool:
        jobs = {n: pool.submit(r) for n, r in first.items()}
        rcs = {n: j.result() for n, j in jobs.items()}
    for name in ("B", "N2"):
        _drop_checkpoints(d / name)
    stopped = {n: checkpoint.latest_step(d / n / "checkpoints") for n in INTERRUPTED}
    with ThreadPoolExecutor(max_workers=len(INTERRUPTED)) as pool:
        jobs = {
            n: pool.submit(Run(_cmd(work, shape, n, True), work, log, f"{shape} {n} resume"))
            for n in INTERRUPTED
        }
        resumed = {n: j.result() for n, j in jobs.items()}

    want = _curve(a_rows)
    rows = [
        {
            "shape": shape,
            "case": "again",
            "moment": "-",
            "first_rc": rcs["B"],
            "resumed_from": None,
            "resume_rc": None,
            "equal": _curve(_metrics(d / "B")) == want,
        }
    ]
    for n in INTERRUPTED:
        got = _curve(_metrics(d / n))
        rows.append(
            {
                "shape": shape,
                "case": n,
                "moment": moments[n],
                "first_rc": rcs[n],
                "resumed_from": stopped[n],
                "resume_rc": resumed[n],
                "equal": got == want,
                "steps_equal": sum(x == y for x, y in zip(got, want)),
            }
        )
        _drop_checkpoints(d / n)
    for r in rows:
        r["pass"] = bool(
            len(want) == STEPS
            and r["equal"]
            and (
                (r["case"] == "again" and r["first_rc"] == 0)
                or (
                    r["case"] != "again"
                    and r["first_rc"] == EXPECTED_RC[r["case"]]
                    and r["resume_rc"] == 0
                    and r["resumed_from"] is not None
                    and r["resumed_from"] < STEPS
                )
            )
        )
    det_s, plain_s = _step_time(a_rows), _step_time(n1_rows)
    return {
        "rows": rows,
        "moments": moments,
        "step_s": {
            "deterministic": det_s,
            "default": plain_s,
            "cost": det_s / plain_s - 1 if det_s and plain_s else None,
        },
        "default_runs_vary": _variation(_metrics(d / "N1"), _metrics(d / "N2")),
        "default_vs_deterministic": _variation(n1_rows, a_rows),
    }


def run_all(work: Path, seed: int, log: list, shapes=GPU_SHAPES) -> dict:
    rng = random.Random(seed)
    out = {"seed": seed, "steps": STEPS, "interval": INTERVAL, "dense_vocab": DENSE_VOCAB}
    for shape in shapes:
        out[shape] = run_shape(work, shape, rng, log)
    return out


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return run_all(tmp_path_factory.mktemp("deterministic"), seed=1, log=[])


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("shape", GPU_SHAPES)
def test_deterministic_runs_and_resumes_are_bitwise_equal(result, shape):
    failed = [r for r in result[shape]["rows"] if not r["pass"]]
    assert not failed, failed


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def table(out: dict) -> str:
    lines = [
        "| shape | case | moment | first rc | resumed from | resume rc | bitwise | pass |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for shape in SHAPES:
        if shape not in out:
            continue
        for r in out[shape]["rows"]:
            moment = (
                r["moment"]
                if isinstance(r["moment"], str)
                else " ".join(f"{k}={v}" for k, v in r["moment"].items())
            )
            lines.append(
                f"| {shape} | {r['case']} | {moment} | {r['first_rc']} | "
                f"{_fmt(r['resumed_from'], 'd')} | {_fmt(r['resume_rc'], 'd')} | "
                f"{'yes' if r['equal'] else 'NO'} | {'PASS' if r['pass'] else 'FAIL'} |"
            )
    lines += [
        "",
        "| shape | step s deterministic | step s default | cost | default pair: "
        "first step differing | max abs dloss | max rel dgrad_norm |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for shape in SHAPES:
        if shape not in out:
            continue
        t, v = out[shape]["step_s"], out[shape]["default_runs_vary"]
        lines.append(
            f"| {shape} | {_fmt(t['deterministic'], '.4f')} | "
            f"{_fmt(t['default'], '.4f')} | {_fmt(t['cost'], '+.1%')} | "
            f"{_fmt(v['first_step_differing'], 'd')} | "
            f"{_fmt(v['max_abs_dloss'], '.2e')} | "
            f"{_fmt(v['max_rel_dgrad_norm'], '.2e')} |"
        )
    return "\n".join(lines)


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="test_deterministic_gpu.py",
        description="train.deterministic at real shapes on one GPU",
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/gpu_deterministic"))
    ap.add_argument("--seed", type=int, default=None, help="the random moments (default: time)")
    ap.add_argument(
        "--shapes",
        default=",".join(GPU_SHAPES),
        help=f"of {', '.join(SHAPES)} (tiny: a CPU dry run of the harness)",
    )
    args = ap.parse_args()
    refuse_used_work(ap, args.work)
    args.out.mkdir(parents=True, exist_ok=True)
    seed = args.seed if args.seed is not None else int(time.time())
    log: list[str] = []

    def stop(signum, frame):  # `timeout` ends the driver: end its trainers, keep the log
        for tag in list(ACTIVE):
            kill_tagged(tag)
        sys.exit(124)

    signal.signal(signal.SIGTERM, stop)
    t0 = time.time()
    try:
        out = run_all(args.work, seed, log, tuple(s for s in args.shapes.split(",") if s))
    finally:
        (args.out / "deterministic.log").write_text("".join(log))
    out["seconds"] = round(time.time() - t0)
    (args.out / "deterministic.json").write_text(json.dumps(out, indent=1))
    print(f"deterministic: seed {seed}, {out['seconds']} s")
    print(table(out))
    ok = all(r["pass"] for s in SHAPES if s in out for r in out[s]["rows"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

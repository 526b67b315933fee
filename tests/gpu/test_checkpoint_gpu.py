"""GPU checkpoints (make test-gpu; gpu/checkpoint.sh runs the same on one H200).

Tiny-model UFP4 runs on CUDA (bf16 params, Triton kernels, SR on dy) with checkpointing on.
Each interrupted run is resumed by rerunning its command, and its whole loss curve (every step,
same data, SR streams restored) must equal the unbroken run's bit for bit:

    test_resume_is_bitwise[sigkill-distributed]   SIGKILL right after the step-20 checkpoint,
        distributed optimizer (dp_reshardable, Megatron-LM's default format)
    test_resume_is_bitwise[sigterm-distributed]   SIGTERM after step 5 is logged: the run
        saves where it stands and exits 0
    test_resume_is_bitwise[sigkill-fully_reshardable]   the other distributed format
    test_resume_is_bitwise[sigkill-plain]         Megatron's non-distributed optimizer

The runs go in parallel on the one GPU (tiny model, OMP_NUM_THREADS=1 each). Run as a script
(`python tests/gpu/test_checkpoint_gpu.py --out DIR`) it writes DIR/gpu_checkpoint.json and
DIR/gpu_checkpoint.log and prints a pass/fail table last.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from _cli import ROOT, env, losses, train_cmd
from _kill import TAG, kill_tagged, run_to_death
from _matrix import refuse_used_work, report

from ufp4_megatron.train import checkpoint

STEPS, INTERVAL, KILL_AT, TERM_AFTER = 30, 10, 20, 5
COMMON = [
    "precision=ufp4",
    f"train.steps={STEPS}",
    f"checkpoint.interval={INTERVAL}",
    "logging.wandb.mode=disabled",
]
OPTIM = {
    "distributed": [],
    "fully_reshardable": ["checkpoint.optim_fully_reshardable=true"],
    "plain": ["parallel.distributed_optimizer=false"],
}
# case: (how it is interrupted, optimizer, unbroken run it must equal)
CASES = {
    "sigkill-distributed": ("sigkill", "distributed", "distributed"),
    "sigterm-distributed": ("sigterm", "distributed", "distributed"),
    "sigkill-fully_reshardable": ("sigkill", "fully_reshardable", "distributed"),
    "sigkill-plain": ("sigkill", "plain", "plain"),
}


def _env(tmp: Path) -> dict:
    # deterministic cuBLAS workspaces: two processes must give the same bits
    return env(tmp) | {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def _cmd(work: Path, name: str, optim: str, device: str, extra=()) -> list[str]:
    return train_cmd(
        work / name / "run",
        work / name / "data",
        *COMMON,
        *OPTIM[optim],
        f"train.device={device}",
        *extra,
    )


def _run(cmd, tmp: Path, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    tmp.mkdir(parents=True, exist_ok=True)
    return run_to_death(cmd, ROOT, _env(tmp) | (extra_env or {}), tmp, timeout=500)


def _sigterm_run(cmd, tmp: Path) -> subprocess.CompletedProcess:
    """Runs cmd and sends SIGTERM once step TERM_AFTER is printed."""
    tmp.mkdir(parents=True, exist_ok=True)
    tag = f"sigterm-{time.time_ns()}"
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=_env(tmp) | {TAG: tag},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    out = []
    for line in proc.stdout:
        out.append(line)
        if line.startswith("step") and int(line.split()[1]) == TERM_AFTER:
            proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=500)
    reader.join(timeout=10)
    kill_tagged(tag)
    return subprocess.CompletedProcess(cmd, rc, "".join(out), "".join(err))


def run_matrix(work: Path, log=None, device: str = "cuda", extra=()) -> list[dict]:
    """All cases, in parallel: the unbroken runs and first halves, then the resumes; `extra`:
    trainer overrides for every run (e.g. another model or transformer_impl)."""
    work.mkdir(parents=True, exist_ok=True)
    log = log or (lambda name, r: None)

    def first(name):
        how, optim, _ = CASES[name]
        cmd = _cmd(work, name, optim, device, extra)
        if how == "sigkill":
            return _run(cmd, work / name, {checkpoint.KILL_HOOK: f"latest_written:{KILL_AT}"})
        return _sigterm_run(cmd, work / name)

    def unbroken(optim):
        name = f"unbroken-{optim}"
        return _run(_cmd(work, name, optim, device, extra), work / name)

    with ThreadPoolExecutor(max_workers=8) as pool:
        ref_jobs = {o: pool.submit(unbroken, o) for o in ("distributed", "plain")}
        first_jobs = {n: pool.submit(first, n) for n in CASES}
        refs = {o: j.result() for o, j in ref_jobs.items()}
        firsts = {n: j.result() for n, j in first_jobs.items()}
        for name, r in [*(("unbroken-" + o, r) for o, r in refs.items()), *firsts.items()]:
            log(name, r)
        stopped = {n: checkpoint.latest_step(work / n / "run" / "checkpoints") for n in CASES}
        resume_jobs = {
            n: pool.submit(_run, _cmd(work, n, CASES[n][1], device, extra), work / n / "resume")
            for n in CASES
        }
        resumed = {n: j.result() for n, j in resume_jobs.items()}
    for name, r in resumed.items():
        log(f"{name} (resume)", r)

    rows = []
    for name, (how, _optim, ref) in CASES.items():
        first_rc, resume_rc, ref_rc = (
            firsts[name].returncode,
            resumed[name].returncode,
            refs[ref].returncode,
        )
        expected_first = -9 if how == "sigkill" else 0
        row = {
            "case": name,
            "first_rc": first_rc,
            "stopped_at": stopped[name],
            "resume_rc": resume_rc,
            "unbroken_rc": ref_rc,
            "steps_equal": None,
            "max_abs_diff": None,
        }
        ok = first_rc == expected_first and resume_rc == 0 and ref_rc == 0
        if ok:
            a = losses(work / name / "run")
            b = losses(work / f"unbroken-{ref}" / "run")
            row["steps_equal"] = sum(x == y for x, y in zip(a, b))
            row["max_abs_diff"] = (
                max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) else None
            )
            ok = a == b and len(a) == STEPS
        in_range = stopped[name] is not None and 0 < stopped[name] < STEPS
        row["pass"] = bool(ok and in_range)
        rows.append(row)
    return rows


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return {row["case"]: row for row in run_matrix(tmp_path_factory.mktemp("gpu_ckpt"))}


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(CASES))
def test_resume_is_bitwise(matrix, case):
    row = matrix[case]
    assert row["pass"], row


def _table(rows: list[dict]) -> str:
    head = ["case", "stopped_at", "first_rc", "resume_rc", "steps_equal", "max_abs_diff", "pass"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        cells = [
            r["case"],
            r["stopped_at"],
            r["first_rc"],
            r["resume_rc"],
            f"{r['steps_equal']}/{STEPS}" if r["steps_equal"] is not None else "-",
            r["max_abs_diff"],
            "PASS" if r["pass"] else "FAIL",
        ]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="test_checkpoint_gpu.py", description="GPU checkpoint kill/resume matrix"
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/gpu_checkpoint"))
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the harness")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="trainer override for every run (repeatable), e.g. model=moe_small",
    )
    args = ap.parse_args()
    refuse_used_work(ap, args.work)
    return report(
        args.out,
        "gpu_checkpoint",
        "gpu_checkpoint",
        lambda log: run_matrix(args.work, log, args.device, tuple(args.set)),
        _table,
    )


if __name__ == "__main__":
    sys.exit(main())

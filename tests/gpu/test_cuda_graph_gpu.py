"""CUDA graphs against eager, through the trainer (make test-gpu; gpu/perf_graphs.sh runs the
same on one H200 as its `checks` part).

UFP4 (stochastic rounding on dY, drawn on the device) with `train.deterministic=true`,
checkpointing on, two micro-batches per step, 12 steps; every case's whole loss curve must
equal its eager run's bit for bit:

    test_graphs_equal_eager[local]            per-layer graphs (Megatron's CudaGraphManager,
        whose throw-away warm-up runs before each capture must not advance the SR stream),
        each quantizing its weights at every replay (train.weight_cache=none)
    test_graphs_equal_eager[full_iteration]   one graph of the step's forward and backward;
        on a PyTorch without set_override_stale_capture_stream the trainer must refuse it in
        one line before step 1 instead (train/graphs.py says why)
    test_graphs_equal_eager[local-resume]     local graphs, SIGKILL right after the step-6
        checkpoint, rerun: the resumed run warms up and captures again
    test_graphs_equal_eager[moe-local]        moe_small with drop-and-pad experts (static
        shapes), against the eager run with the same capacity
    test_graphs_equal_eager[local-kept]       local graphs reading the weights' operands kept
        in fixed storage (train.weight_cache=all), killed after step 6 and resumed
    test_graphs_equal_eager[moe-local-kept]   the same for moe_small's experts, not killed

All runs go in parallel on the one GPU (OMP_NUM_THREADS=1 each). Run as a script
(`python tests/gpu/test_cuda_graph_gpu.py --out DIR`) it writes DIR/cuda_graphs.json and
DIR/cuda_graphs.log and prints a table last: per case, the steps equal, the largest loss
difference and the median steady step time of both runs (the runs share the GPU, so the
times say little).
"""

from __future__ import annotations

import json
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from _cli import ROOT, env
from _kill import run_to_death
from _matrix import refuse_used_work, report

from ufp4_megatron.train import checkpoint

STEPS, INTERVAL, KILL_AT = 12, 6, 6
COMMON = [
    "precision=ufp4",
    "train.deterministic=true",
    "train.seq_len=512",
    "train.micro_batch=4",
    "train.global_batch=8",
    f"train.steps={STEPS}",
    f"checkpoint.interval={INTERVAL}",
    "optim.warmup_steps=2",
    "logging.wandb.mode=disabled",
    "logging.progress=plain",
    "logging.print_interval=1",
]
DENSE = ["model=small"]
MOE = ["model=moe_small", "model.moe_capacity_factor=1.0", "model.moe_pad_to_capacity=true"]
NO_CACHE = "train.weight_cache=none"
# case: (model overrides, graph mode, killed after the step-KILL_AT checkpoint, reference run)
CASES = {
    # the weights quantized inside each layer's graph at every replay (no kept operands; the
    # default, auto, keeps them where they fit: the -kept cases)
    "local": ([*DENSE, NO_CACHE], "local", False, "eager"),
    "full_iteration": (DENSE, "full_iteration", False, "eager"),
    "local-resume": ([*DENSE, NO_CACHE], "local", True, "eager"),
    "moe-local": ([*MOE, NO_CACHE], "local", False, "moe-eager"),
    # the weights' operands kept in fixed storage, re-made after each optimizer step, read by
    # the graphs (quant/weight_cache.py); killed and resumed: re-made after the load
    "local-kept": ([*DENSE, "train.weight_cache=all"], "local", True, "eager"),
    "moe-local-kept": ([*MOE, "train.weight_cache=all"], "local", False, "moe-eager"),
}
REFERENCES = {"eager": DENSE, "moe-eager": MOE}


def _cmd(work: Path, name: str, model: list[str], graph: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "ufp4_megatron.train",
        f"hydra.run.dir={work / name / 'run'}",
        f"data.cache_dir={work / 'data' / name}",
        *model,
        *COMMON,
        f"train.cuda_graph={graph}",
    ]


def _run(cmd, tmp: Path, extra_env: dict | None = None):
    tmp.mkdir(parents=True, exist_ok=True)
    return run_to_death(cmd, ROOT, env(tmp) | (extra_env or {}), tmp, timeout=600)


def _metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _full_iteration_runs() -> bool:
    import torch

    return hasattr(torch.autograd.graph, "set_override_stale_capture_stream")


def _median_step(rows: list[dict]) -> float | None:
    steady = [r["step_time"] for r in rows if r["step"] > 4 and r.get("step_time") is not None]
    return statistics.median(steady) if steady else None


def run_matrix(work: Path, log=None) -> list[dict]:
    """The eager references and every case at once, then the resumes."""
    work.mkdir(parents=True, exist_ok=True)
    log = log or (lambda name, r: None)

    def first(name):
        model, graph, kill, _ = CASES[name]
        hook = {checkpoint.KILL_HOOK: f"latest_written:{KILL_AT}"} if kill else None
        return _run(_cmd(work, name, model, graph), work / name, hook)

    with ThreadPoolExecutor(max_workers=8) as pool:
        jobs = {
            **{
                n: pool.submit(_run, _cmd(work, n, m, "none"), work / n)
                for n, m in REFERENCES.items()
            },
            **{n: pool.submit(first, n) for n in CASES},
        }
        done = {n: j.result() for n, j in jobs.items()}
        for name, r in done.items():
            log(name, r)
        stopped = {n: checkpoint.latest_step(work / n / "run" / "checkpoints") for n in CASES}
        resumes = {
            n: pool.submit(_run, _cmd(work, n, CASES[n][0], CASES[n][1]), work / n / "resume")
            for n in CASES
            if CASES[n][2]
        }
        resumed = {n: j.result() for n, j in resumes.items()}
    for name, r in resumed.items():
        log(f"{name} (resume)", r)

    rows = []
    for name, (_model, graph, kill, ref) in CASES.items():
        final = resumed.get(name, done[name])
        a, b = _metrics(work / name / "run"), _metrics(work / ref / "run")
        la, lb = [r["loss"] for r in a], [r["loss"] for r in b]
        row = {
            "case": name,
            "reference": ref,
            "rc": done[name].returncode,
            "resume_rc": final.returncode if kill else None,
            "reference_rc": done[ref].returncode,
            "stopped_at": stopped[name] if kill else None,
            "steps_equal": sum(x == y for x, y in zip(la, lb)),
            "max_abs_diff": max((abs(x - y) for x, y in zip(la, lb)), default=None),
            "step_s": _median_step(a),
            "reference_step_s": _median_step(b),
        }
        ok = final.returncode == 0 and done[ref].returncode == 0 and la == lb and len(la) == STEPS
        if graph == "full_iteration" and not _full_iteration_runs():
            row["refused"] = True
            said = [
                line
                for line in final.stderr.splitlines()
                if line.startswith("error: train.cuda_graph=full_iteration needs")
            ]
            ok = final.returncode == 2 and not a and len(said) == 1
            ok = ok and said[0].endswith("use train.cuda_graph=local")
        if kill:
            ok = ok and done[name].returncode == -9 and stopped[name] == KILL_AT
        row["pass"] = bool(ok)
        rows.append(row)
    return rows


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return {row["case"]: row for row in run_matrix(tmp_path_factory.mktemp("gpu_graphs"))}


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(CASES))
def test_graphs_equal_eager(matrix, case):
    row = matrix[case]
    assert row["pass"], row


def _table(rows: list[dict]) -> str:
    head = ["case", "steps equal", "max abs diff", "step s", "eager step s", "pass"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    fmt = lambda v: "-" if v is None else f"{v:.3f}"
    for r in rows:
        cells = [
            r["case"] + (f" (killed at {r['stopped_at']})" if r["stopped_at"] is not None else ""),
            f"{r['steps_equal']}/{STEPS}",
            r["max_abs_diff"],
            fmt(r["step_s"]),
            fmt(r["reference_step_s"]),
            ("PASS" if r["pass"] else "FAIL")
            + (" (refused in one line)" if r.get("refused") else ""),
        ]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="test_cuda_graph_gpu.py", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/gpu_graphs"))
    args = ap.parse_args()
    refuse_used_work(ap, args.work)
    return report(
        args.out,
        "cuda_graphs",
        "cuda graphs vs eager",
        lambda log: run_matrix(args.work, log),
        _table,
    )


if __name__ == "__main__":
    sys.exit(main())

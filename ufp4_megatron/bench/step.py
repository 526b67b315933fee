"""Step table: full training steps through the real trainer, every recipe side by side.

    python -m ufp4_megatron.bench --suite step [--models small,dense_1p5b] [--recipes bf16,ufp4]

Each (shape, recipe) is one `python -m ufp4_megatron.train` subprocess with a timeout, so a
failing or out-of-memory configuration costs its own row only. Per row: the median step time
of the steady steps (metrics.jsonl, steps after `skip`) with their fastest and slowest (a
host-bound step moves by 20-25% from one step to the next), its ratio to the BF16 row of the same
shape (same run), tokens/s, MFU against the BF16 GEMM rate measured in this process at the
start, peak allocated memory and its ratio to BF16, the checkpoint written at the end of the
run (outside the timed steps) and the last loss. Variants (`--variant
graphs:train.cuda_graph=local`) run every row again with their overrides; a row's ratio is to
the BF16 row of the same shape and variant. Beside each 4-bit ratio, its floor: the BF16 step
plus the bytes the step's QDQ passes must move at the copy bandwidth measured at the start
(floor.py), over the BF16 step.

Model FLOPs per token (PaLM's convention, Chowdhery et al. 2022, App. B): 6 N + 12 L d s, with
N the parameters a token multiplies with (attention and MLP linears, the routed experts it is
sent to, shared experts, router, LM head; not the embedding lookup or norms), L layers,
d = heads x head dim and s the sequence length (attention counted over the full s x s square,
as PaLM does; a causal kernel does half of that work).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from .floor import copy_bandwidth, qdq_bytes_per_step

ENV = {
    **os.environ,
    "WANDB_MODE": "disabled",
    "PYTHONUNBUFFERED": "1",
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


@dataclass(frozen=True)
class Shape:
    overrides: tuple[str, ...]  # model selection (and a reduced layer count)
    seq_len: int
    micro_batch: int


SHAPES = {
    "small": Shape(("model=small",), 2048, 8),
    "dense_1p5b": Shape(("model=dense_1p5b",), 4096, 1),
    "moe_7p9b": Shape(("model=moe_7p9b", "model.num_layers=4"), 4096, 1),
    # 1 of 40 layers (3.0B routed-expert parameters) + embeddings: 4.1B parameters, ~75 GiB
    # of weights, grads and Adam state on one H200
    "moe_124b": Shape(("model=moe_124b", "model.num_layers=1"), 4096, 1),
    # the pre-registered study's runs (configs/study/prereg.yaml): 2 micro-batches per step
    "study11m": Shape(("model=study11m", "train=study", "optim=study"), 256, 64),
}


def shape_overrides(shape: Shape, micro_batches: int = 1) -> list[str]:
    """The trainer overrides of a shape with `micro_batches` micro-batches per optimizer step
    (the step table's runs and the profile's)."""
    return [
        *shape.overrides,
        f"train.seq_len={shape.seq_len}",
        f"train.micro_batch={shape.micro_batch}",
        f"train.global_batch={shape.micro_batch * micro_batches}",
    ]


RECIPES = ("bf16", "ufp4", "e2m1", "ufp4_int4", "nvfp4")  # bf16 and ufp4 first: the targets
CKPT_BYTES_PER_PARAM = 14  # bf16 weights + fp32 master weights + two Adam moments


def run_trainer(
    name: str, overrides: list[str], *, runs: Path, log: Path, nproc: int = 1, timeout: int = 240
) -> dict:
    """One trainer run in a subprocess; its metrics rows, return code and output tail.

    The run starts in a fresh `runs/name`: a dir left by an earlier invocation would make the
    trainer resume (or find the run complete) and its old metrics would come back as this
    run's measurement. The trainer's defaults (resume, keep) then act as in a user's first run.
    """
    run_dir = runs / name
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
        if nproc > 1
        else [sys.executable]
    )
    cmd += [
        "-m",
        "ufp4_megatron.train",
        f"hydra.run.dir={run_dir}",
        "experiment=gpu",
        "logging.wandb.mode=disabled",
        "logging.print_interval=5",
        *overrides,
    ]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc = 124
        out = "".join(
            s.decode(errors="replace") if isinstance(s, bytes) else (s or "")
            for s in (e.stdout, e.stderr)
        )
    wall = time.time() - t0
    with open(log, "a") as f:
        f.write(f"\n===== {name} (rc={rc}, {wall:.0f}s): {' '.join(cmd)}\n{out[-6000:]}\n")
    rows = []
    mpath = run_dir / "metrics.jsonl"
    if mpath.exists():
        rows = [json.loads(line) for line in mpath.read_text().splitlines() if line.strip()]
    print(f"[{name}] rc={rc} steps={len(rows)} wall={wall:.0f}s", flush=True)
    with open(log.with_suffix(".jsonl"), "a") as f:  # survives a suite killed by its timeout
        f.write(
            json.dumps(
                {
                    "name": name,
                    "rc": rc,
                    "losses": [m["loss"] for m in rows],
                    "step_time": [m.get("step_time") for m in rows],
                    "mem_gib": [m.get("mem_gib") for m in rows],
                }
            )
            + "\n"
        )
    return {
        "name": name,
        "rc": rc,
        "metrics": rows,
        "wall_s": wall,
        "run_dir": run_dir,
        "tail": out[-3000:],
    }


def gemm_tflops(n: int = 8192) -> float:
    """BF16 GEMM rate of this GPU now: median of 10 timed n^3 products."""
    import torch

    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    times = []
    for _ in range(10):
        ev[0].record()
        a @ b
        ev[1].record()
        torch.cuda.synchronize()
        times.append(ev[0].elapsed_time(ev[1]))
    del a, b
    torch.cuda.empty_cache()
    return 2 * n**3 / (statistics.median(times) * 1e-3) / 1e12


def qdq_floor_s(
    shape: Shape,
    recipe: str,
    micro_batches: int,
    extra,
    bandwidth: float,
    device_bytes: int | None,
) -> float:
    """Seconds the QDQ passes of one optimizer step need at `bandwidth` bytes/s (floor.py),
    with the weight cache the trainer's choice keeps on a GPU of `device_bytes`."""
    from ..train.footprint import load_config
    from ..train.graphs import resolve_weight_cache

    cfg = load_config([*shape_overrides(shape, micro_batches), f"precision={recipe}", *extra])
    kept = resolve_weight_cache(cfg, device_bytes)
    return qdq_bytes_per_step(cfg, micro_batches, kept) / bandwidth


def model_flops(shape: Shape) -> tuple[float, int]:
    """(training FLOPs per token, total parameters) from the composed config alone."""
    from ..train.footprint import count_params, load_config
    from ..train.logs.log_line import flops_per_token  # the trainer's MFU counts the same FLOPs

    m = load_config(list(shape.overrides)).model
    return flops_per_token(m, shape.seq_len), count_params(m).total


def _status(run: dict, steps: int | None = None) -> str:
    if run["rc"] == 0:
        return "ok"
    if "out of memory" in run["tail"].lower() or "OutOfMemoryError" in run["tail"]:
        return "OOM"
    if steps is not None and len(run["metrics"]) == steps:  # e.g. the final checkpoint failed
        return f"steps ok, then failed (rc={run['rc']})"
    return "timeout" if run["rc"] == 124 else f"failed (rc={run['rc']})"


def _steady_values(rows: list[dict], key: str, skip: int) -> list[float]:
    return [r[key] for r in rows if r["step"] > skip and r.get(key) is not None]


def _checkpoint(run_dir: Path, planned: str, output: str = "") -> str:
    """The checkpoint cell: what was planned, and for an end save its size on disk, the
    seconds the trainer says it took (its `checkpoint: saved step N in S s` line) and the
    filesystem it went to (a save into tmpfs and one to disk are different figures)."""
    if planned != "end":
        return planned
    ckpt = run_dir / "checkpoints"
    if not (ckpt / "latest").exists():
        return "end: not written"
    size = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
    took = re.findall(r"^checkpoint: saved step \d+ in ([0-9.]+) s$", output, re.MULTILINE)
    fs = filesystem(ckpt)
    return (
        f"end: saved {size / 2**30:.1f} GiB"
        + (f" in {took[-1]} s" if took else "")
        + (f" to {fs}" if fs else "")
    )


def filesystem(path: Path) -> str:
    """The type of the filesystem holding `path` (tmpfs, ext4, overlay, ...): that of the
    deepest mount point above it, the last mounted where several share it (psutil reads the
    mount table); "" where the table cannot be read."""
    try:
        mounts = psutil.disk_partitions(all=True)
    except (OSError, NotImplementedError):
        return ""
    where, best, kind = str(Path(path).resolve()), "", ""
    for mount in mounts:
        point = mount.mountpoint
        inside = where == point or where.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, mount.fstype
    return kind


def run_suite(
    out: Path,
    *,
    models=tuple(SHAPES),
    recipes=RECIPES,
    steps: int = 12,
    skip: int = 4,
    checkpoint: str = "end",
    deadline_s: float | None = None,
    timeout: int = 240,
    extra: tuple[str, ...] = (),
    repeats: int = 1,
    micro_batches: int = 1,
    variants: tuple[tuple[str, tuple[str, ...]], ...] = (("", ()),),
    log=print,
) -> list[dict]:
    """Rows of the step table; a row for every (shape, recipe), run or not. With repeats > 1
    every row runs that many times, one pass over all rows after the other (so drift shows
    as spread, not as a difference between recipes), and a row aggregates its runs.
    micro_batches: micro-batches per optimizer step (gradient accumulation, global batch =
    micro_batches x the shape's micro batch), as a user's run of many sequences per step
    has; 1 steps the optimizer after every micro-batch, where it weighs most.
    variants: (name, trainer overrides) pairs; every row runs once per variant, after
    `extra`."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r}: give a whole number of runs per row, 1 or more")
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(
            f"micro_batches={micro_batches!r}: give a whole number of micro-batches "
            "per step, 1 or more"
        )
    base = Path(os.environ.get("RUNS_DIR", "/tmp/ufp4-bench-runs"))
    base.mkdir(parents=True, exist_ok=True)
    # this suite's own run dirs: a second suite on the same RUNS_DIR must not remove the
    # runs of this one (each row clears its run dir first); the data cache is shared
    with tempfile.TemporaryDirectory(
        prefix="suite-", dir=base, ignore_cleanup_errors=True
    ) as suite:
        runs, data_dir = Path(suite), base / "data"
        logfile = out / "step.log"
        t_end = time.time() + deadline_s if deadline_s else None
        import torch

        peak = gemm_tflops()
        bandwidth = copy_bandwidth()
        device_bytes = (
            torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
        )
        log(
            f"BF16 GEMM rate measured now: {peak:.0f} TFLOP/s (8192^3, median of 10); copy "
            f"bandwidth {bandwidth / 1e12:.2f} TB/s (8192^2 bf16, read + write, median of 20)"
        )
        flops = {m: model_flops(SHAPES[m]) for m in models}
        # BF16 and UFP4 of every shape first (the targets), then the other recipes: a deadline
        # cuts the least important rows (and, with repeats, the later passes)
        first = [r for r in recipes if r in ("bf16", "ufp4")]
        order = [
            (m, v, r)
            for tier in (first, [r for r in recipes if r not in first])
            for m in models
            for v, _ in variants
            for r in tier
        ]
        sets = dict(variants)
        done: dict[tuple[str, str, str], list[dict]] = {key: [] for key in order}
        for rep in range(repeats):
            for model, variant, recipe in order:
                left = t_end - time.time() if t_end else timeout
                if left < 30:
                    continue
                run = _one_run(
                    model,
                    recipe,
                    rep,
                    n_params=flops[model][1],
                    runs=runs,
                    data_dir=data_dir,
                    logfile=logfile,
                    steps=steps,
                    skip=skip,
                    checkpoint=checkpoint,
                    timeout=int(min(timeout, left)),
                    extra=(*extra, *sets[variant]),
                    micro_batches=micro_batches,
                    variant=variant,
                )
                done[model, variant, recipe].append(run)
                log(
                    json.dumps(
                        {
                            "model": model,
                            "recipe": recipe,
                            "variant": variant,
                            "repeat": rep + 1,
                            **{k: v for k, v in run.items() if k != "error"},
                        },
                        default=str,
                    )
                )
        rows = []
        for model, variant, recipe in order:
            shape = SHAPES[model]
            model_flops_per_token, n_params = flops[model]
            row = dict(
                model=model,
                recipe=recipe,
                variant=variant,
                seq_len=shape.seq_len,
                micro_batch=shape.micro_batch,
                micro_batches=micro_batches,
                global_batch=shape.micro_batch * micro_batches,
                params=n_params,
                tflops_peak=peak,
                copy_tb_s=bandwidth / 1e12,
                qdq_floor_ms=1e3
                * qdq_floor_s(
                    shape, recipe, micro_batches, (*extra, *sets[variant]), bandwidth, device_bytes
                ),
            )
            tokens = shape.seq_len * shape.micro_batch * micro_batches  # per optimizer step
            rows.append(
                row | _aggregate(done[model, variant, recipe], tokens, model_flops_per_token, peak)
            )
        _add_ratios(rows)
        names = [v for v, _ in variants]
        rows.sort(
            key=lambda r: (
                list(models).index(r["model"]),
                names.index(r["variant"]),
                list(recipes).index(r["recipe"]),
            )
        )
        return rows


def _one_run(
    model: str,
    recipe: str,
    rep: int,
    *,
    n_params: int,
    runs: Path,
    data_dir: Path,
    logfile: Path,
    steps: int,
    skip: int,
    checkpoint: str,
    timeout: int,
    extra: tuple[str, ...],
    micro_batches: int = 1,
    variant: str = "",
) -> dict:
    """One trainer run of a row: its status, steady step times, memory, checkpoint, loss."""
    shape = SHAPES[model]
    plan = checkpoint
    if checkpoint == "end":
        need = CKPT_BYTES_PER_PARAM * n_params
        free = shutil.disk_usage(runs).free
        if need > 0.8 * free:
            plan = f"off: needs ~{need / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free"
    overrides = [
        *shape_overrides(shape, micro_batches),
        f"precision={recipe}",
        f"train.steps={steps}",
        "optim.warmup_steps=2",
        f"checkpoint.save_at_end={'true' if plan == 'end' else 'false'}",
        f"data.cache_dir={data_dir}",
        *extra,
    ]
    name = f"step-{model}-{recipe}" + (f"-{variant}" if variant else "")
    name += f"-r{rep + 1}" if rep else ""
    run = run_trainer(name, overrides, runs=runs, log=logfile, timeout=timeout)
    metrics = run["metrics"]
    steady = _steady_values(metrics, "step_time", skip)
    out = dict(
        status=_status(run, steps),
        steps=len(metrics),
        step_ms=statistics.median(steady) * 1e3 if steady else float("nan"),
        step_min_ms=min(steady) * 1e3 if steady else float("nan"),
        step_max_ms=max(steady) * 1e3 if steady else float("nan"),
        peak_mem_gib=max((m.get("mem_gib", float("nan")) for m in metrics), default=float("nan")),
        checkpoint=_checkpoint(run["run_dir"], plan, run["tail"]),
        wall_s=run["wall_s"],
        final_loss=metrics[-1]["loss"] if metrics else None,
        tokens_per_step=metrics[0].get("tokens") if metrics else None,
    )  # as trained
    if run["rc"] != 0:
        out["error"] = run["tail"].strip().splitlines()[-1][:300] if run["tail"] else ""
    shutil.rmtree(runs / name, ignore_errors=True)  # checkpoints are large
    return out


def _aggregate(runs: list[dict], tokens: int, flops_per_token: float, peak: float) -> dict:
    """A row from its runs: the median of the runs' median steps (and each run's), the
    fastest and slowest steady step of any run, the largest peak memory, the last checkpoint
    and the first run's loss; a failed run's status is the row's."""
    if not runs:
        return dict(status="not run (time budget)")
    timed = [r for r in runs if not math.isnan(r["step_ms"])]
    mems = [r["peak_mem_gib"] for r in runs if not math.isnan(r["peak_mem_gib"])]
    bad = [r for r in runs if r["status"] != "ok"]
    st = statistics.median(r["step_ms"] for r in timed) / 1e3 if timed else float("nan")
    row = dict(
        status=bad[0]["status"] if bad else "ok",
        steps=max(r["steps"] for r in runs),
        runs=len(runs),
        runs_ms=[r["step_ms"] for r in runs],
        step_ms=st * 1e3,
        step_min_ms=min((r["step_min_ms"] for r in timed), default=float("nan")),
        step_max_ms=max((r["step_max_ms"] for r in timed), default=float("nan")),
        tokens_per_s=tokens / st,
        mfu=flops_per_token * tokens / st / (peak * 1e12),
        peak_mem_gib=max(mems, default=float("nan")),
        checkpoint=runs[-1]["checkpoint"],
        wall_s=sum(r["wall_s"] for r in runs),
        final_loss=runs[0]["final_loss"],
        tokens_per_step=runs[0].get("tokens_per_step"),
    )
    if bad and len(bad) < len(runs):
        row["status"] = f"{len(runs) - len(bad)} of {len(runs)} ok; {bad[0]['status']}"
    if bad and "error" in bad[0]:
        row["error"] = bad[0]["error"]
    return row


def _add_ratios(rows: list[dict]) -> None:
    base = {
        (r["model"], r.get("variant", "")): r
        for r in rows
        if r["recipe"] == "bf16" and r.get("steps", 0) > 0 and "step_ms" in r
    }
    for r in rows:
        b = base.get((r["model"], r.get("variant", "")))
        if b is not None and "step_ms" in r:
            r["x_bf16"] = r["step_ms"] / b["step_ms"]
            if r["recipe"] != "bf16" and r.get("qdq_floor_ms") is not None:
                r["floor_x_bf16"] = (b["step_ms"] + r["qdq_floor_ms"]) / b["step_ms"]
            r["mem_x_bf16"] = r["peak_mem_gib"] / b["peak_mem_gib"]
            # per pass: each run against the BF16 run of the same pass
            pairs = zip(r.get("runs_ms", []), b.get("runs_ms", []))
            r["x_bf16_runs"] = [ms / bms for ms, bms in pairs]


def table(rows: list[dict]) -> str:
    out = [
        "| shape | variant | recipe | status | step (ms) | steady steps (ms) | x BF16 | floor "
        "| tokens/s | MFU | peak mem (GiB) | x BF16 | checkpoint | loss @ last |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- "
        "| ---: |",
    ]
    for r in rows:
        variant = r.get("variant") or "-"
        if "step_ms" not in r:
            out.append(f"| {r['model']} | {variant} | {r['recipe']} | {r['status']} |" + " |" * 10)
            continue
        f = lambda k, fmt: format(r[k], fmt) if r.get(k) is not None else "-"
        spread = f"{r['step_min_ms']:.1f}-{r['step_max_ms']:.1f}" if "step_min_ms" in r else "-"
        step_cell, x_cell = f("step_ms", ".1f"), f("x_bf16", ".3f")
        if len(r.get("runs_ms", ())) > 1:  # each run's median, in pass order
            step_cell += " (" + ", ".join(f"{v:.1f}" for v in r["runs_ms"]) + ")"
        if len(r.get("x_bf16_runs", ())) > 1:
            x_cell += " (" + ", ".join(f"{v:.3f}" for v in r["x_bf16_runs"]) + ")"
        out.append(
            f"| {r['model']} | {variant} | {r['recipe']} | {r['status']} | {step_cell} | "
            f"{spread} | {x_cell} | {f('floor_x_bf16', '.3f')} | "
            f"{f('tokens_per_s', ',.0f')} | {f('mfu', '.1%')} | "
            f"{f('peak_mem_gib', '.2f')} | {f('mem_x_bf16', '.3f')} | "
            f"{r.get('checkpoint', '-')} | {f('final_loss', '.4f')} |"
        )
    return "\n".join(out)

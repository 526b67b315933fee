"""GPU validation and step benchmarks through the real trainer, one or more suites per run.

On H200s: smoke about 2 minutes, step up to 6 (STEP_DEADLINE, default 330 s), multi and
scaling a few minutes each (they need 2 GPUs or more). On a node without network, run
`source gpu/setup.sh` first.

    python3 gpu/train_matrix.py --suite smoke,step --out DIR          # one GPU
    python3 gpu/train_matrix.py --suite multi,scaling --out DIR       # two GPUs or more

smoke    tiny and moe_small, bf16/e2m1/ufp4, a few steps on one GPU (the GPU code path runs).
step     the step table of `python -m ufp4_megatron.bench --suite step` (bench/step.py): every
         recipe x shape on one GPU, ratios to BF16 side by side (docs/performance.md).
multi    tiny bf16 at TP=2+SP and tiny ufp4 at TP=2+SP and at DP=2 with the distributed
         optimizer, each against the one-GPU run of the same model, seed and data: max relative
         loss difference per step (docs/cluster.md).
scaling  tokens/s of small at 1, 2, 4, 8 GPUs (as many as there are; data parallel, weak
         scaling) for bf16 and ufp4, and the UFP4/BF16 step-time ratio at each size.
Each run is a subprocess with a timeout; results go to <out>/<suite>.json and <suite>.md
(--out defaults to $OUT, else runs/gpu/train_matrix).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from ufp4_megatron.bench import step as step_suite
from ufp4_megatron.bench.step import run_trainer

RUNS = Path(os.environ.get("RUNS_DIR", "/tmp/ufp4-runs"))


def train(
    name: str, overrides: list[str], *, nproc: int = 1, timeout: int = 240, log: Path
) -> dict:
    # run_trainer starts each run in a fresh dir; checkpointing stays as a user's run has
    # it: the save after the last step stays on.
    return run_trainer(name, overrides, runs=RUNS, log=log, nproc=nproc, timeout=timeout)


def _steady(rows, key, skip):
    vals = [r[key] for r in rows if r["step"] > skip and key in r]
    return statistics.median(vals) if vals else float("nan")


def suite_smoke(out: Path, log: Path):
    res = []
    for model, recipes in (("tiny", ("bf16", "e2m1", "ufp4")), ("moe_small", ("ufp4",))):
        for rec in recipes:
            r = train(
                f"smoke-{model}-{rec}",
                [
                    f"model={model}",
                    f"precision={rec}",
                    "train.steps=6",
                    "train.seq_len=256",
                    "train.global_batch=4",
                ],
                log=log,
            )
            loss = [m["loss"] for m in r["metrics"]]
            res.append(
                {
                    "model": model,
                    "recipe": rec,
                    "rc": r["rc"],
                    "steps": len(loss),
                    "first_loss": loss[0] if loss else None,
                    "last_loss": loss[-1] if loss else None,
                }
            )
    lines = [
        "| model | recipe | rc | steps | first loss | last loss |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r['model']} | {r['recipe']} | {r['rc']} | {r['steps']} | {r['first_loss']} | {r['last_loss']} |"
        for r in res
    ]
    return res, lines


def suite_step(out: Path, log: Path):
    """The step table of ufp4_megatron.bench (every recipe x shape, checkpoint at the end)."""
    res = step_suite.run_suite(out, deadline_s=float(os.environ.get("STEP_DEADLINE", 330)))
    for r in res:
        r["rc"] = 0 if r.get("status") == "ok" else 1
    return res, [step_suite.table(res)]


def _max_rel_diff(a, b):
    la = {m["step"]: m["loss"] for m in a}
    lb = {m["step"]: m["loss"] for m in b}
    common = sorted(set(la) & set(lb))
    if not common:
        return float("nan"), 0
    return max(abs(la[s] - lb[s]) / abs(lb[s]) for s in common), len(common)


def suite_multi(out: Path, log: Path, ngpu: int):
    # model.cpu_init: every layout starts from the same full weights (Megatron's CPU init)
    base = [
        "train.steps=8",
        "train.seq_len=256",
        "train.global_batch=8",
        "train.micro_batch=2",
        "model.cpu_init=true",
    ]
    layouts = {
        "tp2+sp": ["parallel.tp=2", "parallel.sp=true"],
        "pp2": ["parallel.pp=2"],
        "dp2+distopt": ["parallel.dp=2", "parallel.distributed_optimizer=true"],
    }
    res = []
    plan = (
        ("tiny", ("bf16",), {"tp2+sp": layouts["tp2+sp"]}),
        ("tiny", ("ufp4",), {"tp2+sp": layouts["tp2+sp"], "dp2+distopt": layouts["dp2+distopt"]}),
    )
    for model, recipes, lays in plan:
        for rec in recipes:
            ref = train(
                f"multi-{model}-{rec}-1gpu", [f"model={model}", f"precision={rec}", *base], log=log
            )
            for lay, ov in lays.items():
                r = train(
                    f"multi-{model}-{rec}-{lay}",
                    [f"model={model}", f"precision={rec}", *base, *ov],
                    nproc=2,
                    log=log,
                )
                d, n = _max_rel_diff(r["metrics"], ref["metrics"])
                res.append(
                    {
                        "model": model,
                        "recipe": rec,
                        "layout": lay,
                        "rc": r["rc"],
                        "steps": n,
                        "max_rel_loss_diff": d,
                    }
                )
    lines = [
        "| model | recipe | layout (2 GPUs) | rc | steps compared | max rel. loss diff vs 1 GPU |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r['model']} | {r['recipe']} | {r['layout']} | {r['rc']} | {r['steps']} | {r['max_rel_loss_diff']:.2e} |"
        for r in res
    ]
    return res, lines


def suite_scaling(out: Path, log: Path, ngpu: int):
    res = []
    sizes = [n for n in (1, 2, 4, 8) if n <= ngpu]
    for model, seq, mbs in (("small", 2048, 8),):
        for rec in ("bf16", "ufp4"):
            for n in sizes:
                r = train(
                    f"scale-{model}-{rec}-{n}",
                    [
                        f"model={model}",
                        f"precision={rec}",
                        "train.steps=15",
                        f"train.seq_len={seq}",
                        f"train.micro_batch={mbs}",
                        f"train.global_batch={mbs * n}",
                    ],
                    nproc=n,
                    log=log,
                    timeout=300,
                )
                st = _steady(r["metrics"], "step_time", 8)
                res.append(
                    {
                        "model": model,
                        "recipe": rec,
                        "gpus": n,
                        "rc": r["rc"],
                        "step_ms": st * 1e3,
                        "tokens_per_s": seq * mbs * n / st,
                    }
                )
    lines = [
        "| model | GPUs | bf16 tokens/s | ufp4 tokens/s | UFP4/BF16 step time | scaling eff. (bf16) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for model in ("small",):
        one = next(
            (r for r in res if r["model"] == model and r["recipe"] == "bf16" and r["gpus"] == 1),
            None,
        )
        for n in sizes:
            b = next(r for r in res if (r["model"], r["recipe"], r["gpus"]) == (model, "bf16", n))
            u = next(r for r in res if (r["model"], r["recipe"], r["gpus"]) == (model, "ufp4", n))
            eff = b["tokens_per_s"] / (n * one["tokens_per_s"]) if one else float("nan")
            lines.append(
                f"| {model} | {n} | {b['tokens_per_s']:.0f} | {u['tokens_per_s']:.0f} | "
                f"{u['step_ms'] / b['step_ms']:.3f} | {eff:.2f} |"
            )
    return res, lines


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--suite", default="smoke")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "runs/gpu/train_matrix")))
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    ngpu = torch.cuda.device_count()
    header = (
        f"{torch.cuda.get_device_name(0)} x{ngpu}, torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    print(header, flush=True)
    for suite in a.suite.split(","):
        log = a.out / f"{suite}.log"
        fn = {
            "smoke": suite_smoke,
            "step": suite_step,
            "multi": suite_multi,
            "scaling": suite_scaling,
        }[suite]
        res, lines = fn(a.out, log) if suite in ("smoke", "step") else fn(a.out, log, ngpu)
        failed = [r for r in res if r["rc"] != 0]
        (a.out / f"{suite}.json").write_text(
            json.dumps({"header": header, "results": res}, indent=1)
        )
        text = "\n".join([f"## {suite}: {header}", "", *lines, ""])
        (a.out / f"{suite}.md").write_text(text)
        print(text, flush=True)
        if suite == "smoke" and failed:
            print(f"smoke failed ({len(failed)} runs): later suites skipped", flush=True)
            break


if __name__ == "__main__":
    main()

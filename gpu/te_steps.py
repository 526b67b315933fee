"""Step time of the trainer through TransformerEngine: TE+UFP4 against TE BF16 and the local route.

Driver of gpu/te_check.sh (part "steps"); needs TransformerEngine >= 2.19 on PYTHONPATH
(gpu/te_setup.sh). One `python -m ufp4_megatron.train` per row (ufp4_megatron.bench.step's
runner), one after another on one GPU, 2-layer dense_1p5b and moe_7p9b (TE's grouped experts)
at sequence 4096, micro-batch 1, vocabulary 4096 (the layers, not a 128k-row head, set the
step time):
    te    ufp4   model.transformer_impl=transformer_engine precision=ufp4
    te    bf16   model.transformer_impl=transformer_engine precision=bf16
    local ufp4   precision=ufp4 (the plugin's linears in Megatron's local spec)
Each row: the median step time of steps after `--skip` with its fastest and slowest, its ratio
to the TE BF16 row of the same model, and the last loss. The attention kernel is the same in
all rows (model.attention_backend, sdpa by default).

    python3 gpu/te_steps.py --out DIR [--steps 10] [--skip 3] [--deadline 300]
        [--models dense_1p5b,moe_7p9b]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ufp4_megatron.bench.step import run_trainer

MODELS = {
    "dense_1p5b x2": ["model=dense_1p5b", "model.num_layers=2"],
    "moe_7p9b x2": ["model=moe_7p9b", "model.num_layers=2"],
}
ROUTES = (("te", "ufp4"), ("te", "bf16"), ("local", "ufp4"))
TE_IMPL = "model.transformer_impl=transformer_engine"  # a "te" route's override
COMMON = [
    "model.vocab_size=4096",
    "train.seq_len=4096",
    "train.micro_batch=1",
    "train.global_batch=1",
    "checkpoint.keep=1",
]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--runs", type=Path, default=Path("/tmp/te-steps-runs"))
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--skip", type=int, default=3)
    p.add_argument("--deadline", type=float, default=300.0, help="seconds for all rows")
    p.add_argument("--timeout", type=int, default=120, help="seconds for one row")
    p.add_argument(
        "--models",
        default=",".join(m.split()[0] for m in MODELS),
        help="comma-separated, of: " + ", ".join(m.split()[0] for m in MODELS),
    )
    a = p.parse_args()
    known = {m.split()[0]: m for m in MODELS}
    chosen = [m for m in a.models.split(",") if m]
    bad = [m for m in chosen if m not in known]
    if bad or not chosen:
        p.error(f"--models {a.models!r}: give one or more of {', '.join(known)}")
    a.out.mkdir(parents=True, exist_ok=True)
    a.runs.mkdir(parents=True, exist_ok=True)
    t_end = time.time() + a.deadline
    rows = []
    for model in (known[m] for m in dict.fromkeys(chosen)):
        model_overrides = MODELS[model]
        for route, recipe in ROUTES:
            name = f"{model.split()[0]}-{route}-{recipe}"
            left = t_end - time.time()
            if left < 30:
                rows.append(
                    {
                        "model": model,
                        "route": route,
                        "recipe": recipe,
                        "status": "not run (deadline)",
                    }
                )
                continue
            impl = [TE_IMPL] if route == "te" else []
            run = run_trainer(
                name,
                [*model_overrides, *COMMON, *impl, f"precision={recipe}", f"train.steps={a.steps}"],
                runs=a.runs,
                log=a.runs / "te_steps.log",
                timeout=int(min(a.timeout, left)),
            )
            times = [m["step_time"] for m in run["metrics"] if m["step"] > a.skip]
            rows.append(
                {
                    "model": model,
                    "route": route,
                    "recipe": recipe,
                    "status": "ok" if run["rc"] == 0 and times else f"rc={run['rc']}",
                    "step_s": statistics.median(times) if times else None,
                    "min_s": min(times) if times else None,
                    "max_s": max(times) if times else None,
                    "loss": run["metrics"][-1]["loss"] if run["metrics"] else None,
                    "mem_gib": max((m.get("mem_gib") or 0) for m in run["metrics"])
                    if run["metrics"]
                    else None,
                    "wall_s": round(run["wall_s"], 1),
                    "tail": None if run["rc"] == 0 else run["tail"][-800:],
                }
            )
    base = {
        r["model"]: r["step_s"]
        for r in rows
        if r["route"] == "te" and r["recipe"] == "bf16" and r.get("step_s")
    }
    lines = [
        "| model | route | recipe | step s (median; min-max) | vs TE BF16 | loss | GiB | status |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        s = r.get("step_s")
        ratio = f"{s / base[r['model']]:.2f}x" if s and r["model"] in base else "-"
        lines.append(
            f"| {r['model']} | {r['route']} | {r['recipe']} | "
            + (f"{s:.3f} ({r['min_s']:.3f}-{r['max_s']:.3f})" if s else "-")
            + f" | {ratio} | {r.get('loss') if r.get('loss') is None else round(r['loss'], 4)} | "
            f"{'-' if not r.get('mem_gib') else round(r['mem_gib'], 1)} | {r['status']} |"
        )
    text = "\n".join(lines)
    (a.out / "te_steps.json").write_text(json.dumps(rows, indent=1))
    print(text)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Checkpoint conversion with the real pretrain_gpt.py on one GPU (driver of
gpu/megatron_lm_convert.sh).

From a Megatron-LM checkout prepared as gpu/megatron_lm.py prepares it (stock, `--spec`,
UFP4_RECIPE=ufp4, the `common` ARGS of docs/megatron-lm.md):
  1. unbroken: pretrain_gpt.py, 30 iterations;
  2. stopped: the same command saving at 20 and exiting there;
  3. round trip: iter_0000020 -> trainer layout -> Megatron-LM layout (two conversions);
  4. resumed: pretrain_gpt.py --load the round-tripped dir, iterations 21..30, which must
     equal the unbroken run's (the second line after a restart as Megatron-LM logs it, see
     gpu/megatron_lm.py logged_after_restart);
  5. trainer: ufp4-train (the same model, non-distributed optimizer) continues the trainer
     layout of step 3 from step 20 to 30;
  6. back: its step 30 converted to Megatron-LM's layout and continued by pretrain_gpt.py to
     iteration 40 (--use-checkpoint-opt_param-scheduler: the trainer's schedule decays over
     its own 30 steps).
Checked: every process exits 0; 4 equals 1 on 21..30; 5 resumes at step 20 and logs 21..30;
6 loads at iteration 30 and logs 31..40, all finite.

    python3 gpu/megatron_lm_convert.py --tarball T --out DIR
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import megatron_lm as mlm

CONVERT = "python3 -m ufp4_megatron.cli.convert_checkpoint"
SPEC = "--spec ufp4_megatron.megatron.spec ufp4_gpt_spec"
RUN = 'UFP4_RECIPE=ufp4 torchrun --standalone --nproc-per-node 1 pretrain_gpt.py "${ARGS[@]}" '
# the documented ARGS model in the trainer's terms: NullTokenizer --vocab-size 4096 has 4097
# ids, padded by Megatron-LM to 4224; batch 4 x 512 tokens; the same LR schedule
TRAINER = (
    "model=tiny model.num_layers=4 model.hidden_size=256 model.ffn_hidden_size=1024 "
    "model.num_attention_heads=4 model.num_query_groups=2 model.vocab_size=4224 "
    "model.max_seq_len=512 train.seq_len=512 train.micro_batch=4 train.global_batch=4 "
    "optim.lr=3e-4 optim.min_lr=3e-5 optim.warmup_steps=5 optim.weight_decay=0.1 "
    "optim.clip_grad=1.0 precision=ufp4 parallel.distributed_optimizer=false "
    "logging.progress=plain logging.print_interval=1 train.steps=30 "
    "checkpoint.interval=10"
)


def scripts(work: Path) -> dict[str, str]:
    c = work / "conv"
    return {
        "unbroken": RUN + SPEC,
        "stopped": RUN + SPEC + f" --save {c}/mlm --save-interval 20 --exit-interval 20",
        "convert": (
            f"{CONVERT} --to ufp4 {c}/mlm {c}/run/ckpt && "
            f"{CONVERT} --to megatron-lm {c}/run/ckpt {c}/back"
        ),
        "resumed": RUN + SPEC + f" --load {c}/back --save {c}/back --save-interval 100",
        "trainer": (
            f"WANDB_MODE=disabled python3 -m ufp4_megatron.train {TRAINER} "
            f"hydra.run.dir={c}/run checkpoint.dir={c}/run/ckpt data.cache_dir={c}/cache"
        ),
        "back": (
            f"{CONVERT} --to megatron-lm {c}/run/ckpt {c}/fwd && "
            + RUN
            + SPEC
            + f" --load {c}/fwd --train-iters 40 --use-checkpoint-opt_param-scheduler"
        ),
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--tarball", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--work", type=Path, default=Path("/tmp/megatron-lm-convert"))
    p.add_argument("--site", type=Path, default=Path("/tmp/site"))
    a = p.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    a.out.mkdir(parents=True, exist_ok=True)
    notes = mlm.prepare(a.tarball, a.work, a.site)
    (a.work / "conv" / "run").mkdir(parents=True)
    common, _ = mlm.documented_runs()
    results = {}
    with open(a.out / "runs.log", "w") as logf:
        for name, script in scripts(a.work).items():
            r = mlm.run_one(name, a.work / "stock", common + "\n" + script, a.work, 240)
            if name == "trainer":  # its steps from the run's metrics.jsonl, not the console
                r["loss"] = trainer_losses(a.work / "conv" / "run" / "metrics.jsonl")
            results[name] = r
            logf.write(
                f"\n{'=' * 30} {name} rc={r['rc']} wall={r['wall_s']}s\n{script}\n{r['log']}\n"
            )
            logf.flush()
            print(
                f"{name}: rc={r['rc']} wall={r['wall_s']}s logged={sorted(r['loss'])}", flush=True
            )
    checks = evaluate(results)
    lines = ["| check | result | detail |", "| --- | --- | --- |"]
    lines += [f"| {c} | {'PASS' if ok else 'FAIL'} | {d} |" for c, ok, d in checks]
    lines += ["", "Setup: " + "; ".join(f"{k}: {v}" for k, v in notes.items())]
    (a.out / "megatron_lm_convert.md").write_text("\n".join(lines) + "\n")
    (a.out / "results.json").write_text(
        json.dumps(
            {n: {k: v for k, v in r.items() if k != "log"} for n, r in results.items()}, indent=1
        )
    )
    print("\n".join(lines))
    return 0 if all(ok for _, ok, _ in checks) else 1


def trainer_losses(metrics: Path) -> dict[int, float]:
    """{step: loss} of the trainer's run, as its metrics.jsonl records them (none: {})."""
    from ufp4_megatron.train.logs.metrics import read_metrics

    if not metrics.exists():
        return {}
    return {int(r["step"]): float(r["loss"]) for r in read_metrics(metrics) if "loss" in r}


def evaluate(r: dict) -> list[tuple[str, bool, str]]:
    checks = [(f"{n}: exit status 0", x["rc"] == 0, f"rc={x['rc']}") for n, x in r.items()]
    want = mlm.logged_after_restart(r["unbroken"]["loss"], 20)
    got = r["resumed"]["loss"]
    ok = all(
        i in got and abs(got[i] - want[i]) <= (1e-6 * abs(want[i]) if i == 22 else 0.0)
        for i in range(21, 31)
    )
    loaded = bool(
        re.search(r"successfully loaded checkpoint from .* at iteration 20", r["resumed"]["log"])
    )
    checks.append(
        (
            "round trip Megatron-LM -> trainer -> Megatron-LM: iterations 21..30 == unbroken",
            ok and loaded,
            f"loaded at 20: {loaded}, max diff {mlm._max_diff(got, want, range(21, 31))}",
        )
    )
    t = r["trainer"]["loss"]
    checks.append(
        (
            "trainer continues the converted step 20 to 30 (finite losses)",
            sorted(t) == list(range(21, 31)) and all(math.isfinite(v) for v in t.values()),
            f"steps {sorted(t)}",
        )
    )
    b = r["back"]["loss"]
    loaded = bool(
        re.search(r"successfully loaded checkpoint from .* at iteration 30", r["back"]["log"])
    )
    # the trainer trained on text, Megatron-LM's mock data is another distribution: the check
    # is that it loads and continues (finite losses), not a loss level
    checks.append(
        (
            "trainer step 30 -> Megatron-LM: loaded at 30, iterations 31..40 finite",
            loaded
            and sorted(b) == list(range(31, 41))
            and all(math.isfinite(v) for v in b.values()),
            f"loaded: {loaded}, iterations {sorted(b)}",
        )
    )
    return checks


if __name__ == "__main__":
    sys.exit(main())

"""The TransformerEngine route in the real Megatron-LM pretrain_gpt.py, against the local route.

Driver of gpu/te_check.sh (part "megatron_lm"); needs TransformerEngine >= 2.19 on PYTHONPATH
(gpu/te_setup.sh) and the Megatron-LM archive gpu/megatron_lm.sh uses. Runs, 30 iterations
each, on stock (unpatched) Megatron-LM:
  every block of docs/megatron-lm.md marked `<!-- megatron-lm-te-run: NAME -->`, after its
  `common` block: te-bf16 (--transformer-impl transformer_engine), te-ufp4 and te-e2m1
  (--fp4-format e2m1 --fp4-recipe custom --fp4-quantizer-factory ufp4_megatron.te.<recipe>),
  te-resume (te-ufp4 saved at 20 and loaded again), te-moe-resume (a MoE model with TE's
  grouped experts, saved at 20 and loaded again, through te_experts.te_gpt_spec);
  and the comparisons: spec-te-ufp4, the --spec route (the plugin's local linears in
  Megatron's TE spec: the same TE norms and attention), and spec-te-ufp4-sr1, the same with
  another SR stream (UFP4_RECIPE JSON, sr_seed 1): two local-route runs that differ only in
  their SR draws, the yardstick for a difference that SR alone explains.
Checked: 17 linears of which 16 are quantized by the TE route's quantizers (the probe counts
TE linears whose forward and backward quantizers quantized), none under te-bf16; te-ufp4
differs from te-bf16 and from te-e2m1; te-ufp4's first loss (a forward from the same weights,
rounded to nearest) equals spec-te-ufp4's to 2e-3; over 30 iterations te-ufp4 is as close to
spec-te-ufp4 as two SR streams of the local route are to each other (max |loss difference|
<= 3x the yardstick, at least 1e-3); the resumed run equals te-ufp4 at iterations 21..30 (as
Megatron-LM logs them).

With --seeds S1,S2 the trajectory check runs te-ufp4, spec-te-ufp4 and spec-te-ufp4-sr1 again
at each --seed (another initialisation, data order and SR stream) and compares the routes'
differences with the SR-only ones over all seeds (seed_comparison).

    python3 gpu/te_megatron_lm.py --tarball T --out DIR [--only NAME,...] [--jobs 3]
        [--seeds 1235,1236]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import re
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import megatron_lm as mlm

_TE_BLOCK = re.compile(r"<!-- megatron-lm-te-run: (\S+) -->\s*\n```bash\n(.*?)```", re.S)
TE_FLAGS = "--transformer-impl transformer_engine"
SPEC = "--spec ufp4_megatron.megatron.spec ufp4_gpt_spec"
COMPARISONS = {  # the --spec route in Megatron's TE spec (docs/megatron-lm.md, TransformerEngine)
    "spec-te-ufp4": (
        f"UFP4_RECIPE=ufp4 torchrun --standalone --nproc-per-node 1 pretrain_gpt.py "
        f'"${{ARGS[@]}}" {TE_FLAGS} {SPEC}'
    ),
    "spec-te-ufp4-sr1": (
        'echo \'{"recipe": "ufp4", "sr_seed": 1}\' > "$CKPT.json"\n'
        'UFP4_RECIPE="$CKPT.json" torchrun --standalone --nproc-per-node 1 '
        f'pretrain_gpt.py "${{ARGS[@]}}" {TE_FLAGS} {SPEC}'
    ),
}
# More --seed values (another initialisation, data order and SR stream) for the trajectory
# comparison: te-ufp4, spec-te-ufp4 and spec-te-ufp4-sr1 run again at each, named NAME@SEED.
TRIO = ("te-ufp4", "spec-te-ufp4", "spec-te-ufp4-sr1")
WINDOW = 10  # the last iterations whose mean loss is compared


def seeded(runs: list[tuple[str, str]], seeds: list[int]) -> list[tuple[str, str]]:
    """The TRIO's blocks again with `--seed S` on their torchrun line, as NAME@S."""
    blocks = dict(runs)
    return [
        (f"{n}@{s}", blocks[n].rstrip("\n") + f" --seed {s}\n")
        for s in seeds
        for n in TRIO
        if n in blocks
    ]


# name -> (parallel linears, of them UFP4, TE linears, of them quantized by ufp4_megatron.te, recipe)
EXPECTED = {
    "te-bf16": (1, 0, 16, 0, None),
    "te-ufp4": (1, 0, 16, 16, "ufp4"),
    "te-e2m1": (1, 0, 16, 16, "e2m1"),
    "te-resume": (1, 0, 16, 16, "ufp4"),
    # 4 layers of qkv, proj and the experts' fc1 and fc2 (one TE GroupedLinear each)
    "te-moe-resume": (1, 0, 16, 16, "ufp4"),
    "spec-te-ufp4": (17, 16, 0, 0, None),
    "spec-te-ufp4-sr1": (17, 16, 0, 0, None),
}


def te_runs(text: str | None = None) -> list[tuple[str, str]]:
    """[(name, block)] of the documented TE-route commands, in order."""
    text = mlm.DOC.read_text() if text is None else text
    return _TE_BLOCK.findall(text)


def evaluate(results: dict[str, dict], iters: int) -> list[tuple[str, bool, str]]:
    checks = []
    every = range(1, iters + 1)
    for name, r in results.items():
        ok = r["rc"] == 0 and all(i in r["loss"] for i in every)
        checks.append(
            (f"{name}: ran {iters} iterations", ok, f"rc={r['rc']}, {len(r['loss'])} logged")
        )
        if name.split("@")[0] not in EXPECTED:
            continue
        lin, ufp4, te_lin, te_q, recipe = EXPECTED[name.split("@")[0]]
        got = [
            (
                p["linears"],
                p["ufp4"],
                p.get("te_linears", 0),
                p.get("te_ufp4", 0),
                p.get("te_recipes", {}),
            )
            for p in r["probes"]
            if p["linears"] or p.get("te_linears")
        ]
        want_recipes = {recipe: te_q} if recipe else {}
        ok = bool(got) and all(
            (a, b, c, d) == (lin, ufp4, te_lin, te_q) and rec == want_recipes
            for a, b, c, d, rec in got
        )
        checks.append(
            (
                f"{name}: {lin + te_lin} linears, {ufp4 + te_q} quantized"
                + (f" by ufp4_megatron.te ({recipe})" if te_q else ""),
                ok,
                str(got),
            )
        )
    loss = {n: r["loss"] for n, r in results.items()}

    def diff(a, b):
        return mlm._max_diff(loss[a], loss[b], every) if a in loss and b in loss else None

    for a, b in (("te-ufp4", "te-bf16"), ("te-e2m1", "te-bf16"), ("te-ufp4", "te-e2m1")):
        d = diff(a, b)
        if d is not None:
            checks.append((f"{a} differs from {b}", d > 0, f"max {d}"))
    if (
        "te-ufp4" in loss
        and "spec-te-ufp4" in loss
        and 1 in loss["te-ufp4"]
        and 1 in loss["spec-te-ufp4"]
    ):
        # iteration 1 is a forward from the same initial weights, and ufp4's forward rounds to
        # nearest: the same quantized operands, so the same loss up to kernel rounding
        d1 = abs(loss["te-ufp4"][1] - loss["spec-te-ufp4"][1])
        checks.append(
            (
                "te-ufp4 == spec-te-ufp4 at iteration 1 (same weights, RTNE forward)",
                d1 <= 2e-3,
                f"diff {d1:.2e} (<= 2e-3)",
            )
        )
    d, yard = diff("te-ufp4", "spec-te-ufp4"), diff("spec-te-ufp4", "spec-te-ufp4-sr1")
    across = seed_comparison(loss, iters)
    if across is not None:
        checks.append(across)
    elif d is not None and yard is not None:
        bound = 3 * max(yard, 1e-3)
        checks.append(
            (
                "te-ufp4 vs spec-te-ufp4 (local route) within 3x the SR yardstick "
                "(spec-te-ufp4 vs spec-te-ufp4-sr1)",
                d <= bound,
                f"max {d:.6f}, yardstick {yard:.6f}, bound {bound:.6f}",
            )
        )
    if "te-resume" in results and "te-ufp4" in loss:
        r, start = results["te-resume"], 20
        want = mlm.logged_after_restart(loss["te-ufp4"], start)
        its = range(start + 1, iters + 1)
        loaded = re.search(
            rf"successfully loaded checkpoint from .* at iteration {start}", r["log"]
        )
        ok = all(
            i in r["loss"]
            and abs(r["loss"][i] - want[i]) <= (1e-6 * abs(want[i]) if i == start + 2 else 0.0)
            for i in its
        )
        checks.append(
            (
                f"te-resume: saved at {start}, reloaded, losses {start + 1}..{iters} == "
                f"unbroken te-ufp4 ({start + 2}: the mean Megatron-LM logs)",
                ok and bool(loaded),
                f"max {mlm._max_diff(r['loss'], want, its)}, loaded: {bool(loaded)}",
            )
        )
    if "te-moe-resume" in results:
        r = results["te-moe-resume"]
        loaded = re.search(r"successfully loaded checkpoint from .* at iteration 20", r["log"])
        checks.append(
            (
                "te-moe-resume: TE's grouped experts saved at 20 under the custom recipe and "
                "loaded again (--spec ufp4_megatron.megatron.te_experts te_gpt_spec)",
                r["rc"] == 0 and bool(loaded),
                f"rc={r['rc']}, loaded: {bool(loaded)}",
            )
        )
    return checks


def seed_comparison(loss: dict[str, dict], iters: int):
    """The TE route against the local route over every seed that has the whole TRIO (the
    default one and each NAME@SEED): per seed, route = te-ufp4 - spec-te-ufp4 and noise =
    spec-te-ufp4-sr1 - spec-te-ufp4 (the local route with only its SR stream changed), each as
    the max |loss difference| over the iterations and as the difference of the last-WINDOW
    mean losses. PASS: the routes' max difference is within 3x the largest SR-only one (at
    least 1e-3), and the routes' mean differences are not told apart from the SR-only ones
    (Welch's t-test, p >= 0.01). None with fewer than two seeds."""
    from scipy import stats

    every, last = range(1, iters + 1), range(iters - WINDOW + 1, iters + 1)
    tags = [""] + sorted({n.split("@", 1)[1] for n in loss if "@" in n})
    route, noise, route_max, noise_max = [], [], [], []
    for tag in tags:
        te, spec, sr1 = (loss.get(n + (f"@{tag}" if tag else "")) for n in TRIO)
        if not (te and spec and sr1) or not all(i in r for r in (te, spec, sr1) for i in every):
            continue

        def mean(r):
            return sum(r[i] for i in last) / len(last)

        route.append(mean(te) - mean(spec))
        noise.append(mean(sr1) - mean(spec))
        route_max.append(mlm._max_diff(te, spec, every))
        noise_max.append(mlm._max_diff(sr1, spec, every))
    if len(route) < 2:
        return None
    bound = 3 * max(max(noise_max), 1e-3)
    p = float(stats.ttest_ind(route, noise, equal_var=False).pvalue)
    p = 1.0 if p != p else p  # NaN: both samples constant and equal
    return (
        f"te-ufp4 vs spec-te-ufp4 (local route) over {len(route)} seeds: within the SR-only "
        "spread (max |dloss| <= 3x, last-10 means not told apart)",
        max(route_max) <= bound and p >= 0.01,
        f"max |dloss| routes {max(route_max):.6f} vs SR-only {max(noise_max):.6f} (bound "
        f"{bound:.6f}); last-{WINDOW} mean te-spec {[round(v, 5) for v in route]}, "
        f"sr1-spec {[round(v, 5) for v in noise]}, Welch p={p:.3f}",
    )


def table(results: dict[str, dict], checks, iters: int) -> str:
    rows = [
        "| run | linears (quantized) | loss 1 | loss 30 | max abs diff vs te-bf16 | "
        "ms/iter (6-30, median) | wall s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    base = results.get("te-bf16", {}).get("loss", {})
    for name, r in results.items():
        ms = sorted(v for i, v in r["ms"].items() if i >= 6)
        med = f"{ms[len(ms) // 2]:.1f}" if ms else "-"
        probe = (
            "; ".join(
                f"{p['linears'] + p.get('te_linears', 0)} ({p['ufp4'] + p.get('te_ufp4', 0)})"
                for p in r["probes"]
                if p["linears"] or p.get("te_linears")
            )
            or "-"
        )
        d = mlm._max_diff(r["loss"], base, range(1, iters + 1)) if name != "te-bf16" else None
        rows.append(
            f"| {name} | {probe} | {r['loss'].get(1, float('nan')):.6f} | "
            f"{r['loss'].get(iters, float('nan')):.6f} | "
            f"{'-' if d is None else f'{d:.6f}'} | {med} | {r['wall_s']} |"
        )
    rows += ["", "| check | result | detail |", "| --- | --- | --- |"]
    rows += [f"| {c} | {'PASS' if ok else 'FAIL'} | {detail} |" for c, ok, detail in checks]
    return "\n".join(rows)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--tarball", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--work", type=Path, default=Path("/tmp/te-megatron-lm-runs"))
    p.add_argument("--site", type=Path, default=Path("/tmp/site"))
    p.add_argument("--only", default="")
    p.add_argument("--jobs", type=int, default=3, help="runs side by side on the GPU")
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--seeds", default="", help="more --seed values for the trajectory check")
    a = p.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    a.out.mkdir(parents=True, exist_ok=True)
    mlm.prepare(a.tarball, a.work, a.site)
    common, _ = mlm.documented_runs()
    runs = te_runs() + list(COMPARISONS.items())
    runs += seeded(runs, [int(v) for v in a.seeds.split(",") if v])
    only = set(filter(None, a.only.split(",")))
    runs = [(n, b) for n, b in runs if not only or n.split("@")[0] in only]
    results = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
        futures = {
            pool.submit(
                mlm.run_one, name, a.work / "stock", common + "\n" + block, a.work, a.timeout
            ): (name, block)
            for name, block in runs
        }
        for fut in concurrent.futures.as_completed(futures):
            name, block = futures[fut]
            r = fut.result()
            results[name] = r | {"block": block}
            print(
                f"{name}: rc={r['rc']} wall={r['wall_s']}s iterations={len(r['loss'])} "
                f"probe={r['probes']}",
                flush=True,
            )
    results = {n: results[n] for n, _ in runs if n in results}  # the documented order
    with open(a.out / "te_megatron_lm.log", "w") as logf:
        for name, r in results.items():
            logf.write(
                f"\n{'=' * 30} {name} rc={r['rc']} wall={r['wall_s']}s\n{r['block']}\n{r['log']}\n"
            )
    checks = evaluate(results, a.iters)
    text = table(results, checks, a.iters)
    (a.out / "te_megatron_lm.md").write_text(text + "\n")
    (a.out / "te_megatron_lm.json").write_text(
        json.dumps(
            {n: {k: v for k, v in r.items() if k != "log"} for n, r in results.items()}, indent=1
        )
    )
    print(text)
    return 0 if checks and all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())

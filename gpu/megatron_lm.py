"""Runs the documented Megatron-LM commands (docs/megatron-lm.md) on one GPU and checks them.

Driver of gpu/megatron_lm.sh. Every bash block of docs/megatron-lm.md marked
`<!-- megatron-lm-run: NAME CHECKOUT -->` runs as written, after the `common` block, from a
Megatron-LM checkout (`stock`, or `patched` with patches/*.patch applied), with the real,
unmodified pretrain_gpt.py. A module-registration probe (gpu/megatron_lm_probe) counts the
UFP4 linears each process builds; losses and iteration times come from Megatron's log lines.
Checked: every UFP4 route builds 16/17 UFP4 linears and differs from BF16; flags == --spec
for the same recipe at every iteration; the run stopped at 20 and resumed reproduces the
unbroken run's losses 21..30.

    python3 gpu/megatron_lm.py --tarball T --out DIR [--only NAME,...]

`documented_runs()` is also what tests/megatron_lm uses to parse the same blocks on CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "megatron-lm.md"
PROBE = ROOT / "gpu" / "megatron_lm_probe"
_BLOCK = re.compile(
    r"<!-- megatron-lm-run: (\S+)(?: (stock|patched))? -->\s*\n```bash\n(.*?)```", re.S
)
_ITER = re.compile(
    r"iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([\d.]+)"
    r".*?lm loss: ([-+.\dEe]+)"
)
_MCORE = re.compile(r"Megatron-Core version \.+ (\S+)")


def documented_runs(text: str | None = None) -> tuple[str, list[tuple[str, str, str]]]:
    """(common block, [(name, checkout, block)]) of the marked bash blocks, in order."""
    text = DOC.read_text() if text is None else text
    common, runs = "", []
    for name, checkout, body in _BLOCK.findall(text):
        if name == "common":
            common = body
        else:
            runs.append((name, checkout or "stock", body))
    return common, runs


def prepare(tarball: Path, work: Path, site: Path) -> dict[str, str]:
    """Two checkouts of the archived Megatron-LM: stock and patched; returns notes."""
    notes = {}
    stock, patched = work / "stock", work / "patched"
    stock.mkdir(parents=True)
    with tarfile.open(tarball) as tar:
        tar.extractall(stock, filter="data")
    _datasets_helpers(stock, site, notes)
    shutil.copytree(stock, patched, symlinks=True)
    for patch in sorted((ROOT / "patches").glob("[0-9][0-9][0-9][0-9]-*.patch")):
        for cmd in (["git", "apply", str(patch)], ["patch", "-p1", "-i", str(patch)]):
            if shutil.which(cmd[0]) and subprocess.run(cmd, cwd=patched).returncode == 0:
                notes[patch.name] = f"applied with {cmd[0]}"
                break
        else:
            raise SystemExit(f"could not apply {patch.name} (git apply and patch -p1 failed)")
    return notes


def _datasets_helpers(checkout: Path, site: Path, notes: dict) -> None:
    """Megatron-LM's startup runs `make` in megatron/core/datasets (pybind11 helpers). Build
    them once here; where that fails, use the wheel's compiled helpers (built from the same
    helpers.cpp) behind a no-op Makefile. Only build files change, never Python code."""
    ds = checkout / "megatron" / "core" / "datasets"
    if shutil.which("make") is None:  # Megatron-LM's compile_helpers would fail to start it
        fake = checkout.parent / "bin"
        fake.mkdir(exist_ok=True)
        (fake / "make").write_text("#!/bin/sh\nexit 0\n")
        (fake / "make").chmod(0o755)
        os.environ["PATH"] = f"{fake}{os.pathsep}{os.environ['PATH']}"
        notes["make"] = "not installed: a no-op make on PATH"
    res = subprocess.run(["make", "-C", str(ds)], capture_output=True, text=True)
    if res.returncode == 0 and (notes.get("make") is None):
        notes["datasets helpers"] = "built by Megatron-LM's own Makefile"
        return
    wheel = site / "megatron" / "core" / "datasets"
    built = sorted(wheel.glob("helpers_cpp*.so"))
    same = (wheel / "helpers.cpp").read_bytes() == (ds / "helpers.cpp").read_bytes()
    if not built or not same:
        raise SystemExit(
            f"make in {ds} failed ({res.stderr[-500:]}) and the wheel's helpers "
            f"are {'missing' if not built else 'from another helpers.cpp'}"
        )
    for so in built:
        shutil.copy2(so, ds / so.name)
    (ds / "Makefile").write_text("default:\n\t@true\n")
    why = (res.stderr.strip().splitlines() or ["no make"])[-1][:80]
    notes["datasets helpers"] = (
        f"make failed or absent ({why}); "
        f"used the wheel's {built[0].name} (same helpers.cpp), no-op "
        "Makefile"
    )


def run_one(name: str, checkout: Path, script: str, work: Path, timeout: int) -> dict:
    probe = work / f"probe-{name}.jsonl"
    env = dict(
        os.environ,
        UFP4_PROBE_OUT=str(probe),
        CKPT=str(work / f"ckpt-{name}"),
        PYTHONPATH=os.pathsep.join([str(PROBE), os.environ.get("PYTHONPATH", "")]),
    )
    t0 = time.time()
    try:
        # no `set -e`: the checks below judge a run by its log (iterations, probe, reload)
        res = subprocess.run(
            ["bash", "-c", script],
            cwd=checkout,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        log, rc = res.stdout + res.stderr, res.returncode
    except subprocess.TimeoutExpired as e:
        log = (e.stdout or b"").decode() + (e.stderr or b"").decode() + f"\nTIMEOUT {timeout}s"
        rc = "timeout"
    wall = time.time() - t0
    iters = {int(i): (float(loss), float(ms)) for i, ms, loss in _ITER.findall(log)}
    probes = [json.loads(line) for line in probe.read_text().splitlines()] if probe.exists() else []
    return {
        "name": name,
        "rc": rc,
        "wall_s": round(wall, 1),
        "log": log,
        "mcore": sorted(set(_MCORE.findall(log))),
        "probes": probes,
        "loss": {i: v[0] for i, v in sorted(iters.items())},
        "ms": {i: v[1] for i, v in sorted(iters.items())},
    }


def _max_diff(a: dict, b: dict, its) -> float | None:
    its = [i for i in its if i in a and i in b]
    return max(abs(a[i] - b[i]) for i in its) if its else None


# Per documented run: UFP4 linears of 17 (4 layers x 4 + the BF16 LM head), and their recipe.
EXPECTED = {
    "bf16": (0, None),
    "spec-ufp4": (16, "ufp4"),
    "spec-e2m1": (16, "e2m1"),
    "flags-ufp4": (16, "ufp4"),
    "flags-e2m1": (16, "e2m1"),
    "resume": (16, "ufp4"),
}


def evaluate(results: dict[str, dict], iters: int) -> list[tuple[str, bool, str]]:
    checks = []
    every = range(1, iters + 1)
    for name, r in results.items():
        ok = r["rc"] == 0 and all(i in r["loss"] for i in every)
        checks.append(
            (f"{name}: ran {iters} iterations", ok, f"rc={r['rc']}, {len(r['loss'])} logged")
        )
        if name in EXPECTED:
            n_ufp4, recipe = EXPECTED[name]
            # one probe line per Python process of the run: only those that built a model
            # (the torchrun agent and Megatron's helper processes build none) are judged
            got = [(p["linears"], p["ufp4"], p["recipes"]) for p in r["probes"] if p["linears"]]
            ok = bool(got) and all(
                n == 17 and u == n_ufp4 and rec == ({recipe: 16} if recipe else {})
                for n, u, rec in got
            )
            checks.append(
                (
                    f"{name}: {n_ufp4}/17 UFP4 linears" + (f" ({recipe})" if recipe else ""),
                    ok,
                    str(got),
                )
            )
    bf16 = results.get("bf16")
    for name in results:
        if name != "bf16" and bf16:
            d = _max_diff(results[name]["loss"], bf16["loss"], every)
            checks.append((f"{name} differs from bf16", d is not None and d > 0, f"max {d}"))
    for a, b in (("flags-ufp4", "spec-ufp4"), ("flags-e2m1", "spec-e2m1")):
        if a in results and b in results:
            d = _max_diff(results[a]["loss"], results[b]["loss"], every)
            checks.append((f"{a} == {b} at every iteration", d == 0.0, f"max {d}"))
    if "resume" in results and "spec-ufp4" in results:
        r, start = results["resume"], 20
        want = logged_after_restart(results["spec-ufp4"]["loss"], start)
        its = range(start + 1, iters + 1)
        d = _max_diff(r["loss"], want, its)
        loaded = re.search(
            rf"successfully loaded checkpoint from .* at iteration {start}", r["log"]
        )
        # exact, except the one averaged line: to the printed precision (%.6E of each loss)
        ok = all(
            i in r["loss"]
            and abs(r["loss"][i] - want[i]) <= (1e-6 * abs(want[i]) if i == start + 2 else 0.0)
            for i in its
        )
        checks.append(
            (
                f"resume: saved at {start}, reloaded, losses {start + 1}..{iters} == "
                f"unbroken spec-ufp4 ({start + 2}: as Megatron-LM logs it, the mean of "
                f"{start + 1} and {start + 2})",
                ok and bool(loaded),
                f"max {d}, loaded at {start}: {bool(loaded)}",
            )
        )
    return checks


def logged_after_restart(unbroken: dict[int, float], start: int) -> dict[int, float]:
    """The losses Megatron-LM prints for a run restarted at iteration `start`, given an
    unbroken run's printed losses. training_log() does not reset its loss sums after the first
    iteration of a process (`should_reset = not is_first_iteration`, core_r0.19.0), so the
    second line after every start prints the mean of the first two iterations: at iteration 2
    of every run, and at start + 2 after a resume. Every other line is one iteration's loss."""
    want = dict(unbroken)
    a, b = start + 1, start + 2
    if a in unbroken and b in unbroken:
        want[b] = (unbroken[a] + unbroken[b]) / 2
    return want


def table(results: dict[str, dict], checks, notes: dict, iters: int) -> str:
    rows = [
        "| run | Megatron-LM | megatron.core | UFP4 linears | loss 1 | loss 30 | "
        "max abs diff vs bf16 | ms/iter (6-30, median) | wall s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    bf16 = results.get("bf16", {}).get("loss", {})
    for name, r in results.items():
        ms = sorted(v for i, v in r["ms"].items() if i >= 6)
        med = f"{ms[len(ms) // 2]:.1f}" if ms else "-"
        probe = "; ".join(f"{p['ufp4']}/{p['linears']}" for p in r["probes"] if p["linears"]) or "-"
        d = _max_diff(r["loss"], bf16, range(1, iters + 1)) if name != "bf16" else None
        rows.append(
            f"| {name} | {r['checkout']} | {', '.join(r['mcore']) or '-'} | {probe} | "
            f"{r['loss'].get(1, float('nan')):.6f} | "
            f"{r['loss'].get(iters, float('nan')):.6f} | "
            f"{'-' if d is None else f'{d:.6f}'} | {med} | {r['wall_s']} |"
        )
    rows += ["", "| check | result | detail |", "| --- | --- | --- |"]
    rows += [f"| {c} | {'PASS' if ok else 'FAIL'} | {detail} |" for c, ok, detail in checks]
    rows += ["", "Setup: " + "; ".join(f"{k}: {v}" for k, v in notes.items())]
    return "\n".join(rows)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--tarball", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--work", type=Path, default=Path("/tmp/megatron-lm-runs"))
    p.add_argument("--site", type=Path, default=Path("/tmp/site"))
    p.add_argument("--only", default="")
    p.add_argument("--timeout", type=int, default=240)
    p.add_argument("--iters", type=int, default=30)
    a = p.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    a.out.mkdir(parents=True, exist_ok=True)
    notes = prepare(a.tarball, a.work, a.site)
    common, runs = documented_runs()
    only = set(filter(None, a.only.split(",")))
    results = {}
    with open(a.out / "runs.log", "w") as logf:
        for name, checkout, block in runs:
            if only and name not in only:
                continue
            r = run_one(name, a.work / checkout, common + "\n" + block, a.work, a.timeout)
            r["checkout"] = checkout
            results[name] = r
            logf.write(
                f"\n{'=' * 30} {name} ({checkout}) rc={r['rc']} wall={r['wall_s']}s\n"
                f"{block}\n{r['log']}\n"
            )
            logf.flush()
            print(
                f"{name}: rc={r['rc']} wall={r['wall_s']}s iterations={len(r['loss'])} "
                f"probe={r['probes']}",
                flush=True,
            )
    checks = evaluate(results, a.iters)
    text = table(results, checks, notes, a.iters)
    (a.out / "megatron_lm.md").write_text(text + "\n")
    (a.out / "results.json").write_text(
        json.dumps(
            {n: {k: v for k, v in r.items() if k != "log"} for n, r in results.items()}, indent=1
        )
    )
    print(text)
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
